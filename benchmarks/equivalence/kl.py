"""Validation's KL at a 262,144-token vocabulary: ``LogitReference`` against float64 log-softmax.

The comparison is float64 log-softmax arithmetic on the same float32 logits (how the KL was
computed before ``LogitReference``), one patch of 384 rows against one reference, on one
thread and on two (``LogitReference`` runs its row blocks in lanes; the float64 reference
runs on one core either way).  Writes ``kl.json`` next to this file.

    python benchmarks/equivalence/kl.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from structlens.equivalence.congruity import LogitReference

ROWS, CLASSES, BLOCK = 384, 262_144, 128


def float64_kl(ref: np.ndarray, patched: np.ndarray) -> np.ndarray:
    def log_softmax(x: np.ndarray) -> np.ndarray:
        out = np.empty(x.shape)
        for i in range(0, len(x), BLOCK):
            lp = x[i : i + BLOCK].astype(np.float64)
            lp -= lp.max(1, keepdims=True)
            lp -= np.log(np.exp(lp).sum(1, keepdims=True))
            out[i : i + BLOCK] = lp
        return out

    la, lb = log_softmax(ref), log_softmax(patched)
    return np.sum(np.exp(la) * (la - lb), axis=1)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    rng = np.random.default_rng(0)
    ref = (3 * rng.standard_normal((ROWS, CLASSES))).astype(np.float32)
    patched = ref + (0.1 * rng.standard_normal(ref.shape)).astype(np.float32)
    want, t_old = timed(lambda: float64_kl(ref, patched))
    result = {"rows": ROWS, "classes": CLASSES, "float64_seconds": t_old,
              "load_average_before": os.getloadavg()}  # fmt: skip
    for threads in (1, 2):
        torch.set_num_threads(threads)
        got, t_new = timed(lambda: LogitReference(ref).kl(patched))
        result[f"threads_{threads}"] = {
            "seconds": t_new, "speedup": t_old / t_new,
            "max_relative_difference": float(np.max(np.abs(got - want) / want)),
        }  # fmt: skip
    path = Path(__file__).with_name("kl.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
