#!/usr/bin/env python3
"""Generates every test fixture from real PyTorch into OUT_DIR.

Run through `make fixtures` (into tests/fixtures, committed) or by `make test`
(into the build folder, whenever torch is importable).  Each module in
tests/fixtures_gen/ defines generate(out_dir); they are run in name order.
Needs torch: Debian's python3-torch lives under /usr/bin/python3.
"""
import importlib.util
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tools"))
sys.path.insert(0, os.path.join(here, "fixtures_gen"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "fixtures")
    os.makedirs(out, exist_ok=True)
    import torch
    torch.set_num_threads(1)
    gen_dir = os.path.join(here, "fixtures_gen")
    for name in sorted(os.listdir(gen_dir)):
        if not name.endswith(".py") or name.startswith("_"):
            continue
        spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(gen_dir, name))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        mod.generate(out)
        print(f"fixtures: {name} -> {out}")


if __name__ == "__main__":
    main()
