"""The table bench/cnn_transformer.sh and bench/sequence.sh print: samples/s per model and
batch, the median of the rounds for each engine, and Grove/ORT and Grove/PyTorch ratios from
the same run.

    peers_table.py RESULTS.jsonl BATCHES MODELS [UNSUPPORTED.tsv]

RESULTS.jsonl holds one JSON object per engine, model, batch and round: {"engine", "model",
"batch", "samples_per_s", ...}; engine is "grove", "onnxruntime-<version>" or
"torch-<version>".  A model or engine without figures shows "-"; UNSUPPORTED.tsv (model TAB
reason, one a line) adds "not supported: <reason>" to that model's rows.
"""
import json
import statistics
import sys


def family(e):
    return "grove" if e == "grove" else "ort" if e.startswith("onnxruntime") else \
           "torch" if e.startswith("torch") else e


def fmt(x, w, p=1):
    return f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
    batches = [int(b) for b in sys.argv[2].split(",")]
    models = sys.argv[3].split(",")
    unsupported = {}
    if len(sys.argv) > 4:
        unsupported = dict(line.rstrip("\n").split("\t", 1) for line in open(sys.argv[4])
                           if "\t" in line)
    if not rows:
        print("no figures (see the messages above)")
        return
    names = {family(r["engine"]): r["engine"] for r in rows}
    w = max(8, max(len(m) for m in models))
    print("samples/s (median of rounds; ratios from the same run); engines: " +
          ", ".join(names[f] for f in ("grove", "ort", "torch") if f in names))
    print(f"{'model':>{w}} {'batch':>6} {'grove':>10} {'onnxruntime':>12} {'pytorch':>10} "
          f"{'grove/ORT':>10} {'grove/torch':>12}")
    for model in models:
        for b in batches:
            med = {}
            for fam in ("grove", "ort", "torch"):
                v = [r["samples_per_s"] for r in rows
                     if family(r["engine"]) == fam and r["model"] == model and r["batch"] == b]
                med[fam] = statistics.median(v) if v else None
            g, o, t = med["grove"], med["ort"], med["torch"]
            print(f"{model:>{w}} {b:>6} {fmt(g, 10)} {fmt(o, 12)} {fmt(t, 10)} "
                  f"{fmt(g / o if g and o else None, 10, 2)} "
                  f"{fmt(g / t if g and t else None, 12, 2)}"
                  + (f"  not supported: {unsupported[model][:100]}" if model in unsupported else ""))


if __name__ == "__main__":
    main()
