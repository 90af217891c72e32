# mk/telemetry.mk: forward-hook telemetry's pieces outside server/ (which
# server.mk builds by wildcard): the subscriber in libgrove-client, the CLI's
# hook and watch commands, their test suite and the hooks benchmark.
#
#   client/watch.c, client/cli_hooks.c  need the generated protobuf header
#   tests/check_telemetry.c             links the statistics of
#                                       server/telemetry_stats.c (pure
#                                       functions) and libgrove-client; it
#                                       starts groved for the rest
#   make bench-hooks                    bench/hooks_bench.sh

$(CLIENTLIB): $(BUILD)/client/watch.o
$(BUILD)/client/watch.o $(BUILD)/client/cli_hooks.o $(BUILD)/tests/check_telemetry.o: $(PROTO_H)

TEST_EXTRA_check_telemetry := $(BUILD)/server/telemetry_stats.o $(CLIENTLIB)

.PHONY: bench-hooks
bench-hooks: all
	@bash bench/hooks_bench.sh $(BUILD)
