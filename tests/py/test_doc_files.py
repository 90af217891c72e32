"""tools/check_doc_files.py: docs/architecture.md names every source file of
core/, server/ and client/ (the tree as it is), and the check says which file
a doc lacks (a copy of the doc with one name taken out)."""
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(ROOT, "tools", "check_doc_files.py")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, cwd=ROOT)


def test_architecture_names_every_file():
    r = run()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "named in docs/architecture.md" in r.stdout, r.stdout


def test_a_missing_file_is_named():
    with open(os.path.join(ROOT, "docs", "architecture.md"), encoding="utf-8") as f:
        text = f.read()
    assert "`threadpool.c`" in text
    tmp = tempfile.mkdtemp(prefix="grove-docfiles-")
    try:
        doc = os.path.join(tmp, "architecture.md")
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text.replace("`threadpool.c`", "the pool"))
        r = run("--doc", doc)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "core/kernels/threadpool.c is not named" in r.stdout, r.stdout
        assert "1 of " in r.stdout, r.stdout
        # A folder without a section is a usage error.
        with open(doc, "w", encoding="utf-8") as f:
            f.write(text.replace("## server/", "## the server"))
        r = run("--doc", doc)
        assert r.returncode == 2 and "no section '## server/'" in r.stderr, r.stdout + r.stderr
    finally:
        shutil.rmtree(tmp)
