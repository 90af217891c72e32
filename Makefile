# Grove's build.  `make` builds libgrove, the grove CLI (and later groved);
# `make test` builds and runs every test; `make test SAN=1` does the same with
# AddressSanitizer + UndefinedBehaviorSanitizer; `make run` serves the demo;
# `make bench` prints figures beside PyTorch and ONNX Runtime;
# `make install PREFIX=...`.  Dependencies are installed (or the command to
# install them printed) by scripts/deps.sh, the first time.

CC      ?= cc
PREFIX  ?= /usr/local
SAN     ?= 0
PYTHON  := $(shell scripts/torch-python.sh 2>/dev/null)

ifeq ($(SAN),1)
BUILD   ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
OPT     := -O1 -g
else
BUILD   ?= build/release
SANFLAGS :=
# -ftree-vectorize: at -O2 GCC 12 vectorises only loops whose trip count it
# knows, and the layers' elementwise loops are their whole cost.
OPT     := -O2 -ftree-vectorize -g
endif

PKGS     := jansson openblas check zlib
DEPSTAMP := build/.deps-ok

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter -Wvla
CFLAGS  += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread $(OPT) $(WARN) \
           -Iinclude -Icore -Iclient $(SANFLAGS) -fPIC
LDFLAGS += $(SANFLAGS) -pthread

PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs jansson openblas zlib 2>/dev/null) -lm
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)

CORE_SRC   := $(wildcard core/*.c)
CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o)
CLIENT_SRC := $(wildcard client/*.c)
CLIENT_OBJ := $(CLIENT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC   := $(wildcard tests/check_*.c)
TEST_BIN   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTUTIL   := $(BUILD)/tests/testutil.o

LIBGROVE   := $(BUILD)/libgrove.a
GROVE_BIN  := $(BUILD)/grove

.DEFAULT_GOAL := all

# Subsystems with their own rules (server, fuzzing, ...) add a file in mk/;
# each may append to ALL_TARGETS (built by `make`) and TEST_TARGETS (run by
# `make test` after the unit and Python tests).
-include $(sort $(wildcard mk/*.mk))

.PHONY: all deps test unit-tests py-tests run bench install clean fixtures fmt
all: $(LIBGROVE) $(GROVE_BIN) $(ALL_TARGETS)
	@ln -sfn $(notdir $(BUILD)) build/current
	@ln -sf current/grove build/grove

$(DEPSTAMP): scripts/deps.sh
	@mkdir -p build
	@scripts/deps.sh
	@touch $@

deps: $(DEPSTAMP)

$(BUILD)/%.o: %.c | $(DEPSTAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

$(LIBGROVE): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	ar rcs $@ $^

$(GROVE_BIN): $(CLIENT_OBJ) $(LIBGROVE)
	$(CC) $(LDFLAGS) -o $@ $(CLIENT_OBJ) $(LIBGROVE) $(PKG_LIBS)

# A test of client code names the client objects it needs in TEST_EXTRA_check_X.
TEST_EXTRA_check_npy := $(BUILD)/client/npy.o

# Test objects are intermediates of the pattern rule below; keep them, so
# that a rebuild recompiles only what changed.
.SECONDARY:
.SECONDEXPANSION:
$(BUILD)/tests/check_%: $(BUILD)/tests/check_%.o $(TESTUTIL) $$(TEST_EXTRA_check_$$*) $(LIBGROVE)
	$(CC) $(LDFLAGS) -o $@ $< $(TESTUTIL) $(TEST_EXTRA_check_$*) $(LIBGROVE) $(PKG_LIBS) $(CHECK_LIBS)

# Fixtures: the committed ones in tests/fixtures, regenerated into the build
# folder by tests/gen_fixtures.py whenever torch is importable, so a parity
# test always compares with the PyTorch on this machine when there is one.
FIXTURES := tests/fixtures
ifneq ($(PYTHON),)
FIXTURES := $(BUILD)/fixtures
$(BUILD)/fixtures/.stamp: tests/gen_fixtures.py tools/grove_export.py $(wildcard tests/fixtures_gen/*.py)
	@mkdir -p $(dir $@)
	$(PYTHON) tests/gen_fixtures.py $(BUILD)/fixtures
	@touch $@
FIXTURE_STAMP := $(BUILD)/fixtures/.stamp
endif

fixtures:
	@test -n "$(PYTHON)" || { echo "make fixtures needs python3-torch (scripts/deps.sh --torch)"; exit 1; }
	$(PYTHON) tests/gen_fixtures.py tests/fixtures

# The suites that run whole layers and graphs run a second time on the AVX2
# kernel (GROVE_GEMM=avx2; the default kernel where the CPU has no AVX2), so
# that an AVX-512 machine also tests what an AVX2-only one runs.
AVX2_SUITES := $(BUILD)/tests/check_layers $(BUILD)/tests/check_conv $(BUILD)/tests/check_graph \
               $(BUILD)/tests/check_attention

unit-tests: all $(TEST_BIN) $(FIXTURE_STAMP)
	@fail=0; for t in $(TEST_BIN); do \
	  GROVE_FIXTURES=$(FIXTURES) GROVE_BIN=$(GROVE_BIN) CK_DEFAULT_TIMEOUT=120 $$t || fail=1; \
	done; \
	for t in $(AVX2_SUITES); do \
	  echo "unit-tests: $$(basename $$t) on the AVX2 kernel (GROVE_GEMM=avx2)"; \
	  GROVE_GEMM=avx2 GROVE_FIXTURES=$(FIXTURES) CK_DEFAULT_TIMEOUT=120 $$t || fail=1; \
	done; exit $$fail

py-tests: all
	@if [ -n "$(PYTHON)" ]; then \
	  GROVE_BIN=$(GROVE_BIN) $(PYTHON) tests/run_py_tests.py; \
	else echo "py-tests: skipped (no python3 with torch; scripts/deps.sh --torch installs it)"; fi

test: unit-tests py-tests $(TEST_TARGETS)

run: all
	@test -f examples/digits/model.json || { echo "examples/digits is missing: /usr/bin/python3 examples/train_digits.py writes it (scripts/deps.sh --torch installs what it needs)"; exit 1; }
	@echo "make run: groved serves examples/digits on tcp://127.0.0.1:7700 (HTTP on 127.0.0.1:7701); Ctrl-C stops it."
	@echo "  try: $(GROVE_BIN) status; $(GROVE_BIN) predict digits examples/digits/sample.npy"
	exec $(GROVED_BIN) --model digits=examples/digits

bench: all
	@bash bench/run.sh $(GROVE_BIN)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/grove
	install -m 755 $(GROVE_BIN) $(DESTDIR)$(PREFIX)/bin/grove
	install -m 644 $(LIBGROVE) $(DESTDIR)$(PREFIX)/lib/libgrove.a
	install -m 644 include/grove/*.h $(DESTDIR)$(PREFIX)/include/grove/
	install -d $(DESTDIR)$(PREFIX)/share/grove
	install -m 644 tools/grove_export.py $(DESTDIR)$(PREFIX)/share/grove/

fmt:
	clang-format -i $(CORE_SRC) $(CLIENT_SRC) $(TEST_SRC) include/grove/*.h core/*.h

clean:
	rm -rf build

-include $(CORE_OBJ:.o=.d) $(CLIENT_OBJ:.o=.d) $(TEST_BIN:=.d) $(TESTUTIL:.o=.d)
