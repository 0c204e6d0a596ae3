"""Model to arrays for the NDM experiments: the stored training activations of an
``ndm train`` run, the browse index over them, and the activation of a query token.

Capture itself is :func:`structlens.ndm.data.capture_residuals`; the numerical modules of
:mod:`structlens.ndm` only see the arrays.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError

from structlens.capture.store import ActivationStore, StoreError
from structlens.errors import InputError
from structlens.ndm import stages
from structlens.ndm.browse import PreimageBrowser
from structlens.ndm.data import capture_residuals, training_prompts
from structlens.ndm.protocol import NDMProtocol
from structlens.results import content_key, read_json_object
from structlens.sites import site_name

__all__ = [
    "load_train_meta", "train_protocol", "train_context", "browse_index", "query_activation"
]  # fmt: skip


def load_train_meta(train: Path) -> dict[str, Any]:
    """The ``ndm_train.json`` of an ``ndm train`` output directory."""
    meta = Path(train) / "ndm_train.json"
    if not meta.exists():
        raise InputError(f"{meta} not found; run `structlens ndm train ... --out {train}` first")
    doc = read_json_object(meta, "`ndm train` record (JSON)")
    if not isinstance(doc.get("protocol"), dict) or "store" not in doc:
        raise InputError(
            f"{meta} lacks the 'store' and 'protocol' records `ndm train` writes (a run of an "
            "older structlens: train it again)."
        )
    return doc


def train_context(model: Any, train: Path) -> tuple[dict[str, Any], ActivationStore, list[Any]]:
    """``(meta, store, prompts)`` of an ``ndm train`` run: its record, its activation store and
    the training prompts rebuilt from the recorded data settings."""
    meta = load_train_meta(train)
    return meta, _open_store(train, meta), _training_prompts(model, meta)


def _open_store(train: Path, meta: dict[str, Any]) -> ActivationStore:
    try:
        return ActivationStore(meta["store"])
    except (StoreError, FileNotFoundError) as err:
        raise InputError(f"activation store of {train} unavailable: {err}") from err


def train_protocol(meta: dict[str, Any]) -> NDMProtocol:
    """The protocol an ``ndm train`` run recorded."""
    return NDMProtocol(**meta["protocol"])


def _training_prompts(model: Any, meta: dict[str, Any]) -> list[tuple[str, list[int]]]:
    return stages.training_prompts(train_protocol(meta), model)


def browse_index(
    model: Any,
    train: Path,
    layer: int,
    rotation: np.ndarray,
    partition: list[int],
    *,
    extra_corpus_prompts: int | None,
    activations: Path,
    index_dir: Path | None = None,
) -> tuple[PreimageBrowser, Path, bool]:
    """A :class:`PreimageBrowser` over the training activations of ``layer`` plus
    ``extra_corpus_prompts`` further corpus windows (``None``: all remaining windows).

    The index is built once (capturing the extra windows under ``activations``) and saved as
    ``L{layer}-<key>.safetensors`` in ``index_dir`` (default ``train/browse-index``; a run
    whose folder must not change, such as a verified cache stage, passes another), the key a
    digest of the run (its store, rotation and partition, the model) and of the indexed
    prompts' tokens; later calls with the same key load it without touching the model or the
    stores.  Returns the browser, the index's path and whether it was built now.
    """
    meta = load_train_meta(train)
    prompts = _training_prompts(model, meta)
    protocol = train_protocol(meta)
    extra = training_prompts(
        model, corpus_prompts=extra_corpus_prompts, corpus_offset=protocol.corpus_prompts,
        max_tokens=protocol.corpus_tokens,
    )  # fmt: skip
    corpus = content_key(prompts + extra)
    run = {
        "store": str(meta["store"]),
        "model_digest": model.fingerprint(),
        "layer": layer,
        "rotation": hashlib.sha256(np.ascontiguousarray(rotation).tobytes()).hexdigest(),
        "partition": list(partition),
    }
    key = content_key({"run": run, "corpus": corpus})
    folder = Path(index_dir) if index_dir is not None else Path(train) / "browse-index"
    path = folder / f"L{layer}-{key[:16]}.safetensors"
    if path.is_file():
        try:
            browser, saved = PreimageBrowser.load(path, rotation, partition, prompts + extra)
            if saved.get("key") == key:
                return browser, path, False
        except (ValueError, KeyError, OSError, SafetensorError):
            pass  # a damaged or partial index is rebuilt below
    site = site_name("resid_post", layer)
    stores = [(_open_store(train, meta), prompts)]
    if extra:
        stores.append((capture_residuals(model, extra, [layer], activations), extra))
    browser = PreimageBrowser(rotation, partition, prompts + extra)
    offset = 0
    for st, ps in stores:
        index = st.load_index()
        browser.add([(st.load(site).float(), index["prompt_index"] + offset, index["position"])])
        offset += len(ps)
    browser.save(path, {"key": key, "corpus_digest": corpus, **{k: str(v) for k, v in run.items()}})
    return browser, path, True


def query_activation(
    model: Any, layer: int, prompt: str, position: int
) -> tuple[torch.Tensor, list[int], int]:
    """``resid_post`` of ``layer`` at token ``position`` (negative: from the end) of ``prompt``,
    with the prompt's token ids and the non-negative position."""
    from structlens.interventions import run_with_cache
    from structlens.interventions.fastrun import truncated

    ids = model.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    if not ids:
        raise InputError("the prompt tokenizes to nothing")
    pos = position if position >= 0 else len(ids) + position
    if not 0 <= pos < len(ids):
        raise InputError(f"--position {position} is outside the prompt's {len(ids)} tokens")
    site = site_name("resid_post", layer)
    t = torch.tensor([ids], device=model.device)
    with truncated(model, layer):
        _, cache = run_with_cache(model, t, torch.ones_like(t), [site])
    return cache[site][0, pos].float(), ids, pos
