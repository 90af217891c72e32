# `make gemm-bench` builds the GEMM micro-benchmark (bench/gemm_bench.c) into
# $(BUILD)/bench/gemm_bench.  bench/run.sh does not need it: it compiles the
# benchmark itself against libgrove.a.
GEMM_BENCH := $(BUILD)/bench/gemm_bench

.PHONY: gemm-bench
gemm-bench: $(GEMM_BENCH)
	@echo "run: $(GEMM_BENCH) [--threads T] [--seconds S] [--rounds R] [--batches 1,64,256] [--layers]"

$(GEMM_BENCH): bench/gemm_bench.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)
