// The Catch2 main of kiln_fake_cuda_tests: the fake CUDA driver on its own, loaded with dlopen()
// the way kiln loads a driver (fake_cuda_test_support.h).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
