# mk/server_reload.mk: the test suites of hot reload and state_dict export
# (tests/check_reload.c, tests/check_export.c).  Both start a real groved and
# talk to it through libgrove-client and raw NNG requests, so they link the
# client library and need the generated protobuf header, as check_server does
# (mk/server.mk).  Read after mk/server.mk (names sort so).

TEST_EXTRA_check_reload := $(CLIENTLIB)
TEST_EXTRA_check_export := $(CLIENTLIB)

$(BUILD)/tests/check_reload.o $(BUILD)/tests/check_export.o: $(PROTO_H)

# `make bench-reload`: p50/p99 during reload storms and peak RSS during a
# reload (docs/performance.md, "Hot reload").
.PHONY: bench-reload
bench-reload: all
	@bash bench/reload_bench.sh $(GROVE_BIN)

# tests/check_files.c: files that change underneath a running groved; it
# starts groved and the grove CLI like the suites above.
TEST_EXTRA_check_files := $(CLIENTLIB)
$(BUILD)/tests/check_files.o: $(PROTO_H)
