"""Depth-as-time streams from captured activations.

For a layer ``l`` the sample triplet is ``x = resid_pre(l)``, ``u = attn_out(l)``,
``y = resid_pre(l + 1)`` (``resid_post(l)`` for the last layer, the same tensor), one row per
token position.  Every row carries the integer index of its prompt, so that splits and
median-of-means blocks are by prompt.  A pooled stream over a layer range concatenates the
per-layer streams; prompt ids stay prompt ids, so a prompt's rows at every layer fall into
the same block.

Position 0 (and any BOS token) is excluded by default: it carries the attention-sink offset,
a huge-norm direction that would otherwise be the first principal direction of every layer
and dominate the fit.  ``exclude_position0=False`` keeps it; ``bos_token_id`` also drops BOS
tokens at later positions (packed documents).

This module reads an :class:`~structlens.capture.ActivationStore` (or captures one); the
numerical code in :mod:`structlens.koopman` only ever sees the arrays.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from structlens.sites import site_name

__all__ = [
    "depth_sites",
    "layer_sites",
    "depth_prompts",
    "capture_depth",
    "load_layer",
    "load_layers",
    "iter_layer_chunks",
    "token_rows",
]


def layer_sites(n_layers: int, layer: int) -> tuple[str, str, str]:
    """Site names ``(x, u, y)`` of layer ``layer`` in a model with ``n_layers`` blocks."""
    if not 0 <= layer < n_layers:
        raise ValueError(f"layer {layer} out of range; the model has layers 0..{n_layers - 1}.")
    y = (
        site_name("resid_pre", layer + 1)
        if layer + 1 < n_layers
        else site_name("resid_post", layer)
    )
    return site_name("resid_pre", layer), site_name("attn_out", layer), y


def depth_sites(n_layers: int, layers: Sequence[int]) -> list[str]:
    """All sites needed for the triplets of ``layers`` (deduplicated, in order)."""
    if len(layers) == 0:
        raise ValueError("pass at least one layer.")
    names: list[str] = []
    for layer in layers:
        names += layer_sites(n_layers, int(layer))
    return list(dict.fromkeys(names))


def depth_prompts(
    tokenizer: Any,
    *,
    n_corpus: int | None = 200,
    max_tokens: int = 64,
    task: str | None = "ioi",
    n_task: int = 50,
    seed: int = 0,
) -> list[Any]:
    """Prompts for a depth fit: ``n_corpus`` chunks of the bundled corpus (``None``: all of
    them) plus ``n_task`` clean prompts of ``task`` (``None``: corpus only), with distinct
    ids."""
    from structlens.data.corpus import chunk_documents, load_texts

    if (n_corpus is not None and n_corpus < 0) or n_task < 0:
        raise ValueError(f"n_corpus and n_task must be >= 0; got {n_corpus}, {n_task}.")
    prompts: list[Any] = []
    if n_corpus != 0:
        prompts += chunk_documents(
            load_texts(None), tokenizer, max_tokens=max_tokens, max_prompts=n_corpus
        )
    if task is not None and n_task:
        from structlens.data.tasks import make_task

        t = make_task(task, tokenizer, n=n_task, seed=seed)
        prompts += [(f"{task}:{pid}", ids) for pid, ids in zip(t.prompt_ids, t.clean)]
    if not prompts:
        raise ValueError("no prompts: set n_corpus or n_task above 0.")
    return prompts


def capture_depth(
    model: Any,
    prompts: Sequence[Any],
    layers: Sequence[int],
    *,
    root: str | Path = "activations",
    batch_size: int = 8,
    progress: bool = False,
    executor: Any = None,
) -> Any:
    """Capture the sites of ``layers`` over ``prompts`` (all positions) into a store.

    Content-hashed: a second call with the same model, prompts and layers is a cache hit.
    ``executor`` (name or :class:`~structlens.execution.Executor`) runs the capture shards.
    """
    from structlens.capture import capture

    sites = depth_sites(model.n_layers, layers)
    return capture(
        model,
        prompts,
        sites,
        root=root,
        positions="all",
        batch_size=batch_size,
        data_name="koopman-depth",
        executor=executor,
        progress=progress,
    )


def _site_triplet(store: Any, layer: int) -> tuple[str, str, str]:
    # The successor state is resid_pre(l + 1), or resid_post(l) for the last block; the
    # store tells which one was captured.
    nxt = site_name("resid_pre", layer + 1)
    if nxt not in store.sites:
        nxt = site_name("resid_post", layer)
    sites = (site_name("resid_pre", layer), site_name("attn_out", layer), nxt)
    missing = [s for s in sites if s not in store.sites]
    if missing:
        raise ValueError(
            f"the store lacks {missing}; capture layer {layer} with capture_depth(...)."
        )
    return sites


def token_rows(
    position: Any, token_id: Any, *, exclude_position0: bool = True, bos_token_id: int | None = None
) -> np.ndarray:
    """Boolean mask of the token rows a fit uses: all but position 0 (when
    ``exclude_position0``) and all but tokens equal to ``bos_token_id`` (when given)."""
    position, token_id = np.asarray(position), np.asarray(token_id)
    keep = np.ones(position.shape, dtype=bool)
    if exclude_position0:
        keep &= position != 0
    if bos_token_id is not None:
        keep &= token_id != bos_token_id
    return keep


def load_layer(
    store: Any, layer: int, *, exclude_position0: bool = True, bos_token_id: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(X, U, Y, prompt_ids)`` of one layer, float64 arrays, rows = token positions.

    ``prompt_ids`` are integer indices into ``store.prompt_ids``.  Rows at position 0 and
    BOS tokens are dropped as :func:`token_rows` says (the attention sink; see module doc).
    """
    sx, su, sy = _site_triplet(store, int(layer))
    X, U, Y = (store.load(s).double().numpy() for s in (sx, su, sy))
    index = store.load_index()
    pid = index["prompt_index"].numpy().astype(np.int64)
    keep = token_rows(
        index["position"].numpy(),
        index["token_id"].numpy(),
        exclude_position0=exclude_position0,
        bos_token_id=bos_token_id,
    )
    return X[keep], U[keep], Y[keep], pid[keep]


