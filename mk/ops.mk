# mk/ops.mk: tools/grove_ops.json, the op table (core/nn/ops_*.c) written
# out for tools/grove_export.py.  `make ops-json` regenerates it after an
# entry changes; `make test` fails while the committed file is stale.
OPS_JSON_BIN := $(BUILD)/tools/grove_ops_json

$(BUILD)/tools/grove_ops_json.o: INC := $(CORE_INC_nn)
$(OPS_JSON_BIN): $(BUILD)/tools/grove_ops_json.o $(LIBGROVE)
	$(CC) $(LDFLAGS) -o $@ $< $(LIBGROVE) $(PKG_LIBS)

.PHONY: ops-json ops-json-check
ops-json: $(OPS_JSON_BIN)
	$(OPS_JSON_BIN) > tools/grove_ops.json

ops-json-check: $(OPS_JSON_BIN)
	@$(OPS_JSON_BIN) | cmp -s - tools/grove_ops.json || { \
	  echo "tools/grove_ops.json is stale (the op table changed): run make ops-json" >&2; exit 1; }

ALL_TARGETS  += $(OPS_JSON_BIN)
TEST_TARGETS += ops-json-check
