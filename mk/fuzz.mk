# Fuzzing: one libFuzzer target per parser (fuzz/fuzz_*.c), built with clang
# and -fsanitize=fuzzer,address,undefined against the core sources they need
# (compiled here with clang, not taken from the gcc-built libgrove.a).
#
#   make fuzz                      each target for FUZZ_SECONDS (default 60)
#   make fuzz FUZZ_SECONDS=600     longer
#   make fuzz-smoke                each target for FUZZ_SMOKE_RUNS (20000) inputs
#                                  from the fixed seed FUZZ_SMOKE_SEED (1)
#
# Each run starts from the committed seeds in fuzz/corpus/NAME/ (read only),
# with the dictionary fuzz/NAME.dict when there is one (pickle, zip,
# safetensors: huge offsets and strides; fuzz/make_corpus.py writes them),
# and keeps what it finds in build/fuzz/corpus/NAME/; a crash, leak, UB or
# an input slower than 10 s fails the run and leaves the input in
# build/fuzz/crashes/.  Turn every such input into a regression test in
# tests/check_torch.c (test_fuzz_regressions).  `make test` runs the smoke
# pass (not under SAN=1 or SAN=thread: the fuzz build carries its own
# sanitizers); clang
# and its libFuzzer runtime come with the test dependencies, which the fuzz
# objects wait for.

FUZZ_CC            ?= clang
FUZZ_SECONDS       ?= 60
# The smoke pass (part of `make test`) is a regression gate, not a search:
# a fixed seed and a fixed number of inputs give the same inputs on every
# machine, so a clean clone's CI runs exactly what passed here, and a new
# finding comes from `make fuzz` (a random seed, FUZZ_SECONDS per target),
# not from a lucky draw in CI.  FUZZ_SMOKE_SECONDS only caps a slow machine.
FUZZ_SMOKE_SECONDS ?= 120
FUZZ_SMOKE_RUNS    ?= 20000
FUZZ_SMOKE_SEED    ?= 1
FUZZ_BUILD         := build/fuzz
FUZZ_NAMES         := safetensors zip pickle spec
FUZZ_SRC           := core/io/safetensors.c core/io/torch_zip.c core/io/pickle.c \
                      core/io/pickle_write.c core/io/torch_load.c core/io/export_plan.c \
                      core/io/torch_save.c core/io/torch_legacy.c core/io/checkpoint.c core/io/fileio.c \
                      core/tensor/tensor.c core/tensor/state_dict.c core/base/status.c \
                      core/base/log.c core/base/utf8.c core/base/yield.c core/base/ptrmap.c
FUZZ_OBJ           := $(FUZZ_SRC:core/%.c=$(FUZZ_BUILD)/core/%.o)
# fuzz_spec builds and runs models: all of the core, and BLAS.
FUZZ_SPEC_OBJ      := $(CORE_SRC:core/%.c=$(FUZZ_BUILD)/core/%.o)
FUZZ_BINS          := $(FUZZ_NAMES:%=$(FUZZ_BUILD)/fuzz_%)
FUZZ_SAN           := -fsanitize=address,undefined -fno-sanitize-recover=undefined
# FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (the usual libFuzzer convention)
# turns off the zip reader's CRC check, so that mutated archives get past it.
FUZZ_CFLAGS        := -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread -g -O1 \
                      -fno-omit-frame-pointer $(FUZZ_SAN) -Iinclude $(CORE_INC_ALL) \
                      -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
# Recursive: pkg-config is asked in the recipe, after the dependency stamp.
FUZZ_LIBS           = $(shell pkg-config --libs jansson zlib 2>/dev/null || echo -ljansson -lz) -lm -pthread
FUZZ_RUN_FLAGS     := -timeout=10 -rss_limit_mb=2048 -print_final_stats=1

.PHONY: fuzz fuzz-build fuzz-smoke fuzz-build-all-cores

# The GEMM's register tiles are compiled without sanitizers or coverage: the
# fuzzers aim at the parsers, a tile reads only the packs and rows the
# (instrumented) callers hand it, and clang's UBSan and coverage passes over
# their fully unrolled always_inline bodies took 10 to 20 minutes of CPU for
# gemm_avx2.c alone (10 s without), the slowest step of a first `make test`.
# `make test SAN=1` still runs them under ASan and UBSan (gcc).
FUZZ_UNINSTRUMENTED := $(FUZZ_BUILD)/core/kernels/gemm_avx2.o $(FUZZ_BUILD)/core/kernels/gemm_avx512.o
$(FUZZ_UNINSTRUMENTED): FUZZ_OBJ_FLAGS := -fno-sanitize=all
FUZZ_OBJ_FLAGS ?= -fsanitize=fuzzer-no-link

$(FUZZ_BUILD)/core/%.o: core/%.c | $(DEPS_TEST)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(FUZZ_OBJ_FLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz_common.h $(FUZZ_OBJ) | $(DEPS_TEST)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) -o $@ $< $(FUZZ_OBJ) $(FUZZ_LIBS)

$(FUZZ_BUILD)/fuzz_spec: fuzz/fuzz_spec.c fuzz/fuzz_common.h $(FUZZ_SPEC_OBJ)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $(PKG_CFLAGS) -o $@ $< $(FUZZ_SPEC_OBJ) $(PKG_LIBS) \
	  -pthread

fuzz-build: $(FUZZ_BINS)

# $(1): seconds per target; $(2): further libFuzzer flags.
define fuzz_run
	@mkdir -p $(FUZZ_BUILD)/crashes
	@for n in $(FUZZ_NAMES); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$n; \
	  echo "fuzz: $$n (at most $(1) s) $(2)"; \
	  dict=; if [ -f fuzz/$$n.dict ]; then dict=-dict=fuzz/$$n.dict; fi; \
	  $(FUZZ_BUILD)/fuzz_$$n $(FUZZ_RUN_FLAGS) $(2) $$dict -max_total_time=$(1) \
	    -artifact_prefix=$(FUZZ_BUILD)/crashes/$$n- \
	    $(FUZZ_BUILD)/corpus/$$n fuzz/corpus/$$n > $(FUZZ_BUILD)/fuzz_$$n.log 2>&1 \
	  || { tail -n 60 $(FUZZ_BUILD)/fuzz_$$n.log; echo "fuzz: $$n FAILED (log: $(FUZZ_BUILD)/fuzz_$$n.log)"; exit 1; }; \
	  grep -E '^stat::number_of_executed_units|^Done' $(FUZZ_BUILD)/fuzz_$$n.log | tr '\n' ' '; echo; \
	done
endef

# The fuzz build (all of the core again, with clang, ASan and UBSan) is the
# slowest step of a first `make test`: it runs on every core when make was
# started without -j (README's plain `make test`; with -j, make's own job
# count holds).  Only the build: the fuzzing and the tests run one at a time.
fuzz-build-all-cores: | $(DEPS_TEST)
	@$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j"$$(nproc)") \
	  fuzz-build

fuzz: fuzz-build-all-cores
	$(call fuzz_run,$(FUZZ_SECONDS))

fuzz-smoke: fuzz-build-all-cores
	$(call fuzz_run,$(FUZZ_SMOKE_SECONDS),-seed=$(FUZZ_SMOKE_SEED) -runs=$(FUZZ_SMOKE_RUNS))

ifeq ($(filter 1 thread,$(SAN)),)
TEST_TARGETS += fuzz-smoke
endif

-include $(sort $(FUZZ_OBJ:.o=.d) $(FUZZ_SPEC_OBJ:.o=.d))
