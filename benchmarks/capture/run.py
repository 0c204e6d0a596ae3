"""Capture throughput: structlens vs a bare HF forward, TransformerLens and nnsight.

Workload: SmolLM2-135M-Instruct (30 layers, d=576), prompts of 128 tokens from the bundled
corpus, batch 8; capture every resid_pre/resid_mid/resid_post/attn_out/mlp_out site (150
sites) at all positions.  Each contender is timed over the same batches in the same process:
best of ``--repeats`` rounds after a warm-up, the contenders interleaved in every round so
that outside load hits them alike.  Results go to results.json.

    python benchmarks/capture/run.py [--prompts 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import torch

from structlens.capture import iter_activations
from structlens.data.corpus import chunk_documents, load_texts
from structlens.models import load_model

HERE = Path(__file__).parent
KINDS = ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")


def _interleaved_best(contenders: dict, repeats: int) -> dict[str, float]:
    """Best wall time of each contender, running them in turn in every round so that load
    from other processes affects all of them alike."""
    for fn in contenders.values():
        fn()  # warm-up
    best = {name: float("inf") for name in contenders}
    for _ in range(repeats):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()

    load_before = os.getloadavg()
    print(f"load average before: {load_before}", flush=True)
    model = load_model("smollm2-135m", device=args.device)
    prompts = chunk_documents(
        load_texts(),
        model.tokenizer,
        max_tokens=args.tokens,
        min_tokens=args.tokens,
        max_prompts=args.prompts,
    )
    toks = [p.token_ids for p in prompts]
    batches = [
        torch.tensor(toks[i : i + args.batch], device=args.device)
        for i in range(0, len(toks), args.batch)
    ]
    n_tokens = sum(len(t) for t in toks)
    sites = [f"blocks.{l}.hook_{k}" for l in range(model.n_layers) for k in KINDS]
    results: dict[str, dict] = {}

    def bare():
        with torch.inference_mode():
            for ids in batches:
                out = model.hf(input_ids=ids, output_hidden_states=True, use_cache=False)
                [h.cpu() for h in out.hidden_states]

    def ours():
        for _ in iter_activations(model, toks, sites, batch_size=args.batch):
            pass

    contenders = {"hf_forward_hidden_states": bare, "structlens": ours}
    results["hf_forward_hidden_states"] = {"what": "31 hidden states, no attn/mlp outputs"}
    results["structlens"] = {"what": "150 sites"}

    try:
        from transformer_lens.model_bridge import TransformerBridge

        bridge = TransformerBridge.boot_transformers(str(Path(model.source)), device=args.device)
        tl_names = [f"blocks.{l}.hook_{k}" for l in range(model.n_layers) for k in KINDS]

        def tl():
            with torch.inference_mode():
                for ids in batches:
                    _, cache = bridge.run_with_cache(ids, names_filter=lambda n: n in tl_names)
                    [cache[n].cpu() for n in tl_names]

        tl()
        contenders["transformer_lens_bridge"] = tl
        results["transformer_lens_bridge"] = {"what": "150 sites via run_with_cache"}
    except Exception as err:  # noqa: BLE001 - report why the peer could not run
        results["transformer_lens_bridge"] = {"error": f"{type(err).__name__}: {err}"[:300]}

    try:
        from nnsight import LanguageModel

        lm = LanguageModel(model.hf, tokenizer=model.tokenizer)
        layers = lm.model.layers

        def nn():
            for ids in batches:
                saved: list = []  # filled inside the trace; nnsight runs its body separately
                with lm.trace(ids):
                    for layer in layers:
                        saved.extend(
                            [
                                layer.input.save(),
                                layer.self_attn.output[0].save(),
                                layer.post_attention_layernorm.input.save(),
                                layer.mlp.output.save(),
                                layer.output.save(),
                            ]
                        )
                [s.cpu() for s in saved]

        nn()
        contenders["nnsight"] = nn
        results["nnsight"] = {"what": "150 module inputs/outputs in one trace"}
    except Exception as err:  # noqa: BLE001
        results["nnsight"] = {"error": f"{type(err).__name__}: {err}"[:300]}

    for name, seconds in _interleaved_best(contenders, args.repeats).items():
        results[name]["seconds"] = seconds
    base = results["hf_forward_hidden_states"]["seconds"]
    for r in results.values():
        if "seconds" in r:
            r["tokens_per_s"] = n_tokens / r["seconds"]
            r["time_vs_bare_forward"] = r["seconds"] / base
    ours_s = results["structlens"]["seconds"]
    for name in ("transformer_lens_bridge", "nnsight"):
        if "seconds" in results[name]:
            results[name]["time_vs_structlens"] = results[name]["seconds"] / ours_s
    payload = {
        "machine": f"{platform.processor() or platform.machine()}, "
        f"{torch.get_num_threads()} threads, device {args.device}",
        "torch": torch.__version__,
        "n_tokens": n_tokens,
        "batch": args.batch,
        "prompt_tokens": args.tokens,
        "repeats": args.repeats,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "results": results,
    }
    out = HERE / ("results.json" if args.device == "cpu" else f"results-{args.device}.json")
    out.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
