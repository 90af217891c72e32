# mk/train.mk: tests/check_train_server.c, training sessions in a live groved
# (server/train.c, docs/training.md).  Like check_reload it starts groved and
# links the client library (and the CLI's .npy writer for its CLI test).
# CLIENTLIB is set by mk/server.mk, read before this file.

TEST_EXTRA_check_train_server := $(CLIENTLIB) $(BUILD)/client/npy.o

$(BUILD)/tests/check_train_server.o: $(PROTO_H)

# `make bench-train`: training steps per second on the reference MLP beside
# PyTorch (docs/performance.md, "Training").
.PHONY: bench-train
bench-train: all
	@bash bench/train_bench.sh $(GROVE_BIN)
