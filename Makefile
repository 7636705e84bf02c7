# kiln - the two commands of the README, and their parts.
#   make demo   install what is missing, build, run the demo on the embedded default
#   make test   build, run the whole suite, then again under ASan + UBSan
#   make check  the edit loop: release build, the suite without the slow tests, no sanitizers

BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
DEMO_DIR ?= kiln-demo

.PHONY: all deps build demo test test-release test-asan asan check bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/kiln demo --dir $(DEMO_DIR)

test: test-release test-asan

check: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE slow

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)

test-asan: asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

bench: build
	$(BUILD)/bench_cache --dir $(BUILD)/bench-data --runs 3

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
