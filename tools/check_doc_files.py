#!/usr/bin/env python3
"""check_doc_files: every source file of core/, server/ and client/ is named in
docs/architecture.md, so that the map of the code stays whole as files come
and go.

    tools/check_doc_files.py [--doc docs/architecture.md] [--root .] [FOLDER...]

FOLDERs default to core, server and client.  For each, every .c and .h file
below it (core/'s layer folders included) must appear in backquotes
(`name.c`) inside the doc's section for that folder: the part from the
heading that starts with "## FOLDER/" to the next "## " heading.  So
server/status.c is looked for in "## server/", core/base/status.c in
"## core/".  Prints each missing file and exits 1 when any is missing, 2 on
usage errors (no doc, no section), 0 otherwise.  Only the standard library.
"""
import argparse
import os
import re
import sys


def sections(text):
    """The doc's "## " sections: heading line -> body (up to the next "## ")."""
    out, head, body = {}, None, []
    for line in text.splitlines():
        if line.startswith("## "):
            if head is not None:
                out[head] = "\n".join(body)
            head, body = line[3:].strip(), []
        elif head is not None:
            body.append(line)
    if head is not None:
        out[head] = "\n".join(body)
    return out


def sources(root, folder):
    """The .c and .h files below root/folder, as paths relative to root."""
    found = []
    for d, subdirs, files in os.walk(os.path.join(root, folder)):
        subdirs.sort()
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                found.append(os.path.relpath(os.path.join(d, f), root))
    return found


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", default="docs/architecture.md")
    ap.add_argument("--root", default=".")
    ap.add_argument("folders", nargs="*", default=["core", "server", "client"])
    args = ap.parse_args(argv)
    doc = os.path.join(args.root, args.doc)
    try:
        with open(doc, encoding="utf-8") as f:
            secs = sections(f.read())
    except OSError as e:
        print(f"check_doc_files: {doc}: {e.strerror}", file=sys.stderr)
        return 2
    missing = 0
    total = 0
    for folder in args.folders:
        sec = next((body for head, body in secs.items() if head.startswith(folder + "/")), None)
        if sec is None:
            print(f"check_doc_files: {doc} has no section '## {folder}/'", file=sys.stderr)
            return 2
        # Fenced blocks (```) hold drawings, not names; a name is on one line.
        prose = re.sub(r"^```.*?^```", "", sec, flags=re.S | re.M)
        named = set(re.findall(r"`([^`\n]+)`", prose))
        # A backquoted name may carry a folder ("core/base/log.c") or be one of
        # several ("`optim.c`, `optim_io.c`"): compare base names.
        names = {os.path.basename(n.strip()) for n in named}
        for path in sources(args.root, folder):
            total += 1
            if os.path.basename(path) not in names:
                print(f"check_doc_files: {path} is not named in {args.doc} (section '## {folder}/')")
                missing += 1
    if missing:
        print(f"check_doc_files: {missing} of {total} files missing; add each, with its layer and "
              f"job, to {args.doc}")
        return 1
    print(f"check_doc_files: all {total} files of {', '.join(args.folders)} named in {args.doc}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
