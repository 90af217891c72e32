"""The grove command line with several --server URLs (replicas): predict is
spread and answered, reload reloads each replica in turn at its admin
listener (--admin URL,URL; one line each), export and hooks are refused
(they act on one replica; docs/operations.md, "Several replicas"), and so
is a reload of several replicas whose admin URLs were not given.
tests/check_replicas.c covers killing a replica."""
import os
import signal
import subprocess
import tempfile
import time

from netutil import admin_listen, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")
DIGITS = os.path.join(ROOT, "examples", "digits")


def grove(*args):
    return subprocess.run([GROVE, *args], capture_output=True, text=True, timeout=60)


def test_cli_with_two_replicas():
    with tempfile.TemporaryDirectory() as tmp:
        urls, admins, procs = [], [], []
        try:
            for i in range(2):
                url = f"tcp://127.0.0.1:{free_port()}"
                admin = admin_listen(tmp, f"admin{i}")
                log = open(os.path.join(tmp, f"groved{i}.log"), "w")
                procs.append(subprocess.Popen(
                    [GROVED, "--model", f"digits={DIGITS}", "--listen", url, "--http", "none",
                     "--admin-listen", admin, "--pub", "none", "--workers", "1"], stdout=log,
                    stderr=subprocess.STDOUT))
                urls.append(url)
                admins.append(admin)
            both, both_admin = ",".join(urls), ",".join(admins)
            deadline = time.monotonic() + 30
            while grove("--server", urls[0], "status").returncode or \
                    grove("--server", urls[1], "status").returncode:
                assert time.monotonic() < deadline, "groved did not start"
                time.sleep(0.05)
            sample = os.path.join(DIGITS, "sample.npy")
            for _ in range(4):
                r = grove("--server", both, "predict", "digits", sample)
                assert r.returncode == 0, r.stderr
                assert r.stdout.startswith("y float32 [8, 10]\n"), r.stdout
            # Without their admin URLs, which admin listeners are meant is unknown.
            r = grove("--server", both, "reload", "digits")
            assert r.returncode == 1 and "--admin" in r.stderr, (r.returncode, r.stderr)
            r = grove("--server", both, "--admin", both_admin, "reload", "digits")
            assert r.returncode == 0, r.stderr
            lines = r.stdout.splitlines()
            assert len(lines) == 2, r.stdout
            for admin, line in zip(admins, lines):
                assert line.startswith(f"{admin}: model digits: version 2 serving (was 1)"), line
            out = os.path.join(tmp, "d.safetensors")
            r = grove("--server", both, "--admin", both_admin, "export", "digits", "-o", out)
            assert r.returncode == 1 and "one replica" in r.stderr, (r.returncode, r.stderr)
            assert not os.path.exists(out)
            r = grove("--server", both, "hook", "add", "digits", "*")
            assert r.returncode != 0 and "one replica" in r.stderr, (r.returncode, r.stderr)
            # One URL of the two: the replica's own export works.
            r = grove("--server", urls[1], "--admin", admins[1], "export", "digits", "-o", out)
            assert r.returncode == 0 and "version 2" in r.stdout, r.stderr
        finally:
            for p in procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
            for p in procs:
                try:
                    assert p.wait(timeout=30) == 0
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    raise
