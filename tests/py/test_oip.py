"""The Open Inference Protocol (KServe V2 REST) on groved's HTTP listener
(issue #21, docs/protocol.md "Open Inference Protocol").

Every endpoint is driven with a plain HTTP client -- Python's urllib, raw
sockets where urllib hides what is tested (pipelining, Expect, chunked), and
curl -- never Grove code; infer outputs are compared with the torch model that
was exported.  Each error case is followed by a good infer on the same
groved, which must still answer.
"""
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import grove_export  # noqa: E402

from netutil import admin_listen, free_port  # noqa: E402

GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")
TOL = 1e-5  # float32 forward, same operations as torch's: rounding only
LIMIT = 65536  # --max-request-bytes of the groved these tests start


def mlp():
    torch.manual_seed(21)
    m = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    return m


def export_mlp(tmp):
    d = os.path.join(tmp, "mlp")
    grove_export.export(mlp(), d, example_input=torch.zeros(1, 16))
    return d


class Groved:
    """A groved on free ports serving models {name: dir}; stopped on exit."""

    def __init__(self, tmp, models, extra=(), wait_ready=True):
        self.http = free_port()
        self.tcp = f"tcp://127.0.0.1:{free_port()}"
        args = [GROVED, "--listen", self.tcp, "--http", f"127.0.0.1:{self.http}",
                "--pub", f"tcp://127.0.0.1:{free_port()}",
                "--admin-listen", admin_listen(tmp, f"admin{self.http}"),
                "--max-request-bytes", str(LIMIT), *extra]
        for name, d in models.items():
            args += ["--model", f"{name}={d}"]
        self.log = tempfile.TemporaryFile("w+")
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            assert self.p.poll() is None, "groved exited:\n" + self.text()
            try:
                code = get(self, "/healthz")[0]
                if code == 200 and (not wait_ready or get(self, "/readyz")[0] == 200):
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "groved not up within 30 s:\n" + self.text()
            time.sleep(0.05)

    def text(self):
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            rc = self.p.wait()
        self.log.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        said = self.text()
        rc = self.stop()
        if exc[0] is not None:  # what groved said, for the failure's reader
            sys.stderr.write(f"--- groved (exit {rc}) said:\n{said[-6000:]}\n")
        else:
            assert rc == 0, f"groved exited {rc}:\n{said[-6000:]}"


def request(srv, method, path, body=None, headers=None):
    """(status, headers, body bytes) of one request; HTTP errors included."""
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http}{path}", data=body,
                                 headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def get(srv, path):
    return request(srv, "GET", path)


def infer(srv, doc, model="mlp", path=None):
    body = json.dumps(doc).encode() if not isinstance(doc, bytes) else doc
    return request(srv, "POST", path or f"/v2/models/{model}/infer", body,
                   {"Content-Type": "application/json"})


def x_rows(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 16, generator=g)


def want(x):
    with torch.no_grad():
        return mlp()(x).numpy()


def json_input(x, nested=False):
    data = x.tolist() if nested else x.flatten().tolist()
    return {"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": data}


def still_serves(srv):
    """A good infer answers, right after whatever came before."""
    x = x_rows(2, seed=7)
    code, _, body = infer(srv, {"inputs": [json_input(x)]})
    assert code == 200, body
    out = json.loads(body)["outputs"][0]
    np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(out["shape"]), want(x),
                               atol=TOL, rtol=TOL)


def error_of(code_body, code):
    got, _, body = code_body
    assert got == code, (got, body)
    doc = json.loads(body)
    assert set(doc) == {"error"}, doc
    return doc["error"]


