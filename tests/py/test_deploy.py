"""deploy/: static checks of the files an operator deploys with (no docker,
no cluster here).

- Dockerfile: multi-stage on Debian bookworm, runtime packages that exist in
  Debian (apt-cache, when its lists are present), a non-root numeric user,
  /models as a volume, HEALTHCHECK on /healthz, and a CMD whose flags groved
  accepts (it is run with them, on free ports, and must become ready).
- systemd unit: `systemd-analyze verify` (with the unit pointed at the built
  groved), the sandboxing and ExecReload asked for.
- Kubernetes: each manifest parses (PyYAML, Debian's python3-yaml) and has
  the fields its kind requires; cross references hold (Service and PDB
  selectors match the pod labels, probes name declared ports, the HPA
  targets the Deployment, every $(VAR) in the args comes from the
  ConfigMap, every flag is one groved knows, kustomization lists files
  that exist).
- Prometheus config and alerts, and the Grafana dashboard: every grove_*
  metric their queries name is one a live groved exports on /metrics.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import unittest
import urllib.request

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOY = os.path.join(ROOT, "deploy")
GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")


def yaml():
    try:
        import yaml as y
    except ImportError:
        raise unittest.SkipTest("PyYAML missing (Debian: python3-yaml)")
    return y


def groved_flags():
    r = subprocess.run([GROVED, "--help"], capture_output=True, text=True)
    return set(re.findall(r"(--[a-z][a-z-]+)", r.stdout + r.stderr))


def admin_listens(args):
    """The --admin-listen values of a groved command line."""
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--admin-listen"]


def http_get(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return r.status, r.read().decode()


def run_groved(args, http_port):
    """groved with args until /readyz answers 200; returns /metrics."""
    log = tempfile.TemporaryFile("w+")
    p = subprocess.Popen([GROVED, *args], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert p.poll() is None, "groved exited"
            try:
                if http_get(http_port, "/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "groved not ready within 30 s"
            time.sleep(0.05)
        return http_get(http_port, "/metrics")[1]
    except AssertionError:
        log.seek(0)
        raise AssertionError(log.read())
    finally:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
        rc = p.wait(timeout=30)
        log.close()
        assert rc == 0, f"groved exited {rc}"


def exported_metrics():
    """The metric families a live groved exports (its # TYPE lines)."""
    port = free_port()
    text = run_groved(["--model", f"digits={ROOT}/examples/digits", "--listen",
                       f"tcp://127.0.0.1:{free_port()}", "--http", f"127.0.0.1:{port}",
                       "--pub", f"tcp://127.0.0.1:{free_port()}",
                       "--admin-listen", f"tcp://127.0.0.1:{free_port()}"], port)
    names = set(re.findall(r"^# TYPE (grove_\w+) ", text, re.M))
    assert "grove_requests_total" in names, text
    return names


def query_metrics(expr):
    """The grove_* metric families an expression names (histogram series
    _bucket/_sum/_count map to their family)."""
    out = set()
    for m in re.findall(r"\bgrove_[a-z_]+", expr):
        out.add(re.sub(r"_(bucket|sum|count)$", "", m))
    return out


# ------------------------------------------------------------ Dockerfile

def dockerfile():
    lines, cur = [], ""
    for raw in open(os.path.join(DEPLOY, "Dockerfile")):
        s = raw.rstrip("\n")
        if not cur and (not s.strip() or s.lstrip().startswith("#")):
            continue
        if s.endswith("\\"):
            cur += s[:-1] + " "
            continue
        lines.append(cur + s)
        cur = ""
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1] if " " in ln else "")
            for ln in lines]


