"""grove: a Python client of groved, Grove's model server (docs/python.md).

    import numpy as np, grove
    with grove.Client("tcp://127.0.0.1:7700") as c:
        out = c.predict("digits", np.load("examples/digits/sample.npy"))
        print(out["y"].argmax(1), out.version)
        c.reload("digits")
        hook = c.add_hook("digits", "*")
        with grove.watch("tcp://127.0.0.1:7702", "digits", count=3) as w:
            for ev in w:
                print(ev["module"], ev["mean"])
        c.remove_hook(hook["id"])
        c.export("digits", "/tmp/digits.safetensors", overwrite=True)

A thin layer over libgrove-client (include/grove/client.h) through ctypes:
the same wire, the same retries, the same messages as the `grove` command.
NumPy arrays go in and come out (copied, so they are the caller's).  The
library is found at $GROVE_CLIENT_LIB, else build/current/libgrove-client.so
of the repository this file sits in (`make pyclient` builds it), else
libgrove-client.so on the loader's path.

Every failure raises GroveError, whose .status is the grove_status name
("NOT_FOUND", "UNAVAILABLE", ...), .code its value, and .local True when the
client side found it (no connection, no reply in time) rather than the
server.  A Client may be used from several threads at once.
"""
import ctypes as C
import os

import numpy as np

__all__ = ["Client", "GroveError", "watch", "Watch", "Prediction", "library_path"]

MAX_DIMS = 8
ERR_MSG_MAX = 2048

# grove_dtype (include/grove/tensor.h) <-> NumPy.  bfloat16 has no NumPy
# type: such outputs come back as float32 (exactly).
_DTYPES = {0: np.float32, 1: np.float16, 3: np.float64, 4: np.int64, 5: np.int32, 6: np.uint8,
           7: np.bool_, 8: np.int8, 9: np.int16}
_BF16 = 2
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}


class _Err(C.Structure):
    _fields_ = [("code", C.c_int), ("msg", C.c_char * ERR_MSG_MAX)]


class _Tensor(C.Structure):
    _fields_ = [("dtype", C.c_int), ("ndim", C.c_int), ("shape", C.c_int64 * MAX_DIMS),
                ("strides", C.c_int64 * MAX_DIMS), ("data", C.c_void_p),
                ("storage", C.c_void_p), ("refcount", C.c_int)]


class _Opts(C.Structure):
    _fields_ = [("default_timeout_ms", C.c_int), ("admin_url", C.c_char_p),
                ("admin_token", C.c_char_p)]


class _Prediction(C.Structure):
    _fields_ = [("noutputs", C.c_size_t), ("outputs", C.POINTER(C.POINTER(_Tensor))),
                ("names", C.POINTER(C.c_char_p)), ("version", C.c_int64),
                ("queue_us", C.c_uint64), ("compute_us", C.c_uint64),
                ("batch_rows", C.c_uint32)]


class _IoSpec(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dtype", C.c_int), ("ndim", C.c_int),
                ("shape", C.c_int64 * MAX_DIMS)]


class _Batching(C.Structure):
    _fields_ = [("max_batch_size", C.c_int64), ("max_queue_delay_us", C.c_int64),
                ("max_queue_size", C.c_int64)]


class _ModelInfo(C.Structure):
    _fields_ = [("name", C.c_char_p), ("dir", C.c_char_p), ("weights_path", C.c_char_p),
                ("ready", C.c_bool), ("error", C.c_char_p), ("version", C.c_int64),
                ("ninputs", C.c_size_t), ("noutputs", C.c_size_t),
                ("inputs", C.POINTER(_IoSpec)), ("outputs", C.POINTER(_IoSpec)),
                ("param_count", C.c_int64), ("weight_bytes", C.c_uint64),
                ("batching", _Batching), ("queue_depth", C.c_uint64)]


