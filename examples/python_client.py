#!/usr/bin/env python3
"""The Python client on the demo model: predict, a hook and its telemetry,
a hot reload and an export.  Start the server first (`make run`), then

    /usr/bin/python3 examples/python_client.py [--server URL] [--admin URL] [--pub URL]

Needs NumPy and libgrove-client.so (`make` builds it; python/grove finds it
in build/current/, or set GROVE_CLIENT_LIB).  No torch needed.
"""
import argparse
import os
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
import grove  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--server", default=os.environ.get("GROVE_SERVER", "tcp://127.0.0.1:7700"))
    ap.add_argument("--admin", default=None,
                    help="groved's admin listener (hooks, reload, export); "
                         "default $GROVE_ADMIN, else tcp://127.0.0.1:7703")
    ap.add_argument("--pub", default=os.environ.get("GROVE_PUB", "tcp://127.0.0.1:7702"))
    args = ap.parse_args()

    x = np.load(os.path.join(ROOT, "examples", "digits", "sample.npy"))
    labels = np.load(os.path.join(ROOT, "examples", "digits", "sample_labels.npy"))
    with grove.Client(args.server, admin=args.admin) as c:
        out = c.predict("digits", x)
        print(f"predicted {out['y'].argmax(1).tolist()} (labels {labels.tolist()}), "
              f"version {out.version}, batch of {out.batch_rows} rows")

        hook = c.add_hook("digits", "act*")  # the activations after each hidden layer
        print(f"hook {hook['id']} on {', '.join(hook['modules'])}")
        want = set(hook["modules"])
        with grove.watch(args.pub, "digits", timeout_s=1) as events:
            # The subscription reaches groved a moment after it connects here,
            # so a first predict's events may go out before it: predict until
            # every hooked module has been seen (at most 10 times).
            seen = {}
            for _ in range(10):
                c.predict("digits", x)
                for ev in events:  # ends after 1 s without an event
                    seen.setdefault(ev["module"], ev)
                    if set(seen) == want:
                        break
                if set(seen) == want:
                    break
        for name in sorted(seen):
            ev = seen[name]
            print(f"  {name}: mean {ev['mean']:.3f} std {ev['std']:.3f} "
                  f"zeros {ev['zero_fraction']:.0%} over {ev['rows']} rows")
        c.remove_hook(hook["id"])

        r = c.reload("digits")
        print(f"reloaded: version {r['version']} (was {r['previous_version']}), "
              f"{r['duration_us'] / 1000:.1f} ms")
        with tempfile.TemporaryDirectory() as tmp:
            info = c.export("digits", os.path.join(tmp, "digits.safetensors"))
            print(f"exported version {info['version']}: {info['tensors']} tensors, "
                  f"{info['total_size']} bytes")


if __name__ == "__main__":
    try:
        main()
    except grove.GroveError as e:
        sys.exit(f"python_client: {e}")
