#!/usr/bin/env python3
"""check_layers: the house rules of docs/architecture.md, checked on the
objects the build made, so that they are enforced rather than hoped for.

    tools/check_layers.py OBJDIR FOLDER... [--order LAYER,LAYER,...]...

For the object files of each FOLDER (relative to the source tree, e.g.
`server`, `client`, `core/nn`), found under OBJDIR/FOLDER, it reads which
global symbols each defines and which it uses (nm), and draws an arrow from
a file to every other file whose symbols it uses.  Then:

  - a circle (files that reach each other through arrows: "a file that calls
    a file that calls it back") is an error, with the symbols that close it;
  - with --order A,B,C (folders from the bottom up), an arrow from a folder to
    one later in the list (a lower layer calling a higher one) is an error.
    Several --order lists may be given (one per tree).

Arrows are computed across every folder given, so a circle through two
folders is found too.  Exit status 0 when nothing is wrong, 1 otherwise,
2 on usage errors.  Only the standard library and binutils' nm are needed.
"""
import collections
import os
import subprocess
import sys


def objects(objdir, folder):
    """The objects of one folder, not of its subfolders (each is named on its own), whose
    source file still exists: a build directory keeps the object of a file since removed or
    renamed, which would otherwise draw arrows the tree no longer has."""
    root = os.path.join(objdir, folder)
    if not os.path.isdir(root):
        return []
    return [os.path.join(root, f) for f in sorted(os.listdir(root))
            if f.endswith(".o") and os.path.exists(os.path.join(folder, f[:-2] + ".c"))]


def symbols(path):
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "TDBRCVW":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def circles(nodes, edges):
    """Strongly connected components with more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(max(1000, 4 * len(nodes) + 100))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in nodes:
        if v not in index:
            visit(v)
    return out


def main(argv):
    args, orders = [], []
    i = 1
    while i < len(argv):
        if argv[i] == "--order":
            if i + 1 >= len(argv):
                print("check_layers: --order wants a list", file=sys.stderr)
                return 2
            orders.append([x for x in argv[i + 1].split(",") if x])
            i += 2
        elif argv[i] in ("-h", "--help"):
            print(__doc__)
            return 0
        else:
            args.append(argv[i])
            i += 1
    if len(args) < 2:
        print("usage: check_layers.py OBJDIR FOLDER... [--order A,B,...]", file=sys.stderr)
        return 2
    objdir, folders = args[0], args[1:]
    files = {}  # object path -> source-relative name ("server/rpc.c")
    for folder in folders:
        objs = objects(objdir, folder)
        if not objs:
            print(f"check_layers: no object files under {os.path.join(objdir, folder)}",
                  file=sys.stderr)
            return 2
        for o in objs:
            files[o] = os.path.relpath(o, objdir)[:-2] + ".c"
    defined_by, uses = {}, {}
    for o, name in files.items():
        d, u = symbols(o)
        uses[name] = u
        for s in d:
            defined_by.setdefault(s, name)
    names = sorted(files.values())
    edges = collections.defaultdict(set)
    why = collections.defaultdict(set)
    for a in names:
        for s in uses[a]:
            b = defined_by.get(s)
            if b and b != a:
                edges[a].add(b)
                why[(a, b)].add(s)
    problems = 0
    for comp in circles(names, edges):
        problems += 1
        print("check_layers: these files call each other in a circle: " + ", ".join(comp))
        members = set(comp)
        for a in comp:
            for b in sorted(edges[a] & members):
                syms = sorted(why[(a, b)])
                print(f"  {a} -> {b}: {' '.join(syms[:4])}{' ...' if len(syms) > 4 else ''}")
    folder_of = {n: os.path.dirname(n) for n in names}
    for order in orders:
        rank = {f: k for k, f in enumerate(order)}
        for a in names:
            for b in sorted(edges[a]):
                fa, fb = folder_of[a], folder_of[b]
                if fa in rank and fb in rank and rank[fb] > rank[fa]:
                    problems += 1
                    syms = sorted(why[(a, b)])
                    print(f"check_layers: {a} ({fa}) calls up into {b} ({fb}): "
                          f"{' '.join(syms[:4])}{' ...' if len(syms) > 4 else ''}")
    narrows = sum(len(v) for v in edges.values())
    print(f"check_layers: {len(names)} files in {', '.join(folders)}; {narrows} arrows; "
          f"{problems} problem{'s' if problems != 1 else ''}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