def metric(srv, line):
    text = get(srv, "/metrics")[2].decode()
    m = re.search("^" + re.escape(line) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def wait_for(srv, line, value):
    """Until the metric line reads value (20 s at most)."""
    deadline = time.monotonic() + 20
    while metric(srv, line) != value:
        assert time.monotonic() < deadline, (line, metric(srv, line))
        time.sleep(0.02)


def test_oip_metadata_and_health():
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)}) as srv:
            code, hdr, body = get(srv, "/v2")
            assert code == 200 and hdr["Content-Type"] == "application/json", (code, hdr)
            doc = json.loads(body)
            assert doc["name"] == "grove" and doc["version"], doc
            assert "binary_tensor_data" in doc["extensions"], doc
            assert get(srv, "/v2/health/live")[0] == 200
            assert get(srv, "/v2/health/ready")[0] == 200
            for path in ("/v2/models/mlp", "/v2/models/mlp/versions/1"):
                code, _, body = get(srv, path)
                assert code == 200, body
                doc = json.loads(body)
                assert {k: doc[k] for k in ("name", "versions", "platform", "inputs")} == {
                    "name": "mlp", "versions": ["1"], "platform": "grove",
                    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 16]}]}, doc
                (out,) = doc["outputs"]
                assert out["datatype"] == "FP32" and out["shape"] == [-1, 4], doc
            assert get(srv, "/v2/models/mlp/ready")[0] == 200
            assert get(srv, "/v2/models/mlp/versions/1/ready")[0] == 200
            code, _, body = get(srv, "/v2/models/mlp/config")
            assert code == 200, body
            cfg = json.loads(body)
            assert cfg["name"] == "mlp" and cfg["max_batch_size"] == 64, cfg
            assert cfg["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [16]}], cfg
            assert cfg["output"][0]["data_type"] == "TYPE_FP32", cfg
            assert cfg["output"][0]["dims"] == [4], cfg
            # HEAD answers as GET, without the body.
            code, hdr, body = request(srv, "HEAD", "/v2/models/mlp")
            assert code == 200 and body == b"" and int(hdr["Content-Length"]) > 0, (code, hdr)
            # Unknown model, version not serving, unknown endpoint, wrong method.
            assert "not served here (models: mlp)" in error_of(get(srv, "/v2/models/nope"), 404)
            assert "nope" in error_of(get(srv, "/v2/models/nope/ready"), 404)
            msg = error_of(get(srv, "/v2/models/mlp/versions/2"), 404)
            assert "one version at a time, now 1" in msg, msg
            error_of(get(srv, "/v2/models/mlp/versions/2/ready"), 404)
            error_of(get(srv, "/v2/models/mlp/stats"), 404)
            code, hdr, body = request(srv, "POST", "/v2/models/mlp", b"{}")
            assert code == 405 and hdr["Allow"] == "GET, HEAD", (code, hdr, body)
            code, hdr, body = get(srv, "/v2/models/mlp/infer")
            assert code == 405 and hdr["Allow"] == "POST", (code, hdr, body)
            # The admin plane is not here.
            error_of(request(srv, "POST", "/v2/repository/models/mlp/load", b"{}"), 404)
            still_serves(srv)
    finally:
        shutil.rmtree(tmp)


def test_oip_infer_json_matches_torch():
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)}) as srv:
            x = x_rows(5)
            for nested in (False, True):
                doc = {"id": "req-1", "inputs": [json_input(x, nested)]}
                code, hdr, body = infer(srv, doc)
                assert code == 200 and hdr["Content-Type"] == "application/json", body
                rep = json.loads(body)
                assert rep["model_name"] == "mlp" and rep["model_version"] == "1", rep
                assert rep["id"] == "req-1", rep
                (out,) = rep["outputs"]
                assert out["datatype"] == "FP32" and out["shape"] == [5, 4], out
                np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(5, 4),
                                           want(x), atol=TOL, rtol=TOL)
            # The version in the URL, and outputs asked for by name.
            name = json.loads(get(srv, "/v2/models/mlp")[2])["outputs"][0]["name"]
            doc = {"inputs": [json_input(x)], "outputs": [{"name": name}]}
            code, _, body = infer(srv, doc, path="/v2/models/mlp/versions/1/infer")
            assert code == 200, body
            assert "id" not in json.loads(body)
            assert metric(srv, 'grove_requests_total{model="mlp",status="OK",protocol="oip"}') == 3
            assert metric(srv, 'grove_requests_total{model="mlp",status="OK",protocol="grove"}') == 0
            assert metric(srv, 'grove_request_latency_seconds_count{model="mlp",protocol="oip"}') == 3
    finally:
        shutil.rmtree(tmp)


