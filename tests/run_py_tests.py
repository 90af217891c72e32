#!/usr/bin/env python3
"""Runs Grove's Python-side tests: every function named test_* in
tests/py/test_*.py, in file order, with plain asserts (no pytest needed).

    GROVE_BIN=build/grove /usr/bin/python3 tests/run_py_tests.py [FILTER...]

A FILTER keeps the tests whose "file::name" contains it.  With
GROVE_PRELOAD="PATH..." (`make py-tests SAN=1` sets it to the ASan runtime
and libstdc++, so that python can load the sanitized libgrove-client.so and
torch's C++ exceptions meet an ASan that found __cxa_throw), the runner
starts itself again with them in LD_PRELOAD and leak detection off for the
interpreter (CPython and torch keep memory to their exit on purpose); the
programs the tests start (grove, groved) get the environment as it was,
leak detection included.  A test may raise
unittest.SkipTest to say it cannot run here (it is reported, not counted as
passed).  The last line is always "py-tests: N passed, N failed" (", N skipped" may follow); the exit
status is 1 when any test failed (or a test file did not import), else 0.
"""
import importlib.util
import os
import signal
import sys
import time
import traceback
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def stop_on(sig, frame):
    # SIGTERM and SIGHUP end the run as Ctrl-C does, by an exception that
    # unwinds the running test, so that its `with` blocks remove their
    # temporary directories and stop the servers they started.
    raise SystemExit(128 + sig)


def preload(argv):
    """Starts the runner again with $GROVE_PRELOAD preloaded, once."""
    lib = os.environ.get("GROVE_PRELOAD")
    if not lib or os.environ.get("GROVE_PRELOADED") == lib:
        return
    for path in lib.split():
        if not os.path.exists(path):
            sys.exit(f"GROVE_PRELOAD: {path}: no such file")
    env = dict(os.environ, GROVE_PRELOADED=lib,
               GROVE_SAVED_LD_PRELOAD=os.environ.get("LD_PRELOAD", ""),
               GROVE_SAVED_ASAN_OPTIONS=os.environ.get("ASAN_OPTIONS", ""))
    env["LD_PRELOAD"] = " ".join(x for x in (lib, os.environ.get("LD_PRELOAD")) if x)
    env["ASAN_OPTIONS"] = ":".join(x for x in (os.environ.get("ASAN_OPTIONS"),
                                               "detect_leaks=0") if x)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, *argv], env)


def restore_env():
    """Once preloaded: the tests' own programs get the environment back."""
    if "GROVE_SAVED_LD_PRELOAD" not in os.environ:
        return
    for var in ("LD_PRELOAD", "ASAN_OPTIONS"):
        saved = os.environ.pop(f"GROVE_SAVED_{var}")
        if saved:
            os.environ[var] = saved
        else:
            os.environ.pop(var, None)


def main(argv):
    preload(argv)
    restore_env()
    filters = argv[1:]
    signal.signal(signal.SIGTERM, stop_on)
    signal.signal(signal.SIGHUP, stop_on)
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    sys.path.insert(0, os.path.join(HERE, "py"))
    os.environ.setdefault("GROVE_BIN", os.path.join(ROOT, "build", "grove"))
    try:
        import torch
        torch.set_num_threads(1)  # the machine is shared; tests stay modest
    except ImportError:
        pass
    passed = failed = skipped = 0
    test_dir = os.path.join(HERE, "py")
    for fname in sorted(os.listdir(test_dir)):
        if not (fname.startswith("test_") and fname.endswith(".py")):
            continue
        path = os.path.join(test_dir, fname)
        try:
            spec = importlib.util.spec_from_file_location(fname[:-3], path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
        except Exception:
            print(f"FAIL {fname}: does not import")
            traceback.print_exc()
            failed += 1
            continue
        tests = [(n, f) for n, f in vars(mod).items()
                 if n.startswith("test_") and callable(f)
                 and getattr(f, "__module__", None) == mod.__name__]
        for name, fn in tests:
            full = f"{fname}::{name}"
            if filters and not any(f in full for f in filters):
                continue
            t0 = time.monotonic()
            try:
                fn()
            except unittest.SkipTest as e:
                skipped += 1
                print(f"skip {full}: {e}")
                continue
            except Exception:
                failed += 1
                print(f"FAIL {full}")
                traceback.print_exc()
                continue
            passed += 1
            print(f"ok   {full} ({time.monotonic() - t0:.1f}s)")
    sys.stdout.flush()
    tail = f", {skipped} skipped" if skipped else ""
    print(f"py-tests: {passed} passed, {failed} failed{tail}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
