# Grove's build.  `make` builds libgrove, the grove CLI (and later groved);
# `make test` builds and runs every test; `make test SAN=1` does the same with
# AddressSanitizer + UndefinedBehaviorSanitizer; `make test SAN=thread` runs
# the concurrency suites under ThreadSanitizer; `make run` serves the demo;
# `make bench` prints figures beside PyTorch and ONNX Runtime (bench/run.sh, then the
# torchvision zoo, bench/zoo.sh);
# `make install PREFIX=...`.  Dependencies are installed (or the command to
# install them printed) by scripts/deps.sh, the first time (docs/building.md).
#
# Nothing here asks about installed packages while make reads the makefiles:
# on a fresh machine they are not there yet.  Every pkg-config query and the
# torch interpreter are recursive ("=") variables used only in recipes, which
# make expands after the dependency stamp below is made.  Keep it so in mk/.

CC      ?= cc
PREFIX  ?= /usr/local
SAN     ?= 0
# The interpreter that imports torch and numpy (recipes only; see above).
PYTHON   = $(shell scripts/torch-python.sh 2>/dev/null)

ifeq ($(SAN),1)
BUILD   ?= build/san
SANFLAGS := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
OPT     := -O1 -g
else ifeq ($(SAN),thread)
# ThreadSanitizer: only the suites with threads of their own or a groved
# (TSAN_SUITES below); groved and the CLI they start are built with it too.
BUILD   ?= build/tsan
SANFLAGS := -fsanitize=thread -fno-omit-frame-pointer
OPT     := -O1 -g
else
BUILD   ?= build/release
SANFLAGS :=
# -ftree-vectorize: at -O2 GCC 12 vectorises only loops whose trip count it
# knows, and the layers' elementwise loops are their whole cost.
OPT     := -O2 -ftree-vectorize -g
endif

PKGS     := jansson openblas check zlib

# Dependencies: a stamp per package set of scripts/deps.sh, made before
# anything is compiled (every object is order-only on $(DEPSTAMP)).  The
# goals that run tests need the test set (torch, clang, ...); asking for it
# from the start installs everything with one apt-get.
DEPS_BUILD := build/.deps-build
DEPS_TEST  := build/.deps-test
DEPS_TEST_GOALS := test unit-tests py-tests server-test fixtures
ifneq ($(filter $(DEPS_TEST_GOALS),$(MAKECMDGOALS)),)
DEPSTAMP := $(DEPS_TEST)
else
DEPSTAMP := $(DEPS_BUILD)
endif

WARN    := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wno-unused-parameter -Wvla
# core/ is in folders that are its layers (docs/architecture.md, "core/"),
# each using only those below it.  A folder's objects compile with the
# include paths of its own layer and those below only (INC, set per folder
# below), so that an #include of a higher layer's header does not compile;
# tools/check_layers.py checks the calls (mk/layers_core.mk).  io/ sits
# beside kernels/ and nn/ on top of tensor/; graph/ sees both nn/ and io/.
# Everything else (server/, client/, tests/, bench/) gets CORE_INC_ALL and
# -Iclient; core/internal.h, on no layer's path, gathers the lower layers'
# internal headers for it.
CORE_LAYERS      := base tensor kernels nn io graph model train
CORE_INC_base    := -Icore/base
CORE_INC_tensor  := $(CORE_INC_base) -Icore/tensor
CORE_INC_kernels := $(CORE_INC_tensor) -Icore/kernels
CORE_INC_nn      := $(CORE_INC_kernels) -Icore/nn
CORE_INC_io      := $(CORE_INC_tensor) -Icore/io
CORE_INC_graph   := $(CORE_INC_nn) -Icore/io -Icore/graph
CORE_INC_model   := $(CORE_INC_graph) -Icore/model
CORE_INC_train   := $(CORE_INC_model) -Icore/train
CORE_INC_ALL     := -Icore $(CORE_INC_train)
INC              := $(CORE_INC_ALL) -Iclient
CFLAGS  += -std=c11 -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -pthread $(OPT) $(WARN) \
           -Iinclude $(INC) $(SANFLAGS) -fPIC
LDFLAGS += $(SANFLAGS) -pthread

# Recursive on purpose (see the top): expanded in recipes, after $(DEPSTAMP).
PKG_CFLAGS = $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   = $(shell pkg-config --libs jansson openblas zlib 2>/dev/null) -lm
CHECK_LIBS = $(shell pkg-config --libs check 2>/dev/null)

