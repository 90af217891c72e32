# mk/pyclient.mk: libgrove-client as a shared library, for the Python
# package in python/grove (ctypes) and any other language's FFI.
#
#   make pyclient    $(BUILD)/libgrove-client.so (also built by `make`)
#
# It holds libgrove-client (client.c, watch.c, the generated protobuf code)
# and the parts of libgrove it calls (tensors, statuses, checkpoint names),
# linked from libgrove.a, so that only libnng, libprotobuf-c and the
# libraries libgrove needs must be installed.  Every object is already
# compiled with -fPIC (the Makefile's CFLAGS).  CLIENTLIB_OBJ is set by
# mk/server.mk, read after this file: hence the recursive "=".

PYCLIENT_SO = $(BUILD)/libgrove-client.so
ALL_TARGETS += $(BUILD)/libgrove-client.so

.PHONY: pyclient
pyclient: $(BUILD)/libgrove-client.so

$(BUILD)/libgrove-client.so: $(BUILD)/client/client.o $(BUILD)/client/client_nng.o $(BUILD)/client/client_sp.o $(BUILD)/client/client_train.o $(BUILD)/client/watch.o \
                             $(BUILD)/client/nng_close.o $(BUILD)/client/sp_wire.o \
                             $(BUILD)/gen/grove.pb-c.o $(BUILD)/libgrove.a
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libgrove-client.so -o $@ $(filter %.o,$^) \
	  $(BUILD)/libgrove.a $(PKG_LIBS)

# `make install` also installs the shared library (python/grove finds it on
# the loader's path, or through GROVE_CLIENT_LIB).
.PHONY: install-pyclient
install: install-pyclient
install-pyclient: $(BUILD)/libgrove-client.so
	install -d $(DESTDIR)$(PREFIX)/lib
	install -m 755 $(BUILD)/libgrove-client.so $(DESTDIR)$(PREFIX)/lib/libgrove-client.so
