"""Residual-stream activations for NDM training and preimage browsing.

Prompts are the bundled corpus cut into windows plus the clean prompts of circuit tasks; the
first token of every prompt is skipped (SmolLM2 has no BOS and its first position is an
attention-sink outlier whose huge norm would dominate neighbour distances).  Capture goes
through :func:`structlens.capture.capture` (content-hashed, resumable store) with the model
truncated after the deepest requested layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from structlens.capture import capture
from structlens.capture.store import ActivationStore
from structlens.data.corpus import chunk_documents, load_texts
from structlens.data.tasks import make_task
from structlens.interventions.fastrun import truncated
from structlens.models.loading import Model
from structlens.sites import site_name


def training_prompts(
    model: Model,
    *,
    corpus_prompts: int | None,
    corpus_offset: int = 0,
    task_prompts: int = 0,
    tasks: Sequence[str] = ("ioi", "greater_than", "knowledge_conflict"),
    max_tokens: int = 128,
    seed: int = 0,
) -> list[tuple[str, list[int]]]:
    """``(id, token_ids)`` pairs: corpus windows ``[corpus_offset, corpus_offset + n)`` of
    ``max_tokens`` tokens, then ``task_prompts`` clean prompts of each task."""
    chunks = chunk_documents(load_texts(None), model.tokenizer, max_tokens=max_tokens)
    stop = None if corpus_prompts is None else corpus_offset + corpus_prompts
    out = [(p.id, list(p.token_ids)) for p in chunks[corpus_offset:stop]]
    if task_prompts > 0:
        for name in tasks:
            task = make_task(name, model.tokenizer, n=task_prompts, seed=seed)
            out += [(pid, list(t)) for pid, t in zip(task.prompt_ids, task.clean, strict=True)]
    return out


def capture_residuals(
    model: Model,
    prompts: Sequence[tuple[str, list[int]]],
    layers: Sequence[int],
    root: str | Path,
    *,
    dtype: str = "float32",
    batch_size: int = 8,
    progress: bool = False,
) -> ActivationStore:
    """``resid_post`` of ``layers`` at every position but the first, into a store under
    ``root`` (a second call with the same arguments returns the cached store)."""
    if not layers:
        raise ValueError("name at least one layer to capture.")
    with truncated(model, max(layers)):
        return capture(
            model,
            list(prompts),
            [site_name("resid_post", layer) for layer in layers],
            root=root,
            positions="skip-first",
            dtype=dtype,
            batch_size=batch_size,
            data_name="ndm: corpus + task prompts",
            progress=progress,
        )