class _ServerStatus(C.Structure):
    _fields_ = [("server_version", C.c_char_p), ("protocol", C.c_uint32), ("ready", C.c_bool),
                ("draining", C.c_bool), ("uptime_ms", C.c_uint64), ("workers", C.c_uint32),
                ("blas_threads", C.c_uint32), ("inflight", C.c_uint64),
                ("nmodels", C.c_size_t), ("models", C.POINTER(_ModelInfo)),
                ("nlisten", C.c_size_t), ("listen_urls", C.POINTER(C.c_char_p)),
                ("nadmin", C.c_size_t), ("admin_urls", C.POINTER(C.c_char_p))]


class _ReloadOpts(C.Structure):
    _fields_ = [("checkpoint", C.c_char_p), ("model_dir", C.c_char_p),
                ("non_strict", C.c_bool), ("in_place", C.c_bool)]


class _ReloadResult(C.Structure):
    _fields_ = [("version", C.c_int64), ("previous_version", C.c_int64),
                ("weights_path", C.c_char_p), ("dir", C.c_char_p),
                ("duration_us", C.c_uint64), ("pause_us", C.c_uint64), ("in_place", C.c_bool),
                ("n_missing", C.c_size_t), ("n_unexpected", C.c_size_t),
                ("n_errors", C.c_size_t), ("missing", C.POINTER(C.c_char_p)),
                ("unexpected", C.POINTER(C.c_char_p)), ("errors", C.POINTER(C.c_char_p))]


class _ExportOpts(C.Structure):
    _fields_ = [("prefix", C.c_char_p), ("archive_name", C.c_char_p),
                ("chunk_bytes", C.c_size_t)]


class _ExportInfo(C.Structure):
    _fields_ = [("version", C.c_int64), ("total_size", C.c_uint64), ("tensors", C.c_uint32)]


class _HookSpec(C.Structure):
    _fields_ = [("model", C.c_char_p), ("pattern", C.c_char_p), ("kind", C.c_int),
                ("every", C.c_uint32), ("sample_rate", C.c_double),
                ("histogram_bins", C.c_uint32), ("histogram_min", C.c_double),
                ("histogram_max", C.c_double), ("per_feature", C.c_bool)]


class _HookInfo(C.Structure):
    _fields_ = [("id", C.c_uint64), ("model", C.c_char_p), ("pattern", C.c_char_p),
                ("kind", C.c_int), ("every", C.c_uint32), ("sample_rate", C.c_double),
                ("histogram_bins", C.c_uint32), ("histogram_min", C.c_double),
                ("histogram_max", C.c_double), ("per_feature", C.c_bool),
                ("nmodules", C.c_size_t), ("modules", C.POINTER(C.c_char_p)),
                ("version", C.c_int64), ("events_published", C.c_uint64),
                ("events_dropped", C.c_uint64), ("note", C.c_char_p)]


class _HookEvent(C.Structure):
    _fields_ = [("model", C.c_char_p), ("module", C.c_char_p), ("version", C.c_int64),
                ("hook_id", C.c_uint64), ("kind", C.c_int), ("batches", C.c_uint64),
                ("rows", C.c_uint64), ("count", C.c_uint64), ("mean", C.c_double),
                ("std", C.c_double), ("min", C.c_double), ("max", C.c_double),
                ("abs_mean", C.c_double), ("zero_fraction", C.c_double),
                ("nan_count", C.c_uint64), ("inf_count", C.c_uint64), ("nbins", C.c_size_t),
                ("histogram", C.POINTER(C.c_uint64)), ("histogram_min", C.c_double),
                ("histogram_max", C.c_double), ("histogram_below", C.c_uint64),
                ("histogram_above", C.c_uint64), ("nfeatures", C.c_size_t),
                ("feature_mean", C.POINTER(C.c_double)),
                ("feature_std", C.POINTER(C.c_double)), ("start_unix_us", C.c_int64),
                ("end_unix_us", C.c_int64), ("sequence", C.c_uint64), ("worker", C.c_uint32),
                ("ndim", C.c_int), ("shape", C.c_int64 * MAX_DIMS)]


_KINDS = {"forward": 0, "forward_pre": 1}
_KIND_NAMES = {v: k for k, v in _KINDS.items()}


