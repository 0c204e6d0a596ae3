"""CONGRUITY on SmolLM2-135M's two sanity copies, uniform vs variance-weighted R² (issue #24).

The rotated, head-permuted copy and the head-permuted copy whose basis is kept
(``rotate_and_permute(..., rotate=False)``) both compute the model's function; they differ by
the rotation alone.  Each runs through the sanity stage's CONGRUITY-only measurement
(``stages.measure`` under ``stages.congruity_only``) at the replication's ``paper-subset``
protocol (96 IOI prompts, CONGRUITY on 3 layers, 2 implementations per model, 20 triples, 40
straps; the ``sanity-smollm2`` row), and the script records, for each copy and each way of
averaging per-coordinate R², the point test's decision rates and mean p in both directions,
the clean-run R² (A's accumulated residual encoding B's, and back), the decision, the copy's
logit gap and the wall seconds (1 torch thread; the load average before and after).

    .venv/bin/python benchmarks/equivalence/sanity_basis.py      # ~10-25 min on 2 cores
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import torch

from structlens.equivalence import stages as es
from structlens.equivalence.protocol import PROFILES
from structlens.equivalence.scenarios import rotate_and_permute
from structlens.models import load_model

HERE = Path(__file__).resolve().parent


def main() -> None:
    torch.set_num_threads(1)
    protocol = PROFILES["paper-subset"]
    model = load_model("smollm2-135m", seed=protocol.seed)
    out: dict = {"protocol": protocol.to_json(), "threads": 1, "copies": {}}
    out["load_before"] = os.getloadavg()[0]
    for name, rotate in (("rotated", True), ("unrotated", False)):
        t0 = time.perf_counter()
        twin, _, _ = rotate_and_permute(model, seed=protocol.rotation_seed, rotate=rotate)
        probe = es.probe_for(protocol, model, twin)
        raw = es.measure(es.congruity_only(protocol), model, twin, probe)
        c = es.summarize(protocol, raw).congruity
        assert c is not None
        seconds = time.perf_counter() - t0
        copy = {
            "seconds": round(seconds, 1),
            "max_abs_logit_diff": es._logit_gap(protocol, model, twin, probe),
            "top_heads_a": c.top_heads_a,
            "top_heads_b": c.top_heads_b,
            "decision": c.decision,
        }
        for e in c.estimates:
            copy[e.multioutput] = {
                k: getattr(e, k)
                for k in ("decision_rate_ab", "decision_rate_ba", "mean_p_ab", "mean_p_ba",
                          "base_r2_ab", "base_r2_ba", "decision")
            }  # fmt: skip
            print(name, e.multioutput, copy[e.multioutput], flush=True)
        out["copies"][name] = copy
    out["load_after"] = os.getloadavg()[0]
    (HERE / "results.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
