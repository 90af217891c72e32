#!/usr/bin/env python3
"""Trains the demo model Grove serves: a small MLP on scikit-learn's bundled
8x8 digits (1,797 images, no download), then exports it with
tools/grove_export.py into examples/digits/.

    /usr/bin/python3 examples/train_digits.py          # Debian's torch lives there
    grove predict --local examples/digits examples/digits/sample.npy

The model takes the raw pixels (64 float32 values from 0 to 16 per row) and
returns 10 logits.  It uses a BatchNorm1d and a LayerNorm so that the demo
exercises Grove's eval-mode normalisation layers, with named children (an
OrderedDict) so that model.json shows the object form.

Writes examples/digits/{model.json, weights.safetensors, sample.npy,
sample_labels.npy}.  Deterministic: the same torch and scikit-learn give the
same files.
"""
import os
import sys
from collections import OrderedDict

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))

SEED = 0
SAMPLES = 8


def build_model():
    """The architecture (untrained).  tests/py/test_export.py rebuilds it to
    compare Grove's outputs with torch's on the exported weights."""
    return nn.Sequential(OrderedDict([
        ("fc1", nn.Linear(64, 64)),
        ("bn1", nn.BatchNorm1d(64)),
        ("act1", nn.ReLU()),
        ("drop", nn.Dropout(0.1)),
        ("fc2", nn.Linear(64, 32)),
        ("norm2", nn.LayerNorm(32)),
        ("act2", nn.GELU()),
        ("out", nn.Linear(32, 10)),
    ]))


def main():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    from grove_export import export

    torch.manual_seed(SEED)
    torch.set_num_threads(1)  # summation order, hence the weights, stay reproducible
    X, y = load_digits(return_X_y=True)
    X = X.astype(np.float32)
    X_train, X_test, y_train, y_test = train_test_split(
        X, y, test_size=0.25, random_state=SEED, stratify=y)

    model = build_model()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    xt, yt = torch.from_numpy(X_train), torch.from_numpy(y_train).long()
    gen = torch.Generator().manual_seed(SEED)
    for epoch in range(40):
        model.train()
        perm = torch.randperm(len(xt), generator=gen)
        for i in range(0, len(xt), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = loss_fn(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()

    model.eval()
    with torch.no_grad():
        pred = model(torch.from_numpy(X_test)).argmax(dim=1).numpy()
    acc = float((pred == y_test).mean())
    print(f"test accuracy: {acc:.4f} ({int((pred == y_test).sum())}/{len(y_test)})")

    out = os.path.join(HERE, "digits")
    export(model, out, example_input=torch.from_numpy(X_test[:1]), name="digits",
           batching={"max_batch_size": 64, "max_queue_delay_us": 500, "max_queue_size": 1024})
    np.save(os.path.join(out, "sample.npy"), X_test[:SAMPLES].astype(np.float32))
    np.save(os.path.join(out, "sample_labels.npy"), y_test[:SAMPLES].astype(np.int64))
    print(f"exported {out}: model.json, weights.safetensors, sample.npy ({SAMPLES} rows), "
          "sample_labels.npy")
    print(f"torch predicts {pred[:SAMPLES].tolist()} for the sample; labels "
          f"{y_test[:SAMPLES].tolist()}")


if __name__ == "__main__":
    main()