def library_path():
    """Where the shared library is looked for first."""
    env = os.environ.get("GROVE_CLIENT_LIB")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "build", "current", "libgrove-client.so")


_lib = None


def _load():
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    try:
        lib = C.CDLL(path if os.path.exists(path) else "libgrove-client.so")
    except OSError as e:
        raise ImportError(f"grove: cannot load libgrove-client.so ({path}: {e}); "
                          "`make pyclient` builds it, or set GROVE_CLIENT_LIB") from None
    P, E = C.c_void_p, C.POINTER(_Err)
    sig = {
        "grove_client_open": (C.c_int, [C.POINTER(C.c_char_p), C.c_size_t, C.POINTER(_Opts),
                                        C.POINTER(P), E]),
        "grove_client_close": (None, [P]),
        "grove_client_predict": (C.c_int, [P, C.c_char_p, C.POINTER(_Tensor), C.c_size_t,
                                           C.c_int, C.POINTER(_Prediction), E]),
        "grove_prediction_fini": (None, [C.POINTER(_Prediction)]),
        "grove_client_status": (C.c_int, [P, C.c_int, C.POINTER(C.POINTER(_ServerStatus)), E]),
        "grove_client_model_info": (C.c_int, [P, C.c_char_p, C.c_int,
                                              C.POINTER(C.POINTER(_ModelInfo)), E]),
        "grove_model_info_free": (None, [C.POINTER(_ModelInfo)]),
        "grove_server_status_free": (None, [C.POINTER(_ServerStatus)]),
        "grove_client_reload": (C.c_int, [P, C.c_char_p, C.POINTER(_ReloadOpts), C.c_int,
                                          C.POINTER(_ReloadResult), E]),
        "grove_reload_result_fini": (None, [C.POINTER(_ReloadResult)]),
        "grove_client_export_file": (C.c_int, [P, C.c_char_p, C.c_char_p, C.c_bool,
                                               C.POINTER(_ExportOpts), C.c_int,
                                               C.POINTER(_ExportInfo), E]),
        "grove_client_register_hook": (C.c_int, [P, C.POINTER(_HookSpec), C.c_int,
                                                 C.POINTER(C.c_uint64),
                                                 C.POINTER(C.POINTER(_HookInfo)), E]),
        "grove_client_remove_hook": (C.c_int, [P, C.c_uint64, C.c_int,
                                               C.POINTER(C.POINTER(_HookInfo)), E]),
        "grove_client_list_hooks": (C.c_int, [P, C.c_char_p, C.c_int,
                                              C.POINTER(C.POINTER(_HookInfo)),
                                              C.POINTER(C.c_size_t), E]),
        "grove_hook_info_free": (None, [C.POINTER(_HookInfo)]),
        "grove_hook_infos_free": (None, [C.POINTER(_HookInfo), C.c_size_t]),
        "grove_watch_open": (C.c_int, [C.c_char_p, C.c_char_p, C.c_char_p, C.POINTER(P), E]),
        "grove_watch_next": (C.c_int, [P, C.c_int, C.POINTER(_HookEvent), E]),
        "grove_hook_event_fini": (None, [C.POINTER(_HookEvent)]),
        "grove_watch_close": (None, [P]),
        "grove_client_failed_locally": (C.c_bool, [C.c_int, E]),
        "grove_status_name": (C.c_char_p, [C.c_int]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype, f.argtypes = res, args
    _lib = lib
    return lib


class GroveError(Exception):
    """A call that failed: .status (name), .code (grove_status), .local."""

    def __init__(self, code, message, local):
        self.code = code
        self.status = _load().grove_status_name(code).decode()
        self.local = local
        self.message = message
        super().__init__(f"{self.status}: {message}")


def _check(code, err):
    if code != 0:
        msg = err.msg.decode(errors="replace")
        raise GroveError(code, msg, bool(_lib.grove_client_failed_locally(code, C.byref(err))))


def _b(s):
    return None if s is None else os.fsencode(s) if isinstance(s, os.PathLike) else s.encode()


def _s(b):
    return b.decode(errors="replace") if b is not None else None


def _strs(arr, n):
    return [_s(arr[i]) for i in range(n)]


def _array_of(t):
    """A NumPy copy of a grove_tensor (contiguous, as the client makes them)."""
    shape = tuple(t.shape[i] for i in range(t.ndim))
    n = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if t.dtype == _BF16:
        raw = np.ctypeslib.as_array(C.cast(t.data, C.POINTER(C.c_uint16)), (n,)) if n else \
            np.empty(0, np.uint16)
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(shape)
    dt = np.dtype(_DTYPES[t.dtype])
    if n == 0:
        return np.empty(shape, dt)
    buf = (C.c_char * (n * dt.itemsize)).from_address(t.data)
    return np.frombuffer(buf, dtype=dt).reshape(shape).copy()


def _spec_dict(s):
    return {"name": _s(s.name), "dtype": np.dtype(_DTYPES.get(s.dtype, np.float32)).name
            if s.dtype != _BF16 else "bfloat16", "shape": [s.shape[i] for i in range(s.ndim)]}


def _model_dict(m):
    return {"name": _s(m.name), "dir": _s(m.dir), "weights_path": _s(m.weights_path),
            "ready": bool(m.ready), "error": _s(m.error), "version": m.version,
            "inputs": [_spec_dict(m.inputs[i]) for i in range(m.ninputs)],
            "outputs": [_spec_dict(m.outputs[i]) for i in range(m.noutputs)],
            "param_count": m.param_count, "weight_bytes": m.weight_bytes,
            "batching": {"max_batch_size": m.batching.max_batch_size,
                         "max_queue_delay_us": m.batching.max_queue_delay_us,
                         "max_queue_size": m.batching.max_queue_size},
            "queue_depth": m.queue_depth}


def _hook_dict(h):
    d = {"id": h.id, "model": _s(h.model), "pattern": _s(h.pattern),
         "kind": _KIND_NAMES.get(h.kind, h.kind), "every": h.every,
         "sample_rate": h.sample_rate, "per_feature": bool(h.per_feature),
         "modules": _strs(h.modules, h.nmodules), "version": h.version,
         "events_published": h.events_published, "events_dropped": h.events_dropped,
         "note": _s(h.note)}
    if h.histogram_bins:
        d["histogram"] = {"bins": h.histogram_bins, "min": h.histogram_min,
                          "max": h.histogram_max}
    return d


class Prediction(dict):
    """The outputs by name (in the model's order), with .version (the model
    version that computed them), .queue_us, .compute_us and .batch_rows."""
    version = queue_us = compute_us = batch_rows = 0


class Client:
    """A connection to groved, or to several replicas: urls is one URL
    ("tcp://HOST:PORT", "ipc:///PATH"), several separated by commas, or a
    list.  With several, predicts are spread over them and one that a
    replica cannot answer goes to another.

    Reload, export and hooks go to groved's admin listener: admin (a URL;
    default $GROVE_ADMIN, else tcp://127.0.0.1:7703, groved's default), with
    the admin token when groved asks for one (token, or the first line of
    token_file; default $GROVE_ADMIN_TOKEN).  The token is sent with admin
    calls only (docs/operations.md, "Security")."""

    def __init__(self, urls=None, timeout_ms=30000, admin=None, token=None, token_file=None):
        lib = _load()
        if urls is None:
            urls = os.environ.get("GROVE_SERVER") or "tcp://127.0.0.1:7700"
        if isinstance(urls, str):
            urls = [u for u in urls.split(",") if u]
        if token is None and token_file is not None:
            with open(token_file) as f:
                token = f.readline().rstrip()  # as groved reads its token file
        arr = (C.c_char_p * len(urls))(*[u.encode() for u in urls])
        err = _Err()
        handle = C.c_void_p()
        opts = _Opts(int(timeout_ms), _b(admin) if admin else None,
                     _b(token) if token is not None else None)
        _check(lib.grove_client_open(arr, len(urls), C.byref(opts), C.byref(handle),
                                     C.byref(err)), err)
        self._c = handle
        self.urls = list(urls)

    def close(self):
        if self._c:
            _lib.grove_client_close(self._c)
            self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if not self._c:
            raise ValueError("grove.Client: closed")
        return self._c

    def model_info(self, model, timeout_ms=10000):
        """One model's metadata, as status() lists it: name, inputs,
        outputs (name, dtype, shape), batching, version, ...  GroveError
        NOT_FOUND when the server has no such model."""
        mi, err = C.POINTER(_ModelInfo)(), _Err()
        _check(_lib.grove_client_model_info(self._handle(), _b(model), int(timeout_ms),
                                            C.byref(mi), C.byref(err)), err)
        try:
            return _model_dict(mi.contents)
        finally:
            _lib.grove_model_info_free(mi)

    def predict(self, model, *inputs, timeout_ms=0, **named):
        """Runs model on the inputs (NumPy arrays or anything np.asarray
        takes, one per model input, rows along dimension 0); returns a
        Prediction: {output name: array}.  The inputs come in the model's
        order, or all by name (predict("bert", ids=ids, mask=mask)), which
        asks the server for the model's input names once per model and
        client (again after a reload through this client).  float64 inputs
        are not converted: send what the model's inputs say (int64 ids, bool
        masks; docs/protocol.md)."""
        if named:
            if inputs:
                raise TypeError("grove: give the inputs all in order or all by name, not both")
            inputs = self._ordered(model, named, timeout_ms)
        arrays = [np.ascontiguousarray(x) for x in inputs]
        ts = (_Tensor * max(len(arrays), 1))()
        for i, a in enumerate(arrays):
            if a.dtype not in _CODES:
                raise TypeError(f"grove: input {i}: dtype {a.dtype} has no grove_dtype")
            if a.ndim > MAX_DIMS:
                raise ValueError(f"grove: input {i}: {a.ndim} dimensions (at most {MAX_DIMS})")
            t = ts[i]
            t.dtype, t.ndim = _CODES[a.dtype], a.ndim
            stride = 1
            for d in reversed(range(a.ndim)):
                t.shape[d] = a.shape[d]
                t.strides[d] = stride
                stride *= a.shape[d]
            t.data = a.ctypes.data
        p, err = _Prediction(), _Err()
        _check(_lib.grove_client_predict(self._handle(), _b(model), ts, len(arrays),
                                         int(timeout_ms), C.byref(p), C.byref(err)), err)
        try:
            out = Prediction()
            for i in range(p.noutputs):
                out[_s(p.names[i]) or f"output{i}"] = _array_of(p.outputs[i].contents)
            out.version, out.queue_us = p.version, p.queue_us
            out.compute_us, out.batch_rows = p.compute_us, p.batch_rows
            return out
        finally:
            _lib.grove_prediction_fini(C.byref(p))

    def status(self, timeout_ms=10000):
        """The server's status: version, ready, draining, workers, the models."""
        st, err = C.POINTER(_ServerStatus)(), _Err()
        _check(_lib.grove_client_status(self._handle(), int(timeout_ms), C.byref(st),
                                        C.byref(err)), err)
        try:
            s = st.contents
            return {"server_version": _s(s.server_version), "protocol": s.protocol,
                    "ready": bool(s.ready), "draining": bool(s.draining),
                    "uptime_ms": s.uptime_ms, "workers": s.workers,
                    "blas_threads": s.blas_threads, "inflight": s.inflight,
                    "models": [_model_dict(s.models[i]) for i in range(s.nmodels)],
                    "listen": [_s(s.listen_urls[i]) for i in range(s.nlisten)],
                    "admin_listen": [_s(s.admin_urls[i]) for i in range(s.nadmin)]}
        finally:
            _lib.grove_server_status_free(st)

    def _ordered(self, model, named, timeout_ms):
        """The arrays of named in the order of model's inputs."""
        cache = self.__dict__.setdefault("_input_names", {})
        names = cache.get(model)
        if names is None:
            info = self.model_info(model, timeout_ms=timeout_ms or 10000)
            names = cache[model] = [i["name"] for i in info["inputs"]]
        unknown = [k for k in named if k not in names]
        if unknown:
            raise TypeError(f"grove: model {model} has no input {unknown[0]!r} "
                            f"(its inputs: {', '.join(names)})")
        missing = [k for k in names if k not in named]
        if missing:
            raise TypeError(f"grove: input {missing[0]!r} of model {model} was not given "
                            f"(its inputs: {', '.join(names)})")
        return [named[k] for k in names]

    def reload(self, model, checkpoint=None, model_dir=None, non_strict=False, in_place=False,
               timeout_ms=120000):
        """Hot-reloads model (docs/operations.md, "Hot reload"); returns once
        the new version serves.  checkpoint and model_dir are paths on the
        server's machine (made absolute here).  A checkpoint that does not
        fit raises GroveError with .missing, .unexpected and .errors."""
        opts = _ReloadOpts(_b(os.path.abspath(checkpoint)) if checkpoint else None,
                           _b(os.path.abspath(model_dir)) if model_dir else None,
                           bool(non_strict), bool(in_place))
        self.__dict__.get("_input_names", {}).pop(model, None)  # a new model dir may rename them
        r, err = _ReloadResult(), _Err()
        code = _lib.grove_client_reload(self._handle(), _b(model), C.byref(opts),
                                        int(timeout_ms), C.byref(r), C.byref(err))
        try:
            res = {"version": r.version, "previous_version": r.previous_version,
                   "weights_path": _s(r.weights_path), "dir": _s(r.dir),
                   "duration_us": r.duration_us, "pause_us": r.pause_us,
                   "in_place": bool(r.in_place)}
            lists = {"missing": _strs(r.missing, r.n_missing),
                     "unexpected": _strs(r.unexpected, r.n_unexpected),
                     "errors": _strs(r.errors, r.n_errors)}
        finally:
            _lib.grove_reload_result_fini(C.byref(r))
        try:
            _check(code, err)
        except GroveError as e:
            e.missing, e.unexpected, e.errors = lists["missing"], lists["unexpected"], \
                lists["errors"]
            e.version = res["version"]
            raise
        return res

    def export(self, model, path, overwrite=False, prefix=None, timeout_ms=60000):
        """Writes the state_dict model serves now to path (.safetensors, or
        .pt/.pth/.bin for torch.save), all from one version; returns
        {"version", "total_size", "tensors", "path"}."""
        info, err = _ExportInfo(), _Err()
        opts = _ExportOpts(_b(prefix), None, 0)
        _check(_lib.grove_client_export_file(self._handle(), _b(model), _b(os.fspath(path)),
                                             bool(overwrite), C.byref(opts), int(timeout_ms),
                                             C.byref(info), C.byref(err)), err)
        return {"version": info.version, "total_size": info.total_size,
                "tensors": info.tensors, "path": os.fspath(path)}

    def add_hook(self, model, pattern, kind="forward", every=1, sample_rate=1.0,
                 histogram=None, per_feature=False, timeout_ms=10000):
        """Registers a forward hook (docs/telemetry.md); histogram is
        (bins, min, max) or None.  Returns the hook as a dict ("id",
        "modules" matched, ...)."""
        bins, lo, hi = histogram if histogram else (0, 0.0, 0.0)
        spec = _HookSpec(_b(model), _b(pattern), _KINDS[kind], int(every), float(sample_rate),
                         int(bins), float(lo), float(hi), bool(per_feature))
        info, hid, err = C.POINTER(_HookInfo)(), C.c_uint64(), _Err()
        _check(_lib.grove_client_register_hook(self._handle(), C.byref(spec), int(timeout_ms),
                                               C.byref(hid), C.byref(info), C.byref(err)), err)
        try:
            return _hook_dict(info.contents)
        finally:
            _lib.grove_hook_info_free(info)

    def hooks(self, model=None, timeout_ms=10000):
        """The hooks of model (None: of every model), in registration order."""
        arr, n, err = C.POINTER(_HookInfo)(), C.c_size_t(), _Err()
        _check(_lib.grove_client_list_hooks(self._handle(), _b(model), int(timeout_ms),
                                            C.byref(arr), C.byref(n), C.byref(err)), err)
        try:
            return [_hook_dict(arr[i]) for i in range(n.value)]
        finally:
            _lib.grove_hook_infos_free(arr, n.value)

    def remove_hook(self, hook_id, timeout_ms=10000):
        """Removes a hook; returns it as it was."""
        info, err = C.POINTER(_HookInfo)(), _Err()
        _check(_lib.grove_client_remove_hook(self._handle(), int(hook_id), int(timeout_ms),
                                             C.byref(info), C.byref(err)), err)
        try:
            return _hook_dict(info.contents)
        finally:
            _lib.grove_hook_info_free(info)


def _event_dict(e):
    d = {"model": _s(e.model), "module": _s(e.module), "version": e.version,
         "hook_id": e.hook_id, "kind": _KIND_NAMES.get(e.kind, e.kind),
         "sequence": e.sequence, "worker": e.worker, "batches": e.batches, "rows": e.rows,
         "count": e.count, "mean": e.mean, "std": e.std, "min": e.min, "max": e.max,
         "abs_mean": e.abs_mean, "zero_fraction": e.zero_fraction,
         "nan_count": e.nan_count, "inf_count": e.inf_count,
         "shape": [e.shape[i] for i in range(e.ndim)],
         "start_unix_us": e.start_unix_us, "end_unix_us": e.end_unix_us}
    if e.nbins:
        d["histogram"] = [e.histogram[i] for i in range(e.nbins)]
        d["histogram_range"] = (e.histogram_min, e.histogram_max)
        d["histogram_below"], d["histogram_above"] = e.histogram_below, e.histogram_above
    if e.nfeatures:
        d["feature_mean"] = np.array([e.feature_mean[i] for i in range(e.nfeatures)])
        d["feature_std"] = np.array([e.feature_std[i] for i in range(e.nfeatures)])
    return d


class Watch:
    """A subscription to groved's hook events (see watch()): iterate it for
    event dicts; close() (or leaving a `with` block) closes the socket.

    Close it once the traffic it observes has quietened if you can: NNG 1.5
    (Debian 12's) can hang in nng_close on a SUB socket while messages are
    arriving (nanomsg/nng#1543)."""

    def __init__(self, url=None, model=None, module=None, count=None, timeout_s=None):
        lib = _load()
        if url is None:
            url = os.environ.get("GROVE_PUB") or "tcp://127.0.0.1:7702"
        self._w, err = C.c_void_p(), _Err()
        _check(lib.grove_watch_open(_b(url), _b(model), _b(module), C.byref(self._w),
                                    C.byref(err)), err)
        self._ms = -1 if timeout_s is None else max(1, int(timeout_s * 1000))
        self._left = count

    def __iter__(self):
        return self

    def __next__(self):
        if not self._w or self._left == 0:
            raise StopIteration
        err = _Err()
        while True:
            ev = _HookEvent()
            code = _lib.grove_watch_next(self._w, self._ms, C.byref(ev), C.byref(err))
            if code == 0:
                try:
                    d = _event_dict(ev)
                finally:
                    _lib.grove_hook_event_fini(C.byref(ev))
                if self._left is not None:
                    self._left -= 1
                return d
            name = _lib.grove_status_name(code)
            if name == b"GROVE_E_DEADLINE_EXCEEDED":
                raise StopIteration
            if name != b"GROVE_E_FORMAT":  # FORMAT: not a hook event, skipped
                _check(code, err)

    def close(self):
        if self._w:
            _lib.grove_watch_close(self._w)
            self._w = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


def watch(url=None, model=None, module=None, count=None, timeout_s=None):
    """Subscribes to hook events on groved's PUB socket (default $GROVE_PUB,
    else tcp://127.0.0.1:7702): every event, model's, or one module's.  The
    Watch it returns yields dicts (the fields of `grove watch --json`) and
    stops after count events, or when none came for timeout_s seconds (None:
    waits forever).  The socket is connected when this returns; close the
    Watch (or use `with`) when done."""
    return Watch(url, model, module, count, timeout_s)
