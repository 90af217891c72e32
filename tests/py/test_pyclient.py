"""The Python client (python/grove, ctypes on libgrove-client.so) against a
live groved serving examples/digits: predict (NumPy in and out, equal to
`grove predict --local`), status, errors with their statuses, reload,
export, hooks and a telemetry subscription, and several replicas.

The library is the one beside $GROVE_BIN (`make` builds it).  Under
`make test SAN=1` it is built with ASan, which python3 loads only with the
ASan runtime preloaded: tests/run_py_tests.py does that (GROVE_PRELOAD).
"""
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

from netutil import admin_listen, free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
BUILD = os.path.dirname(os.path.realpath(GROVE))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(BUILD, "groved")
DIGITS = os.path.join(ROOT, "examples", "digits")
SAMPLE = os.path.join(DIGITS, "sample.npy")


def load_grove():
    if os.path.basename(BUILD) == "san" and "libasan" not in open("/proc/self/maps").read():
        raise unittest.SkipTest("libgrove-client.so of a SAN=1 build needs ASan preloaded: "
                                "make py-tests SAN=1 (tests/run_py_tests.py) does it")
    lib = os.path.join(BUILD, "libgrove-client.so")
    if not os.path.exists(lib):
        raise unittest.SkipTest(f"{lib} is not built (make pyclient)")
    os.environ["GROVE_CLIENT_LIB"] = lib
    sys.path.insert(0, os.path.join(ROOT, "python"))
    import grove
    return grove