def binary_request(inputs, outputs=None, params=None):
    """(body, headers) of a binary tensor data request: inputs are (name,
    array) pairs sent as raw little-endian bytes after the JSON."""
    doc = {"inputs": [{"name": n, "shape": list(a.shape), "datatype": "FP32",
                       "parameters": {"binary_data_size": a.nbytes}} for n, a in inputs]}
    if outputs is not None:
        doc["outputs"] = outputs
    if params is not None:
        doc["parameters"] = params
    head = json.dumps(doc).encode()
    body = head + b"".join(a.astype("<f4").tobytes() for _, a in inputs)
    return body, {"Inference-Header-Content-Length": str(len(head)),
                  "Content-Type": "application/octet-stream"}


def split_binary(hdr, body):
    n = int(hdr["Inference-Header-Content-Length"])
    return json.loads(body[:n]), body[n:]


def test_oip_infer_binary_matches_torch():
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)}) as srv:
            x = x_rows(3, seed=3)
            a = x.numpy()
            name = json.loads(get(srv, "/v2/models/mlp")[2])["outputs"][0]["name"]
            # Binary in, binary out (request-wide binary_data_output).
            body, hdr = binary_request([("x", a)], params={"binary_data_output": True})
            code, rh, rb = request(srv, "POST", "/v2/models/mlp/infer", body, hdr)
            assert code == 200, rb
            assert rh["Content-Type"] == "application/octet-stream", rh
            doc, raw = split_binary(rh, rb)
            (out,) = doc["outputs"]
            assert out["parameters"] == {"binary_data_size": 3 * 4 * 4} and "data" not in out, out
            assert len(raw) == 48
            got = np.frombuffer(raw, "<f4").reshape(out["shape"])
            np.testing.assert_allclose(got, want(x), atol=TOL, rtol=TOL)
            # Binary in, JSON out (the output's binary_data false wins).
            body, hdr = binary_request([("x", a)], outputs=[
                {"name": name, "parameters": {"binary_data": False}}],
                params={"binary_data_output": True})
            code, rh, rb = request(srv, "POST", "/v2/models/mlp/infer", body, hdr)
            assert code == 200 and rh["Content-Type"] == "application/json", (rh, rb)
            out = json.loads(rb)["outputs"][0]
            np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(3, 4), want(x),
                                       atol=TOL, rtol=TOL)
            # JSON in, binary out for the output asked for.
            doc = {"inputs": [json_input(x)],
                   "outputs": [{"name": name, "parameters": {"binary_data": True}}]}
            code, rh, rb = infer(srv, doc)
            assert code == 200, rb
            doc, raw = split_binary(rh, rb)
            np.testing.assert_allclose(np.frombuffer(raw, "<f4").reshape(3, 4), want(x),
                                       atol=TOL, rtol=TOL)
    finally:
        shutil.rmtree(tmp)


def raw_exchange(srv, data, expect_close=True, timeout=10):
    """Sends data on a fresh connection and reads until groved closes it."""
    s = socket.create_connection(("127.0.0.1", srv.http), timeout=timeout)
    try:
        s.sendall(data)
        got = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            got += d
        return got
    finally:
        s.close()


def post_head(path, length, extra=""):
    return (f"POST {path} HTTP/1.1\r\nHost: grove\r\nContent-Length: {length}\r\n{extra}\r\n"
            ).encode()


