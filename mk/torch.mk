# torch.save checkpoints (core/io/torch_zip.c inflates deflated records with
# zlib, which the Makefile's PKGS carries).

# `make bench-torch-load`: loading a ~500 MB state_dict as .pt and
# safetensors, beside torch.load (bench/torch_load_bench.sh).
TORCH_LOAD_BENCH := $(BUILD)/bench/torch_load_bench

.PHONY: bench-torch-load
bench-torch-load: $(TORCH_LOAD_BENCH)
	@bash bench/torch_load_bench.sh $(TORCH_LOAD_BENCH)

$(TORCH_LOAD_BENCH): bench/torch_load_bench.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)
