# kiln - the two commands of the README, and their parts.
#   make demo   install what is missing, build, run the demo on the embedded default
#   make test   build, run the whole suite, then again under ASan + UBSan,
#               then a 20-second smoke run of each fuzz harness
#   make fuzz   run each libFuzzer harness (tests/fuzz) FUZZ_SECONDS (default 60)
#   make check  the edit loop: release build, the suite without the slow tests, no sanitizers

BUILD ?= build
ASAN_BUILD ?= build-asan
JOBS ?= $(shell nproc)
DEMO_DIR ?= kiln-demo
FUZZ_BUILD ?= build-fuzz
FUZZ_CC ?= clang-14
FUZZ_SECONDS ?= 60
FUZZ_SMOKE_SECONDS ?= 20
# V=1: every line of the build; else one line a build, its log's tail when it fails
V ?= 0
quiet_build = $(if $(filter 1,$(V)),cmake --build $(1) -j $(JOBS),\
  echo "kiln: building $(1) (log: $(1)/build.log; V=1 shows it)" && \
  cmake --build $(1) -j $(JOBS) -- --no-print-directory >$(1)/build.log 2>&1 || { tail -n 40 $(1)/build.log; exit 1; })

.PHONY: all deps build demo test test-release test-asan asan check fuzz-build fuzz test-fuzz bench clean

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null
	@$(call quiet_build,$(BUILD))

demo: build
	$(BUILD)/kiln demo --dir $(DEMO_DIR)

test: test-release test-asan test-fuzz

check: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) -LE slow

test-release: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

asan: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DKILN_SANITIZE=ON >/dev/null
	@$(call quiet_build,$(ASAN_BUILD))

test-asan: asan
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(ASAN_BUILD) --output-on-failure -j $(JOBS)

# libFuzzer harnesses: their own CMake project (clang, parser sources only)
fuzz-build: deps
	@cmake -S tests/fuzz -B $(FUZZ_BUILD) -DCMAKE_C_COMPILER=$(FUZZ_CC) >/dev/null
	@$(call quiet_build,$(FUZZ_BUILD))

fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)

test-fuzz: fuzz-build
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SMOKE_SECONDS)

bench: build
	$(BUILD)/bench_cache --dir $(BUILD)/bench-data --runs 3

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
