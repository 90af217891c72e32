# torch.save checkpoints (core/torch_zip.c inflates deflated records with
# zlib).  Until zlib joins PKGS in the Makefile (and zlib1g-dev joins
# scripts/deps.sh), this adds it to every compile and link that uses the
# pkg-config flags.  PKG_CFLAGS and PKG_LIBS are recursive variables, so
# appending here works even though this file is included after them.
PKG_CFLAGS += $(shell pkg-config --cflags zlib 2>/dev/null)
PKG_LIBS   += $(shell pkg-config --libs zlib 2>/dev/null || echo -lz)

# The build-folder fixtures are regenerated when the torch generator changes.
$(BUILD)/fixtures/.stamp: tests/fixtures_gen/torch_ckpt.py

# `make bench-torch-load`: loading a ~500 MB state_dict as .pt and
# safetensors, beside torch.load (bench/torch_load_bench.sh).
TORCH_LOAD_BENCH := $(BUILD)/bench/torch_load_bench

.PHONY: bench-torch-load
bench-torch-load: $(TORCH_LOAD_BENCH)
	@bash bench/torch_load_bench.sh $(TORCH_LOAD_BENCH)

$(TORCH_LOAD_BENCH): bench/torch_load_bench.c $(LIBGROVE)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -o $@ $< $(LIBGROVE) $(LDFLAGS) $(PKG_LIBS)