def test_oip_errors_keep_serving():
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)}) as srv:
            x = x_rows(2)
            good = json_input(x)
            cases = [
                # (document or bytes, status, words the error must hold)
                (b'{"inputs": [', 400, "malformed JSON at line 1"),
                (b'[1, 2]', 400, "not an object"),
                ({}, 400, "inputs"),
                ({"inputs": [dict(good, name="y")]}, 400, "inputs[0] ('y'): model 'mlp' has no "
                                                          "such input ('x')"),
                ({"inputs": [dict(good, datatype="FP64")]}, 400,
                 "input 'x': expected float32 [-1, 16], got float64 [2, 16]"),
                ({"inputs": [dict(good, datatype="BYTES")]}, 400,
                 "inputs[0] ('x').datatype: 'BYTES' is not a datatype Grove has"),
                ({"inputs": [dict(good, shape=[2, 8], data=[0.0] * 16)]}, 400,
                 "input 'x': expected float32 [-1, 16], got float32 [2, 8]"),
                ({"inputs": [dict(good, shape=[3, 16])]}, 400,
                 "inputs[0] ('x').data holds 32 values, but the shape has 48 elements"),
                ({"inputs": [dict(good, data=["a"] * 32)]}, 400, "inputs[0] ('x').data holds a "
                                                                 "string"),
                ({"inputs": [dict(good, shape=[-1, 16])]}, 400, "shape[0]: dimensions are"),
                ({"inputs": [good], "outputs": [{"name": "nope"}]}, 400,
                 "outputs[0] ('nope'): model 'mlp' has no such output"),
                ({"inputs": [dict(good, shape=[0, 16], data=[])]}, 400, "has 0 rows"),
                ({"inputs": [dict(good, shape=[65, 16], data=[0.0] * 65 * 16)]}, 400,
                 "more than model 'mlp' runs at once"),
            ]
            for doc, code, words in cases:
                msg = error_of(infer(srv, doc), code)
                assert words in msg, (doc if isinstance(doc, bytes) else json.dumps(doc)[:200],
                                      msg)
                still_serves(srv)
            # A compressed body (tritonclient's request_compression_algorithm).
            msg = error_of(request(srv, "POST", "/v2/models/mlp/infer", b"\x1f\x8b\x08",
                                   {"Content-Encoding": "gzip"}), 400)
            assert "Content-Encoding 'gzip' is not supported" in msg, msg
            # Unknown model: 404 worded as the RPC's.
            msg = error_of(infer(srv, {"inputs": [good]}, model="nope"), 404)
            assert msg == "model 'nope' is not served here (models: mlp)", msg
            # A version in the URL that is not the serving one.
            msg = error_of(infer(srv, {"inputs": [good]}, path="/v2/models/mlp/versions/9/infer"),
                           404)
            assert "one version at a time" in msg, msg
            still_serves(srv)

            # Binary sizes that do not add up.
            a = x.numpy()
            body, hdr = binary_request([("x", a)])
            for extra, words in ((b"xyz", "add up to 128 bytes, but the body carries 131"),):
                code_body = request(srv, "POST", "/v2/models/mlp/infer", body + extra, hdr)
                msg = error_of(code_body, 400)
                assert words in msg, msg
            msg = error_of(request(srv, "POST", "/v2/models/mlp/infer", body[:-4], hdr), 400)
            assert "binary_data_size: 128 bytes, but only 124" in msg, msg
            bad = dict(hdr, **{"Inference-Header-Content-Length": "99999"})
            msg = error_of(request(srv, "POST", "/v2/models/mlp/infer", body, bad), 400)
            assert "Inference-Header-Content-Length: '99999'" in msg, msg
            # A binary size that fits the body but not the shape: the RPC's words.
            big = np.zeros((2, 17), np.float32)
            head = json.dumps({"inputs": [{"name": "x", "shape": [2, 16], "datatype": "FP32",
                                           "parameters": {"binary_data_size": big.nbytes}}]})
            msg = error_of(request(srv, "POST", "/v2/models/mlp/infer",
                                   head.encode() + big.tobytes(),
                                   {"Inference-Header-Content-Length": str(len(head))}), 400)
            assert "inputs[0] ('x').data: 136 bytes, but float32 [2, 16] takes 128 bytes" in msg, msg
            still_serves(srv)

            # A body over the limit: 413 from the headers, before any of it
            # is sent (the client waits for 100 Continue and never sends it).
            got = raw_exchange(srv, post_head("/v2/models/mlp/infer", LIMIT + 1,
                                              "Expect: 100-continue\r\n"))
            assert got.startswith(b"HTTP/1.1 413 "), got
            assert b"100 Continue" not in got, got
            assert f"limit of {LIMIT} bytes".encode() in got, got
            msg = error_of(request(srv, "POST", "/v2/models/mlp/infer", b" " * (LIMIT + 1)), 413)
            assert f"request body of {LIMIT + 1} bytes is over this server's limit" in msg, msg
            still_serves(srv)
            # Chunked bodies are refused with 411; a bad Content-Length is 400.
            got = raw_exchange(srv, b"POST /v2/models/mlp/infer HTTP/1.1\r\n"
                                    b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 411 "), got
            assert b'{"error":"Transfer-Encoding is not supported' in got, got
            got = raw_exchange(srv, post_head("/v2/models/mlp/infer", "12x"))
            assert got.startswith(b"HTTP/1.1 400 ") and b"Content-Length" in got, got
            got = raw_exchange(srv, b"POST /v2/models/mlp/infer HTTP/1.1\r\nno colon here\r\n\r\n")
            assert got.startswith(b"HTTP/1.1 400 ") and b"malformed header" in got, got
            still_serves(srv)
            # A client that sends half a body and goes away costs nothing.
            s = socket.create_connection(("127.0.0.1", srv.http))
            s.sendall(post_head("/v2/models/mlp/infer", 1000) + b'{"inputs"')
            s.close()
            still_serves(srv)
            # Every refused infer is counted under protocol="oip".
            n = metric(srv, 'grove_requests_total{model="mlp",status="INVALID_ARGUMENT",'
                            'protocol="oip"}')
            assert n is not None and n >= len(cases) + 4, n
            assert metric(srv, 'grove_requests_total{model="",status="NOT_FOUND",'
                               'protocol="oip"}') == 1
    finally:
        shutil.rmtree(tmp)


def test_oip_keepalive_pipelining_and_continue():
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)}) as srv:
            # Six pipelined infers of 40 rows (about 13 KB of JSON each, more
            # than the connection buffers while one is computed: groved stops
            # reading until it is answered), then a GET that closes: all
            # answered, in order.
            rows = [x_rows(40, seed=i) for i in range(6)]
            reqs = b""
            for i, x in enumerate(rows):
                body = json.dumps({"id": f"p{i}", "inputs": [json_input(x)]}).encode()
                assert len(body) > 8192
                reqs += post_head("/v2/models/mlp/infer", len(body)) + body
            got = raw_exchange(srv, reqs + b"GET /v2/health/live HTTP/1.1\r\n"
                                           b"Connection: close\r\n\r\n")
            assert got.count(b"HTTP/1.1 200 OK") == 7, got[:400]
            bodies = [json.loads(b) for b in re.findall(rb'(\{"model_name".*?\]\}\]\})', got)]
            assert [b["id"] for b in bodies] == [f"p{i}" for i in range(6)], bodies
            for b, x in zip(bodies, rows):
                np.testing.assert_allclose(np.array(b["outputs"][0]["data"], np.float32)
                                           .reshape(40, 4), want(x), atol=TOL, rtol=TOL)
            rows = [r[:1] for r in rows]
            # Expect: 100-continue: 100 first, the answer after the body.
            body = json.dumps({"inputs": [json_input(rows[0])]}).encode()
            s = socket.create_connection(("127.0.0.1", srv.http), timeout=10)
            try:
                s.sendall(post_head("/v2/models/mlp/infer", len(body), "Expect: 100-continue\r\n"))
                assert s.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
                s.sendall(body)
                got = b""
                while b'"outputs"' not in got:
                    d = s.recv(65536)
                    assert d, got
                    got += d
                assert got.startswith(b"HTTP/1.1 200 OK") and b"keep-alive" in got, got
            finally:
                s.close()
            # curl: the README's infer, then two infers on one connection.
            if shutil.which("curl"):
                path = os.path.join(tmp, "req.json")
                with open(path, "wb") as f:
                    f.write(body)
                url = f"http://127.0.0.1:{srv.http}/v2/models/mlp/infer"
                r = subprocess.run(["curl", "-sS", "-v", "-H", "Content-Type: application/json",
                                    "-H", "Expect: 100-continue", "--data-binary", "@" + path,
                                    url, "--next", "-sS", "--data-binary", "@" + path, url],
                                   capture_output=True, text=True, timeout=30)
                assert r.returncode == 0, r.stderr
                assert "100 Continue" in r.stderr, r.stderr
                assert re.search(r"[Rr]e-?using existing connection", r.stderr), r.stderr
                outs = re.findall(r'\{"model_name".*?\]\}\]\}', r.stdout)
                assert len(outs) == 2, r.stdout
                np.testing.assert_allclose(
                    np.array(json.loads(outs[0])["outputs"][0]["data"], np.float32),
                    want(rows[0])[0], atol=TOL, rtol=TOL)
    finally:
        shutil.rmtree(tmp)


