# mk/conns.mk: tests/check_conns.c, groved's connection caps and idle
# timeouts (server/conns.c, server/http.c) and libgrove-client's failing
# fast when its connection drops.  It starts groved itself and links the
# client library, as check_server does (mk/server.mk, read after this file:
# hence "=").

TEST_EXTRA_check_conns = $(CLIENTLIB)

$(BUILD)/tests/check_conns.o: $(PROTO_H)