def test_dockerfile():
    ins = dockerfile()
    froms = [a for k, a in ins if k == "FROM"]
    assert len(froms) >= 2 and all("bookworm" in f for f in froms), froms
    stage = re.search(r"\bAS (\w+)", froms[0], re.I).group(1)
    runtime = ins[max(i for i, (k, _) in enumerate(ins) if k == "FROM"):]
    assert any(k == "COPY" and f"--from={stage}" in a for k, a in runtime)
    users = [a for k, a in runtime if k == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), users
    assert any(k == "VOLUME" and "/models" in a for k, a in runtime)
    hc = [a for k, a in runtime if k == "HEALTHCHECK"]
    assert hc and "/healthz" in hc[0] and "CMD" in hc[0], hc
    exposed = " ".join(a for k, a in runtime if k == "EXPOSE").split()
    assert {"7700", "7701", "7702"} <= set(exposed), exposed
    assert "7703" not in exposed, "the admin port is exposed"
    # The runtime packages exist in Debian (when apt has its lists).
    pkgs = []
    for k, a in runtime:
        if k == "RUN" and "apt-get install" in a:
            seg = a.split("apt-get install", 1)[1].split("&&")[0]
            pkgs += [w for w in seg.split() if not w.startswith("-")]
    assert "curl" in pkgs and "libnng1" in pkgs, pkgs
    if shutil.which("apt-cache"):
        r = subprocess.run(["apt-cache", "show", *pkgs], capture_output=True, text=True)
        if "No packages found" not in r.stderr or r.returncode == 0:
            for p in pkgs:
                assert re.search(rf"^Package: {re.escape(p)}$", r.stdout, re.M), \
                    f"Dockerfile installs {p}, which apt-cache does not know"
    # The build stage makes targets that exist.
    build = ins[:max(i for i, (k, _) in enumerate(ins) if k == "FROM")]
    made = " ".join(a for k, a in build if k == "RUN" and "make" in a)
    assert "build/release/groved" in made and "build/release/grove" in made
    # ENTRYPOINT + CMD run groved with flags it takes; tried on free ports
    # with a model repository holding the demo.
    entry = json.loads([a for k, a in runtime if k == "ENTRYPOINT"][-1])
    cmd = json.loads([a for k, a in runtime if k == "CMD"][-1])
    assert entry == ["/usr/local/bin/groved"], entry
    flags = groved_flags()
    for a in cmd:
        if a.startswith("--"):
            assert a in flags, f"CMD passes {a}, which groved does not know"
    # The admin plane: on the container's loopback only.
    assert admin_listens(cmd) == ["tcp://127.0.0.1:7703"], cmd
    with tempfile.TemporaryDirectory() as repo:
        shutil.copytree(os.path.join(ROOT, "examples", "digits"), os.path.join(repo, "digits"))
        http = free_port()
        args = list(cmd)
        sub = {"/models": repo, "tcp://0.0.0.0:7700": f"tcp://127.0.0.1:{free_port()}",
               "0.0.0.0:7701": f"127.0.0.1:{http}",
               "tcp://0.0.0.0:7702": f"tcp://127.0.0.1:{free_port()}",
               "tcp://127.0.0.1:7703": f"tcp://127.0.0.1:{free_port()}"}
        args = [sub.get(a, a) for a in args]
        assert args != cmd
        metrics = run_groved(args, http)
        assert 'grove_model_ready{model="digits"} 1' in metrics


# ------------------------------------------------------------ systemd