def test_oip_batches_with_the_rpc():
    """OIP infers join the model's queue and ride in one batch with NNG
    predicts: one worker, held 1.5 s per batch, one request to make it busy,
    then four OIP infers and four `grove predict`s queued while it is."""
    tmp = tempfile.mkdtemp()
    try:
        with Groved(tmp, {"mlp": export_mlp(tmp)},
                    extra=["--workers", "1", "--test-batch-delay-ms", "1500"]) as srv:
            np.save(os.path.join(tmp, "x.npy"), x_rows(1).numpy())
            results = []

            def oip():
                results.append(infer(srv, {"inputs": [json_input(x_rows(1))]})[0])

            def rpc():
                r = subprocess.run([GROVE, "--server", srv.tcp, "predict", "mlp",
                                    os.path.join(tmp, "x.npy")], capture_output=True, text=True,
                                   timeout=60)
                results.append(200 if r.returncode == 0 else r.stderr)

            first = threading.Thread(target=oip)
            first.start()
            wait_for(srv, "grove_inflight_requests", 1)  # the first batch is computing
            ts = [threading.Thread(target=f) for f in (oip, rpc) * 4]
            for t in ts:
                t.start()
            wait_for(srv, 'grove_queue_depth{model="mlp"}', 8)  # all eight wait behind it
            for t in [first] + ts:
                t.join(60)
            assert results == [200] * 9, results
            # Two batches: the first request alone, then all eight together.
            assert metric(srv, 'grove_batch_size_count{model="mlp"}') == 2, \
                get(srv, "/metrics")[2].decode()
            assert metric(srv, 'grove_batch_size_sum{model="mlp"}') == 9
            assert metric(srv, 'grove_requests_total{model="mlp",status="OK",protocol="oip"}') == 5
            assert metric(srv, 'grove_requests_total{model="mlp",status="OK",protocol="grove"}') == 4
    finally:
        shutil.rmtree(tmp)


