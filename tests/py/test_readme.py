"""README.md's five-minute tour, run as written.

The test reads the first ```sh block under "## Five-minute tour" in README.md,
so a README that drifts from what the tools do fails here.  Its first line
must be `make run &`; instead of it the test starts groved itself with the
arguments of the Makefile's run target, on free ports (the defaults may be
taken by another groved on the machine): every listener whose default port
`groved --help` names gets one, and the commands are pointed at them with
GROVE_SERVER and GROVE_PUB.  `build/grove` becomes $GROVE_BIN (the
variant under test) and /tmp/ a temporary directory.  Every other line runs
as written, one `bash -c` each from the repository root (a line ending in
`&` in the background, as a shell would), and must exit 0 with the output
the tour promises.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time

from netutil import free_port

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GROVE = os.path.abspath(os.environ.get("GROVE_BIN") or os.path.join(ROOT, "build", "grove"))
GROVED = os.environ.get("GROVED_BIN") or os.path.join(os.path.dirname(os.path.realpath(GROVE)),
                                                      "groved")


def tour_lines():
    text = open(os.path.join(ROOT, "README.md")).read()
    at = text.index("## Five-minute tour")
    m = re.search(r"```sh\n(.*?)```", text[at:], re.S)
    assert m, "README.md: no ```sh block in the five-minute tour"
    lines = []
    for raw in m.group(1).splitlines():
        # Comments are "  # ..." after the command (no '#' in the commands).
        cmd = re.sub(r"\s+#.*$", "", raw).strip()
        if cmd:
            lines.append(cmd)
    return lines


def run_target_args():
    """What `make run` passes to groved (the Makefile's run recipe)."""
    mk = open(os.path.join(ROOT, "Makefile")).read()
    m = re.search(r"^run:.*?\n((?:\t.*\n)+)", mk, re.M)
    assert m, "Makefile: no run target"
    ex = re.search(r"exec \$\(GROVED_BIN\)(.*)", m.group(1))
    assert ex, "Makefile: the run target does not exec groved"
    return ex.group(1).split()


def listener_ports():
    """Every groved option whose default is a port on this machine, as
    `groved --help` says, each with a free port in the default's form:
    {"--listen": "tcp://127.0.0.1:P", "--http": "127.0.0.1:P", ...}.  The
    tour then depends on no default port, listeners added later included."""
    r = subprocess.run([GROVED, "--help"], capture_output=True, text=True, timeout=30)
    ports, flag = {}, None
    for line in (r.stdout + r.stderr).splitlines():
        m = re.match(r"\s+(--[a-z][\w-]*)", line)
        if m:
            flag = m.group(1)
        d = re.search(r"default ((?:tcp://)?127\.0\.0\.1:)\d+", line)
        if flag and d and flag not in ports:
            ports[flag] = f"{d.group(1)}{free_port()}"
    for needed in ("--listen", "--http", "--pub", "--admin-listen"):
        assert needed in ports, f"groved --help names no default port for {needed}:\n{r.stdout}"
    return ports


def groved_said(proc, log):
    """groved's state and log, for a failure's message: a tour line that
    fails or hangs is most often a groved that is not there."""
    log.flush()
    log.seek(0)
    text = log.read()
    log.seek(0, os.SEEK_END)
    state = "running" if proc.poll() is None else f"exited {proc.returncode}"
    return f"--- groved ({state}) printed:\n{text}"


def run_beside(cmd, env, proc, log, line, timeout=60):
    """Runs one tour line while watching groved: (exit status, stdout,
    stderr).  Fails at once, with groved's log, when groved exits first (the
    wait line would otherwise loop until its timeout), and on the timeout."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(["bash", "-c", cmd], cwd=ROOT, env=env, stdout=out, stderr=err,
                             text=True)
        deadline = time.monotonic() + timeout
        while p.poll() is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                p.kill()
                p.wait()
                why = "groved exited first" if proc.poll() is not None else \
                      f"still running after {timeout} s"
                raise AssertionError(f"README tour: `{line}`: {why}\n{groved_said(proc, log)}")
            time.sleep(0.05)
        out.seek(0)
        err.seek(0)
        return p.returncode, out.read(), err.read()


def test_tour_runs_as_written():
    lines = tour_lines()
    assert lines[0] == "make run &", lines[0]
    joined = "\n".join(lines)
    for needed in ("predict digits", "reload digits", "hook add digits", "watch digits",
                   "export digits"):
        assert needed in joined, f"the tour lost '{needed}'"
    with tempfile.TemporaryDirectory() as tmp:
        ports = listener_ports()
        # The tour's commands find the addresses in the environment
        # (GROVE_ADMIN: where reload, hook and export go).
        env = dict(os.environ, GROVE_SERVER=ports["--listen"], GROVE_PUB=ports["--pub"],
                   GROVE_ADMIN=ports["--admin-listen"])
        log = open(os.path.join(tmp, "groved.log"), "w+")
        proc = subprocess.Popen([GROVED, *run_target_args(),
                                 *[a for kv in ports.items() for a in kv], "--workers", "1"],
                                cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        seen = {}
        bg = []
        try:
            for line in lines[1:]:
                # /tmp first: the checkout itself may live under /tmp (CI's may).
                cmd = line.replace("/tmp/", tmp + "/").replace("build/grove ", GROVE + " ")
                # The HTTP listener's default address (curl's URL) is a free port here.
                cmd = cmd.replace("127.0.0.1:7701", ports["--http"])
                if line.endswith("&"):
                    # In the background, as a shell runs it: not waited for here.
                    bg.append(subprocess.Popen(["bash", "-c", cmd[:-1]], cwd=ROOT, env=env,
                                               stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
                    continue
                rc, out, errout = run_beside(cmd, env, proc, log, line)
                assert rc == 0, f"README tour: `{line}` exited {rc}:\n{out}\n{errout}\n" \
                                f"{groved_said(proc, log)}"
                words = line.split()
                if words[0] == "build/grove":
                    seen[" ".join(words[1:3])] = out
                elif words[0] == "curl":
                    seen["curl"] = out
        finally:
            for b in bg:
                try:
                    b.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    b.kill()
                    b.wait()
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = "timeout"
            log.seek(0)
            glog = log.read()
            log.close()
        assert rc == 0, f"groved exited {rc}:\n{glog}"

        assert "model digits: version 1, ready" in seen["status"], seen["status"]
        out = seen["predict digits"]
        assert out.startswith("y float32 [8, 10]\n"), out
        assert len(out.splitlines()) == 9, out
        if "curl" in joined:  # the OIP infer: one row of 10 logits
            (o,) = json.loads(seen["curl"])["outputs"]
            assert o["shape"] == [1, 10] and len(o["data"]) == 10, seen["curl"]
        assert "version 2 serving (was 1)" in seen["reload digits"], seen["reload digits"]
        assert seen["hook add"].strip() == "1", seen["hook add"]
        events = [json.loads(x) for x in seen["watch digits"].splitlines()]
        assert len(events) == 3, seen["watch digits"]
        for ev in events:
            assert ev["model"] == "digits" and ev["version"] == 2 and ev["rows"] == 8, ev
            assert ev["module"] and "." not in ev["module"], ev  # '*': direct children
        assert "version 2: 13 tensors" in seen["export digits"], seen["export digits"]
        assert os.path.exists(os.path.join(tmp, "digits.safetensors"))
        assert "total: 13 tensors" in seen["inspect /tmp/digits.safetensors"]
