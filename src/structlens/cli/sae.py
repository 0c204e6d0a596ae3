"""``structlens sae``: train, width-sweep and evaluate sparse autoencoders on a model's
residual stream (``blocks.{layer}.hook_resid_pre``) over the bundled corpus or a text file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from structlens.cli.common import (
    Address,
    Device,
    Dtype,
    ExecutorName,
    ModelArg,
    Out,
    Quiet,
    Seed,
    console,
    executor_or_fail,
    fail,
    load_model_or_fail,
    write_results,
)

app = typer.Typer(
    help="Sparse autoencoders: train, width sweeps, evaluation.", no_args_is_help=True
)

Layer = Annotated[
    int, typer.Option("--layer", help="Residual stream blocks.{layer}.hook_resid_pre.")
]
Prompts = Annotated[int, typer.Option("--prompts", help="Corpus windows used for training.")]
EvalPrompts = Annotated[int, typer.Option("--eval-prompts", help="Held-out windows for eval.")]
Tokens = Annotated[int, typer.Option("--prompt-tokens", help="Tokens per corpus window.")]
Arch = Annotated[str, typer.Option("--arch", help="relu, topk, batchtopk or jumprelu.")]
K = Annotated[int, typer.Option("--k", help="TopK/BatchTopK k (the matched L0).")]
TargetL0 = Annotated[
    float | None, typer.Option("--target-l0", help="Matched L0 for relu/jumprelu (controller).")
]
Epochs = Annotated[int, typer.Option("--epochs", help="Passes over the training tokens.")]
Batch = Annotated[int, typer.Option("--batch-size", help="Tokens per training step.")]
LrBase = Annotated[float, typer.Option("--lr-base", help="Learning rate at width 2^14.")]


def corpus_prompts(
    model: Any, prompt_tokens: int, n_train: int, n_eval: int, data: Path | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """Training and held-out windows (every 20th window is held out) from the corpus."""
    from structlens.data.corpus import chunk_documents, load_texts

    if prompt_tokens < 2 or n_train < 1 or n_eval < 1:
        fail("--prompt-tokens must be ≥ 2 and --prompts/--eval-prompts ≥ 1.")
    chunks = chunk_documents(load_texts(data), model.tokenizer, max_tokens=prompt_tokens)
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == prompt_tokens]
    held = full[::20]
    train = [p for i, p in enumerate(full) if i % 20][:n_train]
    if len(held) < n_eval or not train:
        fail(f"the corpus gives {len(full)} windows of {prompt_tokens} tokens; ask for fewer.")
    return train, held[:n_eval]


def load_sae_for_model(sae: Path, model: str, device: str, dtype: str, seed: int):
    """The SAE saved at ``sae`` and the model it reads; exits with a clear error if the
    directory holds no SAE or the SAE's width does not match the model's residual stream."""
    from structlens.sae import load_sae

    if not (sae / "cfg.json").exists():
        fail(f"{sae} is not an SAE directory (no cfg.json).")
    s = load_sae(sae)
    m = load_model_or_fail(model, device, dtype, seed)
    if s.d_in != m.d_model:
        fail(f"the SAE has d_in = {s.d_in} but {m.name} has d_model = {m.d_model}.")
    return s, m


def _config(arch: str, k: int, target_l0: float | None, lr_base: float, seed: int, width: int):
    from structlens.sae import SAETrainConfig

    try:
        return SAETrainConfig(
            architecture=arch, d_sae=width, k=k, target_l0=target_l0, lr_base=lr_base, seed=seed
        )  # type: ignore[arg-type]
    except ValueError as err:
        fail(str(err))


def _train(
    model: Any,
    layer: int,
    widths: list[int],
    cfg: Any,
    prompts: list[list[int]],
    eval_prompts: list[list[int]],
    epochs: int,
    batch_size: int,
    seed: int,
    out: Path,
    executor: Any = None,
) -> dict[str, Any]:
    from structlens.causal_dim.experiment import (
        ce_recovered_by_width,
        collect_residuals,
        sae_quality,
        train_width_sweep,
    )
    from structlens.sae import save_sae
    from structlens.sites import site_name

    try:
        site_name("resid_pre", layer, n_layers=model.n_layers)
    except ValueError as err:
        fail(str(err))
    acts = collect_residuals(model, layer, prompts)
    if acts.shape[0] < batch_size:
        fail(f"only {acts.shape[0]} training tokens for --batch-size {batch_size}.")
    trained = train_width_sweep(
        acts, widths, cfg, batch_size=batch_size, epochs=epochs, seed=seed, executor=executor
    )
    eval_acts = collect_residuals(model, layer, eval_prompts)
    saes = {w: r.sae for w, r in trained.items()}
    ce = ce_recovered_by_width(model, layer, saes, eval_prompts) if model.causal else {}
    per_width = {}
    for w, r in trained.items():
        save_sae(r.sae, out / "saes" / str(w))
        per_width[str(w)] = {
            "train": {
                "tokens": r.tokens,
                "steps": r.steps,
                "final_fvu": r.final_fvu,
                "final_l0": r.final_l0,
                "dead_fraction": r.dead_fraction,
                "learning_rate": r.learning_rate,
            },
            "eval": sae_quality(r.sae, eval_acts),
            "ce": ce.get(w),
            "path": str(out / "saes" / str(w)),
        }
    return {
        "model": model.name,
        "site": site_name("resid_pre", layer, n_layers=model.n_layers),
        "n_train_tokens": int(acts.shape[0]),
        "epochs": epochs,
        "widths": widths,
        "per_width": per_width,
    }


def _summary(payload: dict[str, Any], quiet: bool) -> None:
    if quiet:
        return
    for w, v in payload["per_width"].items():
        ce = v["ce"]["ce_loss_recovered"] if v["ce"] else float("nan")
        console.print(
            f"width {w}: FVU {v['eval']['fvu']:.3f}, L0 {v['eval']['l0']:.1f}, "
            f"dead {v['eval']['dead_fraction']:.3f}, CE recovered {ce:.3f}"
        )


@app.command()
def train(
    model: ModelArg,
    out: Out,
    layer: Layer = 0,
    width: Annotated[int, typer.Option("--width", help="Dictionary size.")] = 4096,
    arch: Arch = "topk",
    k: K = 32,
    target_l0: TargetL0 = None,
    prompts: Prompts = 200,
    eval_prompts: EvalPrompts = 8,
    prompt_tokens: Tokens = 128,
    epochs: Epochs = 1,
    batch_size: Batch = 512,
    lr_base: LrBase = 2e-4,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """Train one SAE on the residual stream at --layer; saves it in SAELens format."""
    m = load_model_or_fail(model, device, dtype, seed)
    tr, ev = corpus_prompts(m, prompt_tokens, prompts, eval_prompts)
    cfg = _config(arch, k, target_l0, lr_base, seed, width)
    payload = _train(m, layer, [width], cfg, tr, ev, epochs, batch_size, seed, out)
    write_results(out, "sae_train", payload, command="sae train")
    _summary(payload, quiet)


@app.command()
def sweep(
    model: ModelArg,
    out: Out,
    layer: Layer = 0,
    widths: Annotated[str, typer.Option("--widths", help="Comma-separated widths.")] = (
        "512,1024,2048,4096,8192,16384"
    ),
    arch: Arch = "topk",
    k: K = 32,
    target_l0: TargetL0 = None,
    prompts: Prompts = 200,
    eval_prompts: EvalPrompts = 8,
    prompt_tokens: Tokens = 128,
    epochs: Epochs = 1,
    batch_size: Batch = 512,
    lr_base: LrBase = 2e-4,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
    executor: ExecutorName = "local",
    address: Address = None,
) -> None:
    """Train SAEs of several widths on ONE activation stream (same tokens, same order).

    With --executor ray the widths train as parallel Ray tasks (same SAEs as locally).
    """
    ws = parse_widths(widths)
    runner = executor_or_fail(executor, address)
    m = load_model_or_fail(model, device, dtype, seed)
    tr, ev = corpus_prompts(m, prompt_tokens, prompts, eval_prompts)
    cfg = _config(arch, k, target_l0, lr_base, seed, ws[0])
    payload = _train(m, layer, ws, cfg, tr, ev, epochs, batch_size, seed, out, runner)
    write_results(out, "sae_sweep", payload, command="sae sweep")
    _summary(payload, quiet)


def parse_widths(spec: str) -> list[int]:
    try:
        ws = sorted({int(w) for w in spec.split(",") if w.strip()})
    except ValueError:
        fail(f"--widths must be comma-separated integers, got {spec!r}.")
    if len(ws) < 1 or ws[0] < 1:
        fail("--widths needs positive integers.")
    return ws


@app.command("eval")
def evaluate(
    model: ModelArg,
    sae: Annotated[Path, typer.Option("--sae", help="SAELens-format SAE directory.")],
    out: Out,
    layer: Layer = 0,
    eval_prompts: EvalPrompts = 8,
    prompt_tokens: Tokens = 128,
    device: Device = "cpu",
    dtype: Dtype = "float32",
    seed: Seed = 0,
    quiet: Quiet = False,
) -> None:
    """FVU, L0, dead fraction and CE loss recovered of a saved SAE at --layer."""
    from structlens.causal_dim.experiment import (
        ce_recovered_by_width,
        collect_residuals,
        sae_quality,
    )

    s, m = load_sae_for_model(sae, model, device, dtype, seed)
    _, ev = corpus_prompts(m, prompt_tokens, 1, eval_prompts)
    try:
        acts = collect_residuals(m, layer, ev)
    except ValueError as err:
        fail(str(err))
    payload = {
        "model": m.name,
        "sae": str(sae),
        "layer": layer,
        "eval": sae_quality(s, acts),
        "ce": ce_recovered_by_width(m, layer, {s.d_sae: s}, ev)[s.d_sae] if m.causal else None,
    }
    write_results(out, "sae_eval", payload, command="sae eval")
    if not quiet:
        e = payload["eval"]
        console.print(f"FVU {e['fvu']:.3f}, L0 {e['l0']:.1f}, dead {e['dead_fraction']:.3f}")
