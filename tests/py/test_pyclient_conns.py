"""The Python client when groved goes away under it: a predict in flight
when groved is killed, and one made afterwards, fail with UNAVAILABLE (found
on the client side) well before their timeout, as the C client's do
(tests/check_conns.c).  The client is ctypes over libgrove-client, so this
checks that nothing on the Python side waits longer.

Skips where test_pyclient does (no libgrove-client.so, or a SAN=1 build).
No assertion is about speed: the bound is half the call's timeout.
"""
import os
import subprocess
import tempfile
import threading
import time

import numpy as np

from netutil import free_port
from test_pyclient import DIGITS, GROVE, GROVED, SAMPLE, load_grove

TIMEOUT_MS = 20000


def start(tmp):
    url = f"tcp://127.0.0.1:{free_port()}"
    log = open(os.path.join(tmp, "groved.log"), "w+")
    proc = subprocess.Popen(
        [GROVED, "--model", f"digits={DIGITS}", "--listen", url, "--http", "none", "--pub",
         "none", "--workers", "1", "--test-batch-delay-ms", "30000"],
        stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while subprocess.run([GROVE, "--server", url, "status"], capture_output=True).returncode:
        if proc.poll() is not None or time.monotonic() > deadline:
            log.seek(0)
            proc.kill()
            raise AssertionError("groved did not start:\n" + log.read())
        time.sleep(0.05)
    return url, proc, log


def test_killed_server_fails_predicts_at_once():
    grove = load_grove()
    with tempfile.TemporaryDirectory() as tmp:
        url, proc, log = start(tmp)
        try:
            x = np.load(SAMPLE)
            with grove.Client(url) as c, grove.Client(url) as watcher:
                outcome = {}

                def call():
                    try:
                        c.predict("digits", x, timeout_ms=TIMEOUT_MS)
                        outcome["error"] = None
                    except grove.GroveError as e:
                        outcome["error"] = e
                    outcome["at"] = time.monotonic()

                th = threading.Thread(target=call)
                th.start()
                deadline = time.monotonic() + 15
                while watcher.status()["inflight"] != 1:
                    assert time.monotonic() < deadline, "the predict never reached groved"
                    time.sleep(0.01)
                t_kill = time.monotonic()
                proc.kill()
                proc.wait()
                th.join(timeout=TIMEOUT_MS / 1000 + 10)
                assert not th.is_alive(), "predict still waiting after its timeout"
                e = outcome["error"]
                assert e is not None and e.status == "GROVE_E_UNAVAILABLE" and e.local, e
                took = outcome["at"] - t_kill
                assert took < TIMEOUT_MS / 2000, f"failed {took:.1f} s after the kill: {e}"
                # With groved gone, a new predict waits for the redial only
                # briefly, not its whole timeout.
                t0 = time.monotonic()
                try:
                    c.predict("digits", x, timeout_ms=TIMEOUT_MS)
                    raise AssertionError("a predict was answered with groved killed")
                except grove.GroveError as e2:
                    took = time.monotonic() - t0
                    assert e2.status == "GROVE_E_UNAVAILABLE" and e2.local, e2
                    assert took < TIMEOUT_MS / 2000, f"failed after {took:.1f} s: {e2}"
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
