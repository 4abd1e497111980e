# The two set-up commands (see README.md):
#   make run   installs what is missing, builds into build/, runs kiln-ops on the CPU
#   make test  installs what is missing, builds, runs every test (and again under sanitizers)
BUILD      ?= build
ASAN_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all deps build run test test-fast test-sanitize bench clean

all: build

deps:
	bash scripts/install-deps.sh

build: deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/bin/kiln-ops

# The plain build's tests, then the C++ tests again with AddressSanitizer + UBSan.
test: test-fast test-sanitize

test-fast: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=address,undefined \
	  -DKILN_BUILD_BENCH=OFF $(CMAKE_ARGS)
	cmake --build $(ASAN_BUILD) -j $(JOBS)
	ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS) -L sanitize

bench: build
	$(BUILD)/bin/kiln-bench

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