def test_oip_not_ready_and_draining():
    tmp = tempfile.mkdtemp()
    try:
        broken = os.path.join(tmp, "broken")
        os.makedirs(broken)
        with open(os.path.join(broken, "model.json"), "w") as f:
            f.write("{not json")
        srv = Groved(tmp, {"mlp": export_mlp(tmp), "broken": broken},
                     extra=["--workers", "1", "--test-batch-delay-ms", "1500"], wait_ready=False)
        try:
            # A model that did not load: 503 everywhere it is asked for.
            msg = error_of(get(srv, "/v2/health/ready"), 503)
            assert "broken" in msg, msg
            error_of(get(srv, "/v2/models/broken/ready"), 503)
            error_of(get(srv, "/v2/models/broken"), 503)
            msg = error_of(infer(srv, {"inputs": []}, model="broken"), 503)
            assert "model 'broken' is not loaded" in msg, msg
            assert get(srv, "/v2/models/mlp/ready")[0] == 200
            # Draining: what was accepted is answered, new infers get 503.
            x = x_rows(1)
            done = []
            t = threading.Thread(target=lambda: done.append(infer(srv, {"inputs": [json_input(x)]})))
            t.start()
            wait_for(srv, "grove_inflight_requests", 1)  # accepted, held in its batch
            srv.p.send_signal(signal.SIGTERM)
            wait_for(srv, "grove_draining", 1)
            msg = error_of(infer(srv, {"inputs": [json_input(x)]}), 503)
            assert "shutting down" in msg, msg
            error_of(get(srv, "/v2/health/ready"), 503)
            error_of(get(srv, "/v2/models/mlp/ready"), 503)
            assert get(srv, "/v2/health/live")[0] == 200
            t.join(30)
            code, _, body = done[0]
            assert code == 200, body
            np.testing.assert_allclose(np.array(json.loads(body)["outputs"][0]["data"],
                                                np.float32), want(x)[0], atol=TOL, rtol=TOL)
            assert srv.p.wait(timeout=30) == 0, srv.text()
        finally:
            srv.stop()
    finally:
        shutil.rmtree(tmp)


