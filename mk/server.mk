# mk/server.mk: the RPC schema, groved, libgrove-client and their tests.
#
#   proto/grove.proto  -> $(BUILD)/gen/grove.pb-c.{c,h}   (protoc-c; never in git)
#   server/*.c         -> $(BUILD)/groved
#   client/client.c    -> $(BUILD)/libgrove-client.a      (with the generated code)
#
# client/*.c are linked into the grove CLI by the top-level Makefile's
# wildcard; client.c and cli_remote.c need the generated header, and the CLI
# needs the generated code, libprotobuf-c and NNG.  tests/check_server*.c run
# with `make test` like every Check suite (they start groved themselves).

GEN          := $(BUILD)/gen
PROTO_C      := $(GEN)/grove.pb-c.c
PROTO_H      := $(GEN)/grove.pb-c.h
PROTO_OBJ    := $(GEN)/grove.pb-c.o
SERVER_SRC   := $(wildcard server/*.c)
SERVER_OBJ   := $(SERVER_SRC:%.c=$(BUILD)/%.o)
GROVED_BIN   := $(BUILD)/groved
CLIENTLIB    := $(BUILD)/libgrove-client.a
CLIENTLIB_OBJ := $(BUILD)/client/client.o $(BUILD)/client/client_nng.o $(BUILD)/client/client_sp.o $(BUILD)/client/client_train.o \
                 $(BUILD)/client/nng_close.o $(BUILD)/client/sp_wire.o $(PROTO_OBJ)

# libnng-dev ships no .pc file (DESIGN.md, build notes): link -lnng directly.
# PKG_LIBS is recursive ("=", the Makefile), so "+=" keeps this $(shell)
# unexpanded until a recipe runs; UV_LIBS is recursive for the same reason:
# pkg-config answers only after the dependency stamp installed libuv1-dev.
PKGS     += libuv libprotobuf-c
CFLAGS   += -I$(GEN)
PKG_LIBS += $(shell pkg-config --libs libprotobuf-c 2>/dev/null) -lnng
UV_LIBS   = $(shell pkg-config --libs libuv 2>/dev/null)

CLIENT_OBJ  += $(PROTO_OBJ)
ALL_TARGETS += $(GROVED_BIN) $(CLIENTLIB)

TEST_EXTRA_check_server := $(CLIENTLIB)
TEST_EXTRA_check_admin := $(CLIENTLIB)

$(PROTO_C) $(PROTO_H) &: proto/grove.proto | $(DEPSTAMP)
	@mkdir -p $(GEN)
	protoc-c --c_out=$(GEN) --proto_path=proto proto/grove.proto

# Generated code: compiled without our warning set (it is not ours to fix).
$(PROTO_OBJ): $(PROTO_C) $(PROTO_H)
	$(CC) -std=c11 $(OPT) $(SANFLAGS) -fPIC -I$(GEN) $(PKG_CFLAGS) -c $< -o $@

$(SERVER_OBJ) $(BUILD)/client/client.o $(BUILD)/client/client_nng.o $(BUILD)/client/client_sp.o $(BUILD)/client/client_train.o $(BUILD)/client/cli_remote.o \
  $(BUILD)/tests/check_server.o $(BUILD)/tests/check_admin.o: $(PROTO_H)

# groved closes its sockets with the client's bounded close (client/nng_close.c)
# and speaks SP on its loop with the codec the client shares (client/sp_wire.c).
$(GROVED_BIN): $(SERVER_OBJ) $(BUILD)/client/nng_close.o $(BUILD)/client/sp_wire.o $(PROTO_OBJ) $(LIBGROVE)
	$(CC) $(LDFLAGS) -o $@ $(SERVER_OBJ) $(BUILD)/client/nng_close.o $(BUILD)/client/sp_wire.o $(PROTO_OBJ) $(LIBGROVE) \
	  $(UV_LIBS) $(PKG_LIBS)

$(CLIENTLIB): $(CLIENTLIB_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

# `make server-test`: only the server's integration suite (it also runs in
# `make test` with the other Check suites).
.PHONY: server-test install-server
server-test: all $(BUILD)/tests/check_server $(FIXTURE_STAMP)
	GROVE_FIXTURES=$(FIXTURES) GROVE_BIN=$(GROVE_BIN) CK_DEFAULT_TIMEOUT=120 $(BUILD)/tests/check_server

install: install-server
install-server: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib
	install -m 755 $(GROVED_BIN) $(DESTDIR)$(PREFIX)/bin/groved
	install -m 644 $(CLIENTLIB) $(DESTDIR)$(PREFIX)/lib/libgrove-client.a

-include $(SERVER_OBJ:.o=.d)