CORE_SRC   := $(foreach d,$(CORE_LAYERS),$(wildcard core/$(d)/*.c))
CORE_OBJ   := $(CORE_SRC:%.c=$(BUILD)/%.o)
CLIENT_SRC := $(wildcard client/*.c)
CLIENT_OBJ := $(CLIENT_SRC:%.c=$(BUILD)/%.o)
TEST_SRC   := $(wildcard tests/check_*.c)
TEST_BIN   := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%)
TESTUTIL   := $(BUILD)/tests/testutil.o

LIBGROVE   := $(BUILD)/libgrove.a
GROVE_BIN  := $(BUILD)/grove

.DEFAULT_GOAL := all

# Fixtures: the committed ones in tests/fixtures are what `make` alone and
# an installed Grove see; `make test` regenerates them into the build folder
# with tests/gen_fixtures.py and the PyTorch on this machine (installed by
# the test dependencies), so a parity test always compares with it.
FIXTURES      := $(BUILD)/fixtures
FIXTURE_STAMP := $(BUILD)/fixtures/.stamp
# A recipe's "$(NEED_PYTHON); $$py ...": the torch interpreter in $$py,
# or a clear failure (never a skip: the test dependencies install it).
NEED_PYTHON = py="$(PYTHON)"; [ -n "$$py" ] || { echo "no python3 here imports torch and numpy: \
  scripts/deps.sh --test installs python3-torch and python3-numpy" >&2; exit 1; }

# Subsystems with their own rules (server, fuzzing, ...) add a file in mk/;
# each may append to ALL_TARGETS (built by `make`) and TEST_TARGETS (run by
# `make test` after the unit and Python tests).
-include $(sort $(wildcard mk/*.mk))

.PHONY: all deps test unit-tests py-tests run bench install clean fixtures fmt
all: $(LIBGROVE) $(GROVE_BIN) $(ALL_TARGETS)
	@ln -sfn $(notdir $(BUILD)) build/current
	@ln -sf current/grove build/grove

$(DEPS_BUILD): scripts/deps.sh
	@mkdir -p build
	@scripts/deps.sh
	@touch $@

# The test set holds the build set.
$(DEPS_TEST): scripts/deps.sh
	@mkdir -p build
	@scripts/deps.sh --test
	@touch $@ $(DEPS_BUILD)

deps: $(DEPSTAMP)

# A core folder's own include paths (see CORE_LAYERS above).
$(foreach d,$(CORE_LAYERS),$(eval $(BUILD)/core/$(d)/%.o: INC := $(CORE_INC_$(d))))

$(BUILD)/%.o: %.c | $(DEPSTAMP)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(PKG_CFLAGS) -MMD -MP -c $< -o $@

# Made afresh: `ar r` into an existing archive keeps the members of files
# that were since removed or moved, which would still be linked.
$(LIBGROVE): $(CORE_OBJ)
	@mkdir -p $(dir $@)
	@rm -f $@
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

$(FIXTURE_STAMP): tests/gen_fixtures.py tools/grove_export.py tools/grove_export_types.py tools/grove_export_graph.py tools/grove_safetensors.py tools/grove_ops.json $(wildcard tests/fixtures_gen/*.py) \
                  | $(DEPS_TEST)
	@mkdir -p $(dir $@)
	@$(NEED_PYTHON); echo "$$py tests/gen_fixtures.py $(BUILD)/fixtures"; \
	  $$py tests/gen_fixtures.py $(BUILD)/fixtures
	@touch $@

fixtures: | $(DEPS_TEST)
	@$(NEED_PYTHON); $$py tests/gen_fixtures.py tests/fixtures

# The suites that run whole layers and graphs run a second time on the AVX2
# kernel (GROVE_GEMM=avx2; the default kernel where the CPU has no AVX2), so
# that an AVX-512 machine also tests what an AVX2-only one runs.
AVX2_SUITES := $(BUILD)/tests/check_layers $(BUILD)/tests/check_conv $(BUILD)/tests/check_conv_kernels \
               $(BUILD)/tests/check_graph \
               $(BUILD)/tests/check_attention $(BUILD)/tests/check_rnn

# SAN=thread runs the suites that start a groved and load it from several
# threads or processes (groved's workers, batcher, reloads and training
# sessions, and the compute pools under them, all under TSan).  check_gemm
# is left out: it forks with its pool's threads running, which TSan reports
# in the child by design.  The rest are single-threaded, and the Python
# tests would only repeat what these drive.
TSAN_SUITES := $(addprefix $(BUILD)/tests/,check_server check_reload check_replicas \
               check_train_server check_export check_telemetry check_spclient)
# halt_on_error: a race ends the process that saw it (a test's child, or
# the groved it started), so that the test fails; a report alone would not
# change an exit status that Check looks at.  tests/tsan.supp: OpenBLAS,
# which is not built with TSan.
ifeq ($(SAN),thread)
UNIT_SUITES := $(TSAN_SUITES)
AVX2_SUITES :=
SAN_ENV     := TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 \
               suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)"
else
UNIT_SUITES := $(TEST_BIN)
SAN_ENV     :=
endif

unit-tests: all $(UNIT_SUITES) $(FIXTURE_STAMP)
	@fail=0; for t in $(UNIT_SUITES); do \
	  $(SAN_ENV) GROVE_FIXTURES=$(FIXTURES) GROVE_BIN=$(GROVE_BIN) CK_DEFAULT_TIMEOUT=120 $$t || fail=1; \
	done; \
	for t in $(AVX2_SUITES); do \
	  echo "unit-tests: $$(basename $$t) on the AVX2 kernel (GROVE_GEMM=avx2)"; \
	  GROVE_GEMM=avx2 GROVE_FIXTURES=$(FIXTURES) CK_DEFAULT_TIMEOUT=120 $$t || fail=1; \
	done; exit $$fail

# SAN=1: python loads the sanitized libgrove-client.so with the ASan runtime
# preloaded (tests/run_py_tests.py, GROVE_PRELOAD), and libstdc++ with it:
# ASan finds the __cxa_throw it intercepts only in libraries loaded before
# it, and torch throws C++ exceptions.
ifeq ($(SAN),1)
PY_PRELOAD = GROVE_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libstdc++.so.6)"
endif
# test_testutil.py and test_torch_ckpt.py run these two suites' binaries: under
# `make -j2 test` they must exist before the Python tests start.
PY_TEST_BINS := $(BUILD)/tests/check_testutil $(BUILD)/tests/check_torch
py-tests: all $(PY_TEST_BINS) | $(DEPS_TEST)
	@$(NEED_PYTHON); $(PY_PRELOAD) GROVE_BIN=$(GROVE_BIN) $$py tests/run_py_tests.py

ifeq ($(SAN),thread)
test: unit-tests
else
test: unit-tests py-tests $(TEST_TARGETS)
endif

run: all
	@test -f examples/digits/model.json || { echo "examples/digits is missing: /usr/bin/python3 examples/train_digits.py writes it (scripts/deps.sh --torch installs what it needs)"; exit 1; }
	@echo "make run: groved serves examples/digits on tcp://127.0.0.1:7700 (HTTP on 127.0.0.1:7701); Ctrl-C stops it."
	@echo "  try: $(GROVE_BIN) status; $(GROVE_BIN) predict digits examples/digits/sample.npy"
	exec $(GROVED_BIN) --model digits=examples/digits

bench: all
	@bash bench/run.sh $(GROVE_BIN)
	@bash bench/zoo.sh $(GROVE_BIN)

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib $(DESTDIR)$(PREFIX)/include/grove
	install -m 755 $(GROVE_BIN) $(DESTDIR)$(PREFIX)/bin/grove
	install -m 644 $(LIBGROVE) $(DESTDIR)$(PREFIX)/lib/libgrove.a
	install -m 644 include/grove/*.h $(DESTDIR)$(PREFIX)/include/grove/
	install -d $(DESTDIR)$(PREFIX)/share/grove
	install -m 644 tools/grove_export.py tools/grove_export_types.py tools/grove_export_graph.py tools/grove_safetensors.py tools/grove_ops.json $(DESTDIR)$(PREFIX)/share/grove/

fmt:
	clang-format -i $(CORE_SRC) $(CLIENT_SRC) $(TEST_SRC) include/grove/*.h core/*.h core/*/*.h

clean:
	rm -rf build

-include $(CORE_OBJ:.o=.d) $(CLIENT_OBJ:.o=.d) $(TEST_BIN:=.d) $(TESTUTIL:.o=.d)
