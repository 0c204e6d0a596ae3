"""Model to arrays for the SAE experiments: corpus windows and residual-stream activations.

The SAE modules (:mod:`structlens.sae.models`, ``.train``, ``.evaluate``) only see the arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

__all__ = ["corpus_windows", "residuals", "check_sae_fits"]


def corpus_windows(
    tokenizer: Any, prompt_tokens: int, n_train: int, n_eval: int, data: Path | None = None
) -> tuple[list[list[int]], list[list[int]]]:
    """Training and held-out windows of exactly ``prompt_tokens`` tokens from the corpus
    (``data``: a text file; default the bundled corpus); every 20th window is held out."""
    from structlens.data.corpus import chunk_documents, load_texts

    if prompt_tokens < 2 or n_train < 1 or n_eval < 1:
        raise ValueError("--prompt-tokens must be ≥ 2 and --prompts/--eval-prompts ≥ 1.")
    chunks = chunk_documents(load_texts(data), tokenizer, max_tokens=prompt_tokens)
    full = [list(c.token_ids) for c in chunks if len(c.token_ids) == prompt_tokens]
    held = full[::20]
    train = [p for i, p in enumerate(full) if i % 20][:n_train]
    if len(held) < n_eval or not train:
        raise ValueError(
            f"the corpus gives {len(full)} windows of {prompt_tokens} tokens; ask for fewer."
        )
    return train, held[:n_eval]


def residuals(model: Any, layer: int, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """``blocks.{layer}.hook_resid_pre`` at every position but the first: ``[n_tokens, d]``."""
    from structlens.capture.residuals import collect_residuals
    from structlens.sites import site_name

    site_name("resid_pre", layer, n_layers=model.n_layers)  # a clear error for a bad layer
    return collect_residuals(model, layer, prompts)


def check_sae_fits(sae: Any, model: Any) -> None:
    """``ValueError`` unless the SAE reads vectors of the model's residual width."""
    if sae.d_in != model.d_model:
        raise ValueError(
            f"the SAE has d_in = {sae.d_in} but {model.name} has d_model = {model.d_model}."
        )
