# `make dw-bench`: the depthwise kernel alone on MobileNet's and EfficientNet's layers
# (bench/dw_bench.c).
DW_BENCH := $(BUILD)/bench/dw_bench

.PHONY: dw-bench
dw-bench: $(DW_BENCH)
	@echo "run: $(DW_BENCH) [--iters N] [--layers C:HW:K:STRIDE,...]"

$(DW_BENCH): bench/dw_bench.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)