def test_systemd_unit():
    path = os.path.join(DEPLOY, "systemd", "groved.service")
    text = open(path).read()
    keys = {}
    for ln in text.replace("\\\n", " ").splitlines():
        if "=" in ln and not ln.startswith("#"):
            k, v = ln.split("=", 1)
            keys.setdefault(k.strip(), []).append(v.strip())
    assert keys["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    for k, v in {"DynamicUser": "yes", "ProtectSystem": "strict", "ProtectHome": "yes",
                 "NoNewPrivileges": "yes", "PrivateTmp": "yes"}.items():
        assert keys.get(k) == [v], (k, keys.get(k))
    start = keys["ExecStart"][0].split()
    flags = groved_flags()
    for a in start[1:]:
        if a.startswith("--"):
            assert a in flags, f"ExecStart passes {a}, which groved does not know"
    assert int(keys["TimeoutStopSec"][0]) > 30  # longer than groved's drain
    admin = admin_listens(start)
    assert admin and all(u.startswith("tcp://127.0.0.1:") or u.startswith("ipc://")
                         for u in admin), start
    if not shutil.which("systemd-analyze"):
        raise unittest.SkipTest("systemd-analyze missing: only the structural checks ran")
    with tempfile.TemporaryDirectory() as tmp:
        unit = os.path.join(tmp, "groved.service")
        with open(unit, "w") as f:
            f.write(text.replace("/usr/local/bin/groved", os.path.realpath(GROVED)))
        r = subprocess.run(["systemd-analyze", "verify", "--man=no", unit],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and not r.stderr.strip(), r.stderr


# ------------------------------------------------------------ Kubernetes

# Minimal schema: what each kind must hold (dotted paths).
REQUIRED = {
    "ConfigMap": ["metadata.name", "data"],
    "Deployment": ["metadata.name", "spec.replicas", "spec.selector.matchLabels",
                   "spec.template.metadata.labels", "spec.template.spec.containers"],
    "Service": ["metadata.name", "spec.selector", "spec.ports"],
    "PodDisruptionBudget": ["metadata.name", "spec.selector.matchLabels"],
    "HorizontalPodAutoscaler": ["metadata.name", "spec.scaleTargetRef", "spec.minReplicas",
                                "spec.maxReplicas", "spec.metrics"],
}
API = {"ConfigMap": "v1", "Service": "v1", "Deployment": "apps/v1",
       "PodDisruptionBudget": "policy/v1", "HorizontalPodAutoscaler": "autoscaling/v2"}


def get(doc, dotted):
    for part in dotted.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def k8s_docs():
    y = yaml()
    kdir = os.path.join(DEPLOY, "kubernetes")
    kust = y.safe_load(open(os.path.join(kdir, "kustomization.yaml")))
    docs = []
    for f in kust["resources"]:
        assert os.path.exists(os.path.join(kdir, f)), f"kustomization lists missing {f}"
        docs += [d for d in y.safe_load_all(open(os.path.join(kdir, f))) if d]
    listed = set(kust["resources"])
    on_disk = {f for f in os.listdir(kdir) if f.endswith(".yaml") and f != "kustomization.yaml"}
    assert on_disk == listed, (on_disk, listed)
    return docs


def test_kubernetes_manifests():
    docs = k8s_docs()
    by_kind = {}
    for d in docs:
        kind = d.get("kind")
        assert kind in REQUIRED, f"unexpected kind {kind}"
        assert d.get("apiVersion") == API[kind], (kind, d.get("apiVersion"))
        for path in REQUIRED[kind]:
            assert get(d, path) is not None, f"{kind} {get(d, 'metadata.name')}: no {path}"
        by_kind.setdefault(kind, []).append(d)
    assert set(by_kind) == set(REQUIRED), set(by_kind)
    (dep,), (cm,) = by_kind["Deployment"], by_kind["ConfigMap"]
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    sel = dep["spec"]["selector"]["matchLabels"]
    assert all(pod_labels.get(k) == v for k, v in sel.items())

    def matches(selector):
        return all(pod_labels.get(k) == v for k, v in selector.items())

    (c,) = dep["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"rpc": 7700, "http": 7701, "telemetry": 7702}, ports
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        hg = c[probe]["httpGet"]
        assert hg["path"] == path and hg["port"] in ports, (probe, hg)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    # args: known flags; every $(VAR) defined by the ConfigMap it reads.
    flags = groved_flags()
    assert [e["configMapRef"]["name"] for e in c["envFrom"]] == [cm["metadata"]["name"]]
    for a in c["args"]:
        if a.startswith("--"):
            assert a in flags, f"Deployment passes {a}, which groved does not know"
        for var in re.findall(r"\$\((\w+)\)", a):
            assert var in cm["data"], f"$({var}) is not in the ConfigMap"
    assert c["args"][c["args"].index("--model-repo") + 1] == \
        c["volumeMounts"][0]["mountPath"]
    # The admin plane: the pod's loopback only, so no Service can reach it.
    assert admin_listens(c["args"]) == ["tcp://127.0.0.1:7703"], c["args"]
    # A drain ends before the kubelet's SIGKILL.
    drain = int(cm["data"]["GROVED_DRAIN_TIMEOUT"])
    assert dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > drain
    for svc in by_kind["Service"]:
        assert matches(svc["spec"]["selector"]), svc["metadata"]["name"]
        for p in svc["spec"]["ports"]:
            assert p["targetPort"] in ports, p
            assert p["port"] != 7703 and p["targetPort"] not in ("admin", 7703), p
    (pdb,) = by_kind["PodDisruptionBudget"]
    assert matches(pdb["spec"]["selector"]["matchLabels"])
    assert pdb["spec"]["minAvailable"] < dep["spec"]["replicas"]
    (hpa,) = by_kind["HorizontalPodAutoscaler"]
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"]) == ("Deployment", dep["metadata"]["name"])
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    assert c["resources"]["requests"].get("cpu"), "the HPA's CPU target needs a request"


# ------------------------------------------------------------ Prometheus, Grafana

def test_prometheus_and_grafana_use_real_metrics():
    y = yaml()
    have = exported_metrics()
    prom = y.safe_load(open(os.path.join(DEPLOY, "prometheus", "prometheus.yml")))
    jobs = {j["job_name"]: j for j in prom["scrape_configs"]}
    assert jobs["grove"]["metrics_path"] == "/metrics"
    assert jobs["grove"]["static_configs"][0]["targets"] == ["127.0.0.1:7701"]
    exprs = []
    for f in prom["rule_files"]:
        rules = y.safe_load(open(os.path.join(DEPLOY, "prometheus", f)))
        for g in rules["groups"]:
            for r in g["rules"]:
                assert r["alert"] and r["expr"], r
                exprs.append(("alert " + r["alert"], r["expr"]))
    dash = json.load(open(os.path.join(DEPLOY, "grafana", "grove-dashboard.json")))
    assert dash["panels"] and dash["uid"]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert p["targets"], p["title"]
        for t in p["targets"]:
            exprs.append((f"panel '{p['title']}'", t["expr"]))
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            exprs.append((f"variable {v['name']}", v["definition"]))
    used = set()
    for where, e in exprs:
        names = query_metrics(e)
        assert names, f"{where}: no grove metric in {e}"
        missing = names - have
        assert not missing, f"{where}: {sorted(missing)} not exported by groved"
        used |= names
    # The dashboard covers the main families.
    for m in ("grove_requests_total", "grove_request_latency_seconds", "grove_batch_size",
              "grove_queue_depth", "grove_reloads_total", "grove_hook_events_dropped_total"):
        assert m in used, m