def test_oip_integer_inputs_and_data_forms():
    """INT64 indices into an Embedding, as JSON (flat, nested) and binary;
    values the datatype cannot hold are refused naming the value; numbers
    and other JSON forms of the same tensor give the same answer."""
    tmp = tempfile.mkdtemp()
    try:
        torch.manual_seed(5)
        emb = nn.Sequential(nn.Embedding(10, 3)).eval()
        d = os.path.join(tmp, "emb")
        grove_export.export(emb, d, example_input=torch.zeros(1, 4, dtype=torch.int64))
        with Groved(tmp, {"emb": d, "mlp": export_mlp(tmp)}) as srv:
            meta = json.loads(get(srv, "/v2/models/emb")[2])
            assert meta["inputs"][0]["datatype"] == "INT64", meta
            idx = torch.tensor([[1, 2, 3, 9], [0, 0, 5, 7]])
            with torch.no_grad():
                ref = emb(idx).numpy()
            name = meta["inputs"][0]["name"]
            for data in (idx.flatten().tolist(), idx.tolist()):
                doc = {"inputs": [{"name": name, "shape": [2, 4], "datatype": "INT64",
                                   "data": data}]}
                code, _, body = infer(srv, doc, model="emb")
                assert code == 200, body
                out = json.loads(body)["outputs"][0]
                assert out["shape"] == [2, 4, 3], out
                np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 4, 3),
                                           ref, atol=TOL, rtol=TOL)
            head = json.dumps({"inputs": [{"name": name, "shape": [2, 4], "datatype": "INT64",
                                           "parameters": {"binary_data_size": 64}}]}).encode()
            code, _, body = request(srv, "POST", "/v2/models/emb/infer",
                                    head + idx.numpy().astype("<i8").tobytes(),
                                    {"Inference-Header-Content-Length": str(len(head))})
            assert code == 200, body
            out = json.loads(body)["outputs"][0]
            np.testing.assert_allclose(np.array(out["data"], np.float32).reshape(2, 4, 3), ref,
                                       atol=TOL, rtol=TOL)
            for data, words in (([1, 2, 3.5, 0] * 2, "value 2: an integer datatype takes integers"),
                                ([1, 2, True, 0] * 2, "value 2: an integer datatype takes integers"),
                                ([1, 2, 3, 0, 1, 2, 3] + ["x"], "holds a string")):
                doc = {"inputs": [{"name": name, "shape": [2, 4], "datatype": "INT64",
                                   "data": data}]}
                msg = error_of(infer(srv, doc, model="emb"), 400)
                assert words in msg, msg
            doc = {"inputs": [{"name": name, "shape": [1, 4], "datatype": "INT32",
                               "data": [1, 2, 2 ** 33, 0]}]}
            msg = error_of(infer(srv, doc, model="emb"), 400)
            assert "value 2: a value is out of the datatype's range" in msg, msg
            # FP32 data written as integers, and nested one level more
            # than needed: the same numbers, the same answer.
            x = torch.arange(32, dtype=torch.float32).reshape(2, 16) / 8
            ints = {"name": "x", "shape": [2, 16], "datatype": "FP32",
                    "data": [[int(v * 8) / 8 if v * 8 % 8 else int(v) for v in row]
                             for row in x.tolist()]}
            code, _, body = infer(srv, {"inputs": [ints]})
            assert code == 200, body
            np.testing.assert_allclose(np.array(json.loads(body)["outputs"][0]["data"],
                                                np.float32).reshape(2, 4), want(x),
                                       atol=TOL, rtol=TOL)
            # A malformed number inside a data array: jansson's words, with
            # the position in the text that was sent.
            bad = b'{"inputs":[{"name":"x","shape":[1,16],"datatype":"FP32","data":[1,2,03]}]}'
            msg = error_of(infer(srv, bad), 400)
            assert msg.startswith("malformed JSON at line 1, column"), msg
            col = int(re.search(r"column (\d+)", msg).group(1))
            assert abs(col - bad.index(b"03")) <= 3, (col, msg)
            still_serves(srv)
    finally:
        shutil.rmtree(tmp)


