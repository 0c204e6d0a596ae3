"""One NDM merge round's mutual information: the compiled pass against the tensor operations.

``subspace_mutual_information`` at d = 640 in 8-d units (80 units, 3,160 pairs, 1,000 rows,
k = 1), with its numba pass and with the tensor operations it replaces (numba hidden), on one
thread and on two; the matrices must be equal bit for bit.  Writes ``merge_mi.json`` next to
this file.

    python benchmarks/ndm/merge_mi.py
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from structlens.stats import mutual_info


def timed(z: np.ndarray, partition: list[int]) -> tuple[np.ndarray, float]:
    t = time.perf_counter()
    out = mutual_info.subspace_mutual_information(z, partition, k=1)
    return out, time.perf_counter() - t


def main() -> None:
    import numba

    rng = np.random.default_rng(0)
    z = rng.standard_normal((1000, 640))
    z[:, 8:16] += 0.5 * z[:, :8]
    partition = [8] * 80
    timed(z[:50], [8] * 80)  # compile the kernel outside the timings
    result: dict = {"rows": 1000, "units": 80, "unit_size": 8,
                    "load_average_before": os.getloadavg()}  # fmt: skip
    available = mutual_info._numba_available
    for threads in (1, 2):
        torch.set_num_threads(threads)
        numba.set_num_threads(threads)
        fused, t_fused = timed(z, partition)
        mutual_info._numba_available = lambda: False
        try:
            tensor, t_tensor = timed(z, partition)
        finally:
            mutual_info._numba_available = available
        result[f"threads_{threads}"] = {
            "compiled_seconds": t_fused, "tensor_seconds": t_tensor,
            "speedup": t_tensor / t_fused, "equal": bool(np.array_equal(fused, tensor)),
        }  # fmt: skip
    path = Path(__file__).with_name("merge_mi.json")
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
