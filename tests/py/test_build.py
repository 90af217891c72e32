"""The build asks about installed packages only after installing them.

On a fresh machine the packages scripts/deps.sh installs are not there while
make reads the makefiles; a pkg-config query (or a probe for torch or clang)
made then answers "nothing" and stays wrong for the whole run: issue #16's
groved linked without -luv.  So no $(shell ...) that asks about a package
may run while the Makefile and mk/*.mk are parsed.  The test runs `make -n
clean` (a goal whose recipe asks nothing) with a SHELL that logs every
command make hands it: with -n no recipe runs, so whatever is logged was
run at parse time.
"""
import os
import re
import shutil
import stat
import subprocess
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What depends on the installed packages.
PACKAGE_PROBES = re.compile(r"pkg-config|torch-python|python|command -v|which |dpkg|apt|"
                            r"\bclang\b|protoc")


def parse_time_commands(*args):
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "shell.log")
        sh = os.path.join(tmp, "logsh")
        with open(sh, "w") as f:
            f.write(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{log}"\nexec /bin/sh "$@"\n')
        os.chmod(sh, stat.S_IRWXU)
        r = subprocess.run(["make", "--no-print-directory", "-n", *args, f"SHELL={sh}"],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        if not os.path.exists(log):
            return []
        return open(log).read().splitlines()


def test_no_package_probe_while_parsing():
    for variant in ([], ["SAN=1"], ["SAN=thread"]):
        cmds = parse_time_commands("clean", *variant)
        probes = [c for c in cmds if PACKAGE_PROBES.search(c)]
        assert not probes, (f"make {' '.join(variant)} runs these while it reads the makefiles, "
                            f"before the dependency stamp installs anything: {probes}")


def test_deps_not_root_prints_the_command_and_fails():
    """Not root, scripts/deps.sh installs nothing: it names what is missing,
    prints the exact command and fails (so make stops there).  A dpkg-query
    that knows no package stands in for a fresh machine."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        stub = os.path.join(tmp, "dpkg-query")
        with open(stub, "w") as f:
            f.write("#!/bin/sh\nexit 1\n")
        os.chmod(stub, 0o755)
        env = dict(os.environ, PATH=f"{tmp}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        # A copy: the user it runs as may not read the checkout (/root/...).
        script = os.path.join(tmp, "deps.sh")
        shutil.copy(os.path.join(ROOT, "scripts", "deps.sh"), script)
        os.chmod(script, 0o755)
        cmd = ["bash", script, "--test"]
        if os.getuid() == 0:
            cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
        r = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=60)
        assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
        assert "grove: missing Debian packages: build-essential" in r.stderr, r.stderr
        want = ("sudo apt-get update && sudo apt-get install -y --no-install-recommends "
                "build-essential pkg-config")
        assert want in r.stderr and "python3-torch" in r.stderr, r.stderr
        assert not os.path.exists(os.path.join(tmp, "build")), "it began installing"
        os.unlink(script)
