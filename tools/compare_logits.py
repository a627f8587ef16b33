#!/usr/bin/python3
"""Compares two float32 [positions x vocab] logit dumps.
Per position: max |ours - ref| / max |ref| (relative to the row's scale) and whether the argmax agrees.
Exits 1 when any position exceeds --tol or any argmax differs (when the reference top-2 gap is clear).
usage: compare_logits.py OURS REF VOCAB [--tol 1e-4]"""
import argparse, sys
import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("ours")
ap.add_argument("ref")
ap.add_argument("vocab", type=int)
ap.add_argument("--tol", type=float, default=1e-4)
a = ap.parse_args()
x = np.fromfile(a.ours, dtype="<f4").reshape(-1, a.vocab).astype(np.float64)
y = np.fromfile(a.ref, dtype="<f4").reshape(-1, a.vocab).astype(np.float64)
if x.shape != y.shape:
    print(f"shape mismatch: {x.shape} vs {y.shape}")
    sys.exit(1)
rel = np.abs(x - y).max(axis=1) / np.abs(y).max(axis=1)
srt = np.sort(y, axis=1)
clear = (srt[:, -1] - srt[:, -2]) > 1e-3
argmax_bad = int(((x.argmax(1) != y.argmax(1)) & clear).sum())
print(f"positions={x.shape[0]} max_rel_err={rel.max():.3e} mean_rel_err={rel.mean():.3e} argmax_mismatch={argmax_bad}")
sys.exit(0 if rel.max() <= a.tol and argmax_bad == 0 else 1)
