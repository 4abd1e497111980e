# The two set-up commands (see README.md):
#   make run   installs what is missing, builds into build/, runs kiln-ops on the CPU
#   make test  installs what is missing, builds, runs every test (and again under sanitizers)
# make docs builds the documentation (Sphinx, warnings are errors) into build/docs/html.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build run test test-fast test-sanitize test-tsan bench docs clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/bin/kiln-ops

# The plain build's tests, then the C++ tests again with AddressSanitizer + UBSan, then the
# multi-threaded C++ tests with ThreadSanitizer.
test: test-fast test-sanitize test-tsan

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=address,undefined \
	  -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	# A failed test runs once more: LeakSanitizer's exit-time tracer has crashed once ("Tracer
	# caught signal 11") after every test case had passed; a real failure fails both runs.
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -L sanitize --repeat until-pass:2

# ThreadSanitizer over the tests that run threads (budget, mock, caching pool, JIT and thread
# pool). Only the unit-test binary is built. libLLVM is not instrumented; it reports nothing today,
# so there is no suppressions file (add one under test/ only for a report inside libLLVM).
TSAN_TESTS ?= [concurrency],[threads],[budget],[codegen]
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=thread \
	  -DKILN_BUILD_BENCH=OFF -DKILN_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(TSAN_BUILD) -j $(JOBS) --target kiln_unit_tests
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 $$TSAN_OPTIONS" \
	  $(TSAN_BUILD)/bin/kiln_unit_tests '$(TSAN_TESTS)'

# The user guide, the design and the API reference (autodoc over the built package), with
# warnings as errors; ctest's docs_html runs the same build in make test.
docs: build
	PYTHONPATH=$(BUILD)/python /usr/bin/python3 -m sphinx -E -W --keep-going -q -b html docs $(BUILD)/docs/html
	@echo "docs: $(BUILD)/docs/html/index.html"

bench: build
	$(BUILD)/bin/kiln-bench
	$(BUILD)/bin/kiln-memory-bench
	@# OpenBLAS picks its own kernel and cache sizes only when these are unset.
	if [ -x $(BUILD)/bin/kiln-matmul-bench ]; then \
	  env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BUILD)/bin/kiln-matmul-bench; \
	else echo "kiln-matmul-bench not built (OpenBLAS missing: scripts/install-deps.sh)"; fi
	PYTHONPATH=$(BUILD)/python /usr/bin/python3 bench/python_overhead.py
	PYTHONPATH=$(BUILD)/python /usr/bin/python3 bench/user_kernels.py

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
