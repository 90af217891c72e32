# mk/sp.mk: groved's data plane read on its own loop (--data-io loop, the
# default: server/sp.c).  tests/check_sp.c runs with the other Check suites;
# `make sp-test` runs every other suite that starts groved again with each
# groved on NNG's listener (GROVED_DATA_IO=nng, --data-io's default), so
# that each guarantee of theirs holds on both listeners.
# (Read before server.mk: hence "=".)

TEST_EXTRA_check_sp = $(CLIENTLIB)

$(BUILD)/tests/check_sp.o: $(PROTO_H)

TEST_TARGETS += sp-test

# Every suite that starts groved (tests/groved_harness.h), check_sp aside.
SP_LOOP_SUITES = $(filter-out check_sp,$(basename $(notdir $(shell grep -l groved_harness.h tests/check_*.c))))

.PHONY: sp-test
sp-test: all $(SP_LOOP_SUITES:%=$(BUILD)/tests/%) $(FIXTURE_STAMP)
	@fail=0; for t in $(SP_LOOP_SUITES); do \
	  echo "sp-test: $$t with GROVED_DATA_IO=nng"; \
	  GROVED_DATA_IO=nng GROVE_FIXTURES=$(FIXTURES) GROVE_BIN=$(GROVE_BIN) \
	    CK_DEFAULT_TIMEOUT=120 $(BUILD)/tests/$$t || fail=1; \
	done; exit $$fail
