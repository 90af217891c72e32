# mk/spclient.mk: tests/check_spclient.c, libgrove-client's SP transport
# (client/client_sp.c, the default) against groved on both listeners, a
# plain NNG rep0 socket and a tiny hostile fake server.  It runs with the
# other Check suites; `make spclient-test` runs every suite that talks to
# groved through libgrove-client again with GROVE_CLIENT_IO=nng (NNG's req0
# transport) and the Python tests likewise (not part of `make test`), so that both transports keep
# every guarantee.  CLIENTLIB is set by mk/server.mk, read after this file:
# hence "=".

TEST_EXTRA_check_spclient = $(CLIENTLIB)

$(BUILD)/tests/check_spclient.o: $(PROTO_H)

# The suites that start groved (tests/groved_harness.h), check_spclient
# aside (it checks the SP transport itself: its resend of an async predict,
# its messages about a hostile server).
SPCLIENT_SUITES = $(filter-out check_spclient,$(basename $(notdir $(shell grep -l groved_harness.h tests/check_*.c))))

.PHONY: spclient-test
spclient-test: all $(SPCLIENT_SUITES:%=$(BUILD)/tests/%) $(FIXTURE_STAMP)
	@fail=0; for t in $(SPCLIENT_SUITES); do \
	  echo "spclient-test: $$t with GROVE_CLIENT_IO=nng"; \
	  GROVE_CLIENT_IO=nng GROVE_FIXTURES=$(FIXTURES) GROVE_BIN=$(GROVE_BIN) \
	    CK_DEFAULT_TIMEOUT=120 $(BUILD)/tests/$$t || fail=1; \
	done; \
	GROVE_CLIENT_IO=nng GROVE_BIN=$(GROVE_BIN) GROVE_FIXTURES=$(FIXTURES) $(PYTHON) tests/run_py_tests.py || fail=1; \
	exit $$fail
