# mk/telemetry.mk: forward-hook telemetry's pieces outside server/ (which
# server.mk builds by wildcard): the subscriber in libgrove-client, the CLI's
# hook and watch commands, their test suite and the hooks benchmark.
#
#   client/watch.c, client/cli_hooks.c  need the generated protobuf header
#   tests/check_telemetry.c             links groved's objects (not main.o)
#                                       so that it can drive the hook tables
#                                       directly, plus libgrove-client
#   make bench-hooks                    bench/hooks_bench.sh

$(CLIENTLIB): $(BUILD)/client/watch.o
$(BUILD)/client/watch.o $(BUILD)/client/cli_hooks.o $(BUILD)/tests/check_telemetry.o: $(PROTO_H)

TEST_EXTRA_check_telemetry := $(filter-out $(BUILD)/server/main.o,$(SERVER_OBJ)) $(PROTO_OBJ) \
                              $(CLIENTLIB)
$(BUILD)/tests/check_telemetry: PKG_LIBS += $(UV_LIBS)

.PHONY: bench-hooks
bench-hooks: all
	@bash bench/hooks_bench.sh $(BUILD)