class Groved:
    def __init__(self, tmp, name, pub=True, extra=(), models=None):
        """models: the --model values (NAME=DIR), examples/digits by default."""
        self.url = f"tcp://127.0.0.1:{free_port()}"
        self.pub = f"tcp://127.0.0.1:{free_port()}" if pub else "none"
        self.admin = admin_listen(tmp, f"{name}-admin")
        self.log = open(os.path.join(tmp, f"{name}.log"), "w+")
        model_args = [a for mv in (models or [f"digits={DIGITS}"]) for a in ("--model", mv)]
        self.proc = subprocess.Popen(
            [GROVED, *model_args, "--listen", self.url, "--http", "none",
             "--pub", self.pub, "--workers", "1", "--admin-listen", self.admin,
             "--checkpoint-dir", tmp, *extra], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while subprocess.run([GROVE, "--server", self.url, "status"],
                             capture_output=True).returncode != 0:
            assert self.proc.poll() is None and time.monotonic() < deadline, self.text()
            time.sleep(0.05)

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("groved did not drain")
            assert rc == 0, self.text()
        self.log.close()


def local_predict(tmp):
    out = os.path.join(tmp, "want.npy")
    r = subprocess.run([GROVE, "predict", "--local", DIGITS, SAMPLE, "-o", out],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return np.load(out)


def test_predict_status_reload_export():
    grove = load_grove()
    with tempfile.TemporaryDirectory() as tmp:
        srv = Groved(tmp, "g")
        try:
            x = np.load(SAMPLE)
            want = local_predict(tmp)
            with grove.Client(srv.url, admin=srv.admin) as c:
                out = c.predict("digits", x)
                assert list(out) == ["y"] and out.version == 1
                assert out["y"].dtype == np.float32 and out["y"].shape == (8, 10)
                assert np.allclose(out["y"], want, rtol=1e-5, atol=1e-6)
                # A non-contiguous view is sent in C order.
                out2 = c.predict("digits", np.asfortranarray(x))
                assert np.allclose(out2["y"], want, rtol=1e-5, atol=1e-6)
                st = c.status()
                assert st["ready"] and st["models"][0]["name"] == "digits"
                assert st["models"][0]["inputs"] == [{"name": "x", "dtype": "float32",
                                                      "shape": [-1, 64]}]
                try:
                    c.predict("nope", x)
                    raise AssertionError("predict of an unknown model succeeded")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_NOT_FOUND" and not e.local, e
                try:
                    c.predict("digits", x.astype(np.float64))
                    raise AssertionError("float64 input accepted")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_INVALID_ARGUMENT", e
                r = c.reload("digits")
                assert r["version"] == 2 and r["previous_version"] == 1, r
                try:
                    c.reload("digits", checkpoint=os.path.join(tmp, "missing.safetensors"))
                    raise AssertionError("reload of a missing file succeeded")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_NOT_FOUND" and e.version == 2, e
                path = os.path.join(tmp, "d.safetensors")
                info = c.export("digits", path)
                assert info["version"] == 2 and info["tensors"] == 13, info
                assert os.path.getsize(path) == info["total_size"]
                try:
                    c.export("digits", path)
                    raise AssertionError("export over an existing file succeeded")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_ALREADY_EXISTS" and e.local, e
                assert c.export("digits", path, overwrite=True)["version"] == 2
            try:
                grove.Client(f"tcp://127.0.0.1:{free_port()}")
                raise AssertionError("a client connected to nothing")
            except grove.GroveError as e:
                assert e.status == "GROVE_E_UNAVAILABLE" and e.local, e
        finally:
            srv.stop()


def test_hooks_and_watch():
    grove = load_grove()
    with tempfile.TemporaryDirectory() as tmp:
        srv = Groved(tmp, "g")
        try:
            with grove.Client(srv.url, admin=srv.admin) as c:
                h = c.add_hook("digits", "*", histogram=(8, -4.0, 4.0))
                assert h["id"] == 1 and "fc1" in h["modules"], h
                assert [x["id"] for x in c.hooks("digits")] == [1]
                events = grove.watch(srv.pub, "digits", "fc1", count=2, timeout_s=20)
                x = np.load(SAMPLE)
                stop = threading.Event()

                def traffic():  # until the subscription has seen its events
                    for _ in range(400):
                        if stop.is_set():
                            return
                        c.predict("digits", x)
                        time.sleep(0.02)

                t = threading.Thread(target=traffic)
                t.start()
                try:
                    got = list(events)
                finally:
                    stop.set()
                    t.join()
                    # Closed once no event is on its way (NNG 1.5 can hang
                    # closing a SUB socket that messages are arriving on).
                    time.sleep(0.1)
                    events.close()
                assert len(got) == 2, got
                for ev in got:
                    assert ev["model"] == "digits" and ev["module"] == "fc1", ev
                    assert ev["rows"] >= 8 and ev["shape"][1] == 64, ev
                    assert len(ev["histogram"]) == 8, ev
                assert got[1]["sequence"] > got[0]["sequence"]
                # Nothing published: the iterator ends after timeout_s.
                with grove.watch(srv.pub, "digits", count=1, timeout_s=0.2) as quiet:
                    assert list(quiet) == []
                removed = c.remove_hook(1)
                assert removed["id"] == 1 and c.hooks() == []
                try:
                    c.remove_hook(1)
                    raise AssertionError("removed a hook twice")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_NOT_FOUND", e
        finally:
            srv.stop()


def test_admin_plane_token_and_paths():
    """Reload, export and hooks go to groved's admin listener: by default
    the one $GROVE_ADMIN names, with $GROVE_ADMIN_TOKEN; the data listener
    refuses them naming the admin one; a missing or wrong token is
    UNAUTHENTICATED; a checkpoint outside the allowed directories is refused
    whatever it is."""
    grove = load_grove()
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory() as outside:
        tok = os.path.join(tmp, "token")
        with open(tok, "w") as f:
            f.write("py-admin-secret\n")
        os.chmod(tok, 0o600)
        srv = Groved(tmp, "g", pub=False, extra=("--admin-token-file", tok))
        saved = {k: os.environ.get(k) for k in ("GROVE_ADMIN", "GROVE_ADMIN_TOKEN")}
        try:
            x = np.load(SAMPLE)
            os.environ["GROVE_ADMIN"] = srv.admin
            os.environ["GROVE_ADMIN_TOKEN"] = "py-admin-secret"
            with grove.Client(srv.url) as c:  # the defaults: the environment
                assert c.reload("digits")["version"] == 2
                assert c.predict("digits", x).version == 2
                st = c.status()
                assert st["listen"] == [srv.url] and st["admin_listen"] == [srv.admin], st
            del os.environ["GROVE_ADMIN"], os.environ["GROVE_ADMIN_TOKEN"]
            # An admin call on the data listener: refused, naming the admin one.
            with grove.Client(srv.url, admin=srv.url, token="py-admin-secret") as c:
                try:
                    c.reload("digits")
                    raise AssertionError("reload on the data listener succeeded")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_PERMISSION_DENIED" and not e.local, e
                    assert srv.admin in e.message, e.message
            for token in ("", "py-admin-secreT", "py-admin-secret-and-more"):
                with grove.Client(srv.url, admin=srv.admin, token=token) as c:
                    try:
                        c.add_hook("digits", "*")
                        raise AssertionError(f"token {token!r} accepted")
                    except grove.GroveError as e:
                        assert e.status == "GROVE_E_UNAUTHENTICATED", e
                        assert "py-admin-secret" not in e.message, e.message
            with grove.Client(srv.url, admin=srv.admin, token_file=tok) as c:
                assert c.reload("digits")["version"] == 3
                # Outside the model's directory and --checkpoint-dir: one
                # refusal whatever the file is, naming the allowed ones.
                secret = os.path.join(outside, "secret.safetensors")
                with open(secret, "wb") as f:
                    f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}")
                link = os.path.join(tmp, "link.safetensors")
                os.symlink(secret, link)
                msgs = []
                for path in (secret, os.path.join(outside, "missing.safetensors"),
                             os.path.join(tmp, "..", os.path.basename(outside), "secret.safetensors"),
                             link):
                    try:
                        c.reload("digits", checkpoint=path)
                        raise AssertionError(f"reload from {path} succeeded")
                    except grove.GroveError as e:
                        assert e.status == "GROVE_E_PERMISSION_DENIED", e
                        assert os.path.realpath(tmp) in e.message, e.message
                        # (the client sends os.path.abspath(path))
                        msgs.append(e.message.replace(os.path.abspath(path), "PATH"))
                assert len(set(msgs)) == 1, msgs
                assert c.status()["models"][0]["version"] == 3
            log = srv.text()
            assert "py-admin-secret" not in log, log
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            srv.stop()


def test_two_replicas():
    grove = load_grove()
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Groved(tmp, "a", pub=False), Groved(tmp, "b", pub=False)
        try:
            x = np.load(SAMPLE)
            want = local_predict(tmp)
            with grove.Client(f"{a.url},{b.url}") as c:
                for _ in range(6):
                    assert np.allclose(c.predict("digits", x)["y"], want, rtol=1e-5, atol=1e-6)
                a.proc.kill()
                a.proc.wait()
                for _ in range(6):
                    assert np.allclose(c.predict("digits", x)["y"], want, rtol=1e-5, atol=1e-6)
                try:
                    c.reload("digits")
                    raise AssertionError("reload through a client of two replicas")
                except grove.GroveError as e:
                    assert e.status == "GROVE_E_INVALID_ARGUMENT" and "one replica" in e.message
        finally:
            b.stop()
            a.log.close()


def test_example_runs():
    load_grove()
    # A python of its own loads the library: under SAN=1 it needs the ASan
    # runtime preloaded, as tests/run_py_tests.py preloads it for itself.
    env = dict(os.environ)
    if os.environ.get("GROVE_PRELOADED"):
        env.update(LD_PRELOAD=os.environ["GROVE_PRELOADED"], ASAN_OPTIONS="detect_leaks=0")
    with tempfile.TemporaryDirectory() as tmp:
        srv = Groved(tmp, "g")
        try:
            r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python_client.py"),
                                "--server", srv.url, "--admin", srv.admin, "--pub", srv.pub],
                               capture_output=True, text=True, timeout=60, env=env)
            assert r.returncode == 0, r.stdout + r.stderr
            assert "predicted [2, 0, 4, 9, 4, 1, 2, 4]" in r.stdout, r.stdout
            assert "act1: mean" in r.stdout and "exported version 2" in r.stdout, r.stdout
        finally:
            srv.stop()
