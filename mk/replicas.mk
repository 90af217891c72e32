# mk/replicas.mk: tests/check_replicas.c, several groved replicas behind one
# libgrove-client (docs/operations.md, "Several replicas").  It links the
# client library and, like check_server, starts groved itself.  CLIENTLIB is
# set by mk/server.mk, read after this file: hence "=", not ":=" here.

TEST_EXTRA_check_replicas = $(CLIENTLIB)

$(BUILD)/tests/check_replicas.o: $(PROTO_H)