def load_layers(
    store: Any,
    layers: Sequence[int],
    *,
    exclude_position0: bool = True,
    bos_token_id: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Pooled stream over ``layers``: the per-layer triplets stacked, prompt ids kept."""
    parts = [
        load_layer(store, layer, exclude_position0=exclude_position0, bos_token_id=bos_token_id)
        for layer in layers
    ]
    if not parts:
        raise ValueError("pass at least one layer.")
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(4))  # type: ignore[return-value]


def iter_layer_chunks(
    store: Any,
    layers: Sequence[int],
    batch_size: int = 8192,
    *,
    exclude_position0: bool = True,
    bos_token_id: int | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Stream ``(X, U, Y, prompt_ids)`` chunks of the pooled layers without loading a site
    whole: memory is one batch of each of the three sites.  Rows as in :func:`load_layer`."""
    if not layers:
        raise ValueError("pass at least one layer.")
    for layer in layers:
        sx, su, sy = _site_triplet(store, int(layer))
        for batch in store.iter_batches([sx, su, sy], batch_size):
            keep = token_rows(
                batch["position"].numpy(),
                batch["token_id"].numpy(),
                exclude_position0=exclude_position0,
                bos_token_id=bos_token_id,
            )
            yield (
                batch[sx].double().numpy()[keep],
                batch[su].double().numpy()[keep],
                batch[sy].double().numpy()[keep],
                batch["prompt_index"].numpy().astype(np.int64)[keep],
            )


@dataclass
class ShardStatistics:
    """EDMDc statistics of one activation-store shard under a frozen dictionary.

    ``triplets`` are the ``(x, u, y)`` site names of the layers to pool.  A picklable callable
    (the dictionary holds arrays only), so
    :func:`structlens.capture.statistics.store_statistic` can run it on workers next to the
    shards; merging the shards' statistics in order equals one pass over the store to float64
    round-off.
    """

    dictionary: Any
    triplets: list[tuple[str, str, str]]
    exclude_position0: bool = True
    bos_token_id: int | None = None

    def __call__(self, shard: dict[str, Any]) -> Any:
        from structlens.koopman.edmdc import accumulate

        keep = token_rows(
            shard["position"].numpy(),
            shard["token_id"].numpy(),
            exclude_position0=self.exclude_position0,
            bos_token_id=self.bos_token_id,
        )
        X, U, Y = (
            np.concatenate([shard[t[i]].double().numpy()[keep] for t in self.triplets])
            for i in range(3)
        )
        return accumulate(self.dictionary, [(X, U, Y)])[0]


def store_statistics(
    store: Any,
    dictionary: Any,
    layers: Sequence[int],
    *,
    executor: Any = None,
    exclude_position0: bool = True,
    bos_token_id: int | None = None,
) -> Any:
    """:class:`~structlens.koopman.edmdc.EDMDcStatistics` of the pooled ``layers`` of a store,
    one task per shard with ``executor`` (``"local"``, ``"ray"`` or an executor), merged.

    ``dictionary`` must already be fitted (frozen).  Workers read the shards from the store's
    path, so on a cluster the store must be on shared storage.
    """
    from structlens.capture.statistics import store_statistic

    if len(layers) == 0:
        raise ValueError("pass at least one layer.")
    triplets = [_site_triplet(store, int(layer)) for layer in layers]
    sites = list(dict.fromkeys(s for t in triplets for s in t))
    return store_statistic(
        store,
        ShardStatistics(dictionary, triplets, exclude_position0, bos_token_id),
        sites=sites,
        executor=executor,
        progress=False,
    )