def test_oip_queue_full_and_deadline():
    """The batcher's answers reach OIP clients as HTTP codes: a full queue
    429, a request past parameters.timeout 504 (never computed)."""
    tmp = tempfile.mkdtemp()
    try:
        d = os.path.join(tmp, "mlp")
        grove_export.export(mlp(), d, example_input=torch.zeros(1, 16),
                            batching={"max_queue_size": 1})
        with Groved(tmp, {"mlp": d}, extra=["--workers", "1",
                                             "--test-batch-delay-ms", "4000"]) as srv:
            x = x_rows(1)
            results = {}

            def send(key, doc):
                results[key] = infer(srv, doc)

            busy = threading.Thread(target=send, args=("busy", {"inputs": [json_input(x)]}))
            busy.start()
            # Computing, held 4 s: the two requests below must arrive meanwhile, on a
            # loaded machine too (1.5 s was not always enough).
            wait_for(srv, "grove_inflight_requests", 1)
            # Queued behind it with a 100 ms deadline: expired when its turn comes.
            late = threading.Thread(target=send, args=("late", {
                "inputs": [json_input(x)], "parameters": {"timeout": 100000}}))
            late.start()
            wait_for(srv, 'grove_queue_depth{model="mlp"}', 1)
            msg = error_of(infer(srv, {"inputs": [json_input(x)]}), 429)
            assert "queue full" in msg, msg
            busy.join(30)
            late.join(30)
            assert results["busy"][0] == 200, results["busy"]
            msg = error_of(results["late"], 504)
            assert "past its timeout; it was not computed" in msg, msg
            msg = error_of(infer(srv, {"inputs": [json_input(x)], "parameters": {"timeout": -1}}),
                           400)
            assert "parameters.timeout" in msg, msg
            assert metric(srv, 'grove_requests_total{model="mlp",status="DEADLINE_EXCEEDED",'
                               'protocol="oip"}') == 1
            assert metric(srv, 'grove_requests_total{model="mlp",status="RESOURCE_EXHAUSTED",'
                               'protocol="oip"}') == 1
            still_serves(srv)
    finally:
        shutil.rmtree(tmp)
