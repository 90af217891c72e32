#!/usr/bin/env python3
"""Runs Grove's Python-side tests: every function named test_* in
tests/py/test_*.py, in file order, with plain asserts (no pytest needed).

    GROVE_BIN=build/grove /usr/bin/python3 tests/run_py_tests.py [FILTER...]

A FILTER keeps the tests whose "file::name" contains it.  A test may raise
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


def main(argv):
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
