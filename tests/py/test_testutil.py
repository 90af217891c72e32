"""A Check suite's run directory goes however the run ends.

tests/testutil.c's grove_test_run() keeps every temporary directory of a
suite in one $TMPDIR/grove-test-XXXXXX and removes it at the end.  These
tests run tests/check_testutil with TMPDIR set to an empty directory and
stop it in each way a run can end (a failing test, Check's timeout, SIGTERM,
SIGINT, SIGHUP, SIGALRM from outside), then look: nothing may be left in
TMPDIR, and no test process may outlive the run.
"""
import os
import signal
import subprocess
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))


def suite_binary():
    path = os.path.join(os.path.dirname(os.path.realpath(GROVE)), "tests", "check_testutil")
    if not os.path.exists(path):
        raise unittest.SkipTest(f"{path} is not built (make test builds it)")
    return path


def run_env(tmp, **extra):
    env = dict(os.environ, TMPDIR=os.path.join(tmp, "t"), **extra)
    os.makedirs(env["TMPDIR"], exist_ok=True)
    env.pop("CK_FORK", None)
    return env


def assert_nothing_left(env, what):
    left = os.listdir(env["TMPDIR"])
    assert not left, f"{what}: left in TMPDIR: {left}"


def assert_gone(pid, what):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        try:  # a zombie of ours would be reaped here; others' by init
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"{what}: the stalled test (pid {pid}) outlived its run")


def test_passing_and_failing_runs_leave_nothing():
    b = suite_binary()
    with tempfile.TemporaryDirectory() as tmp:
        env = run_env(tmp)
        r = subprocess.run([b], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        assert_nothing_left(env, "a passing run")
        env = run_env(tmp, GROVE_TESTUTIL_FAIL="1")
        r = subprocess.run([b], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "failing on purpose" in r.stdout, r.stdout + r.stderr
        assert_nothing_left(env, "a failing run")


def stalled_run(tmp, **extra):
    """The suite, started with a test that stalls: (process, env, test pid)."""
    pidfile = os.path.join(tmp, "pid")
    if os.path.exists(pidfile):
        os.unlink(pidfile)
    env = run_env(tmp, GROVE_TESTUTIL_STALL=pidfile, **extra)
    # A session of its own: a Check parent that takes SIGINT kills its whole
    # process group, which would otherwise hold this test runner too.
    p = subprocess.Popen([suite_binary()], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while not (os.path.exists(pidfile) and open(pidfile).read().endswith("\n")):
        assert p.poll() is None, f"the suite ended early: {p.communicate()[0]}"
        assert time.monotonic() < deadline, "the stalling test never started"
        time.sleep(0.02)
    assert os.listdir(env["TMPDIR"]), "no run directory while the suite runs"
    return p, env, int(open(pidfile).read())


def test_timeout_leaves_nothing():
    with tempfile.TemporaryDirectory() as tmp:
        p, env, pid = stalled_run(tmp, CK_DEFAULT_TIMEOUT="1")
        out = p.communicate(timeout=120)[0]
        assert p.returncode == 1 and "timeout" in out.lower(), out
        assert_nothing_left(env, "a test past Check's timeout")
        assert_gone(pid, "timeout")


def test_signals_leave_nothing():
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):
        with tempfile.TemporaryDirectory() as tmp:
            p, env, pid = stalled_run(tmp)
            p.send_signal(sig)
            try:
                out = p.communicate(timeout=60)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                raise AssertionError(f"{sig.name}: the suite did not stop")
            # It dies of the signal, so that make or a shell sees why.
            assert p.returncode == -sig, (sig.name, p.returncode, out)
            assert_nothing_left(env, sig.name)
            assert_gone(pid, sig.name)


def test_no_run_directory_no_run():
    b = suite_binary()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, TMPDIR=os.path.join(tmp, "missing"))
        r = subprocess.run([b], env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1 and "cannot make the run's directory" in r.stderr, \
            r.stdout + r.stderr
        assert os.listdir(tmp) == []
