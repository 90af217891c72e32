"""The PyTorch timing bench/sequence.sh's and bench/cnn_transformer.sh's torch steps share
(their scripts import it with bench/ on sys.path): one model at one batch size, in-process,
printed as the JSON line bench/peers_table.py reads."""
import json
import time

import torch


def time_forward(m, xs, name, batch, seconds, warmup):
    """Runs m(*xs) warmup times, then as often as fits in seconds under inference_mode, and
    prints {"engine", "model", "batch", "samples_per_s", "ms_per_batch"} for batch."""
    with torch.inference_mode():
        for _ in range(warmup):
            m(*xs)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            m(*xs)
            n += 1
        dt = (time.perf_counter() - t0) / n
    print(json.dumps({"engine": f"torch-{torch.__version__}", "model": name, "batch": batch,
                      "samples_per_s": round(batch / dt, 1), "ms_per_batch": round(dt * 1e3, 4)}))
