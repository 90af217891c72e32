# The layering of core/ (docs/architecture.md, "core/"), enforced twice:
# the Makefile compiles each folder with the include paths of its own layer
# and those below only (CORE_INC_*), and `make test` runs this check on the
# objects (tools/check_layers.py: no two files that call each other in a
# circle, no call from a folder up into a higher one).  io/ and kernels/,
# io/ and nn/ are side by side: neither may call the other (each pair is
# given in both orders).  server/ and client/ have their own check
# (mk/layers.mk).
CORE_LAYER_DIRS  := $(CORE_LAYERS:%=core/%)
CORE_LAYER_ORDER := --order core/base,core/tensor,core/kernels,core/nn,core/graph,core/model,core/train \
                    --order core/base,core/tensor,core/io,core/graph,core/model,core/train \
                    --order core/io,core/kernels --order core/kernels,core/io \
                    --order core/io,core/nn --order core/nn,core/io

.PHONY: layers-core
layers-core: $(LIBGROVE)
	python3 tools/check_layers.py $(BUILD) $(CORE_LAYER_DIRS) $(CORE_LAYER_ORDER)

TEST_TARGETS += layers-core
