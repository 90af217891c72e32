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

# `make gemm-shapes`: the packed GEMM on the convolutions' products against
# the core's FMA peak (bench/gemm_shapes.c).
GEMM_SHAPES := $(BUILD)/bench/gemm_shapes

.PHONY: gemm-shapes
gemm-shapes: $(GEMM_SHAPES)
	@echo "run: $(GEMM_SHAPES) [--seconds S] [--rounds R] [--calls M:N:K:ROWS,...]"

$(GEMM_SHAPES): bench/gemm_shapes.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)

# `make conv-bench`: one Conv2d, Winograd beside plain rows (bench/conv_bench.c).
CONV_BENCH := $(BUILD)/bench/conv_bench

.PHONY: conv-bench
conv-bench: $(CONV_BENCH)
	@echo "run: $(CONV_BENCH) [--threads T] [--iters N] [--copies C] [--layers CIN:COUT:K:STRIDE:HW:BATCH,...]"

$(CONV_BENCH): bench/conv_bench.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)
