"""Streaming capture of activations at any set of sites over prompts.

:func:`iter_activations` yields activations batch by batch (memory: one batch);
:func:`collect` gathers them in memory for small jobs; :func:`capture` writes them into an
:class:`~structlens.capture.store.ActivationStore` shard by shard through an executor, with
resume and caching.

Positions
---------
``"all"`` every real (non-padding) token; ``"last"`` the last token of each prompt;
``"skip-first"`` every token but the first (which often carries a BOS/attention-sink outlier);
a comma-separated list of names (``"IO,S2,END"``) looked up in ``named_positions``; or an
explicit list of position lists, one per prompt.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import structlens
from structlens.capture.store import (
    STORE_FORMAT,
    ActivationStore,
    StoreError,
    content_key,
    plan_shards,
    write_metadata,
    write_shard,
)
from structlens.data.tasks.base import pad_batch
from structlens.execution import Executor, get_executor
from structlens.interventions.hooks import hooked
from structlens.models.loading import Model, load_model, resolve_dtype

PositionSpec = str | Sequence[Sequence[int]]


def as_token_lists(prompts: Sequence[Any]) -> tuple[list[str], list[list[int]]]:
    """Prompt ids and token id lists from Prompt-like objects, ``(id, ids)`` pairs or lists."""
    ids, toks = [], []
    for i, p in enumerate(prompts):
        if hasattr(p, "token_ids"):
            pid, t = str(getattr(p, "id", i)), list(p.token_ids)
        elif isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            pid, t = p[0], list(p[1])
        else:
            pid, t = str(i), list(p)
        if not t:
            raise ValueError(f"prompt {pid!r} has no tokens")
        ids.append(pid)
        toks.append([int(x) for x in t])
    if len(set(ids)) != len(ids):
        raise ValueError("prompt ids must be unique (they are used to split data by prompt)")
    return ids, toks


def select_positions(
    lengths: Sequence[int],
    positions: PositionSpec,
    named_positions: Mapping[str, Sequence[int]] | None = None,
) -> list[list[int]]:
    """Per-prompt lists of token positions to capture (see the module docstring)."""
    if isinstance(positions, str):
        if positions == "all":
            return [list(range(n)) for n in lengths]
        if positions == "last":
            return [[n - 1] for n in lengths]
        if positions == "skip-first":
            return [list(range(1, n)) for n in lengths]
        names = [s.strip() for s in positions.split(",") if s.strip()]
        named_positions = named_positions or {}
        missing = [n for n in names if n not in named_positions]
        if missing:
            raise ValueError(
                f"positions {positions!r}: unknown name(s) {missing}; use 'all', 'last', "
                f"'skip-first' or names among {sorted(named_positions) or '(none given)'}"
            )
        sel = [[int(named_positions[n][i]) for n in names] for i in range(len(lengths))]
    else:
        sel = [[int(p) for p in row] for row in positions]
        if len(sel) != len(lengths):
            raise ValueError(f"{len(sel)} position lists for {len(lengths)} prompts")
    for i, (row, n) in enumerate(zip(sel, lengths)):
        bad = [p for p in row if not 0 <= p < n]
        if bad:
            raise ValueError(f"prompt {i}: positions {bad} outside its {n} tokens")
    return sel


def iter_activations(
    model: Model,
    token_lists: Sequence[list[int]],
    sites: Sequence[str],
    *,
    selections: Sequence[list[int]] | None = None,
    dtype: str | torch.dtype = "float32",
    batch_size: int = 8,
    offset: int = 0,
    into: Mapping[str, torch.Tensor] | None = None,
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield, per batch of prompts, the selected tokens' activations on the CPU.

    Each dict maps site -> ``[n_selected, *site_shape]`` and has ``prompt_index`` (``offset``
    plus the prompt's index in ``token_lists``), ``position`` and ``token_id``.  With
    ``into`` (site -> preallocated ``[n_selected_total, *site_shape]`` buffers) the hooks write
    every batch's rows straight into the buffers, in order, and the dicts hold only the
    index columns; from a GPU the copies are asynchronous, so synchronise before reading
    them.  When a batch keeps every position (no padding, no selection) its activations are
    not gathered: the one copy is the device-to-host/dtype copy, and on the CPU in the output
    dtype there is none (see :func:`_read_batch`).
    """
    for s in sites:
        model.site_shape(s)  # a SiteError for unknown sites and for [batch, head, q, k] ones
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    out_dtype = resolve_dtype(dtype)
    selections = selections or [list(range(len(t))) for t in token_lists]
    pad_id = int(model.tokenizer.pad_token_id)
    filled = 0
    for start in range(0, len(token_lists), batch_size):
        chunk = token_lists[start : start + batch_size]
        sel = selections[start : start + batch_size]
        ids, mask = (t.to(model.device) for t in pad_batch(chunk, pad_id))
        width = ids.shape[1]
        rows = torch.tensor([i for i, r in enumerate(sel) for _ in r], dtype=torch.long)
        cols = torch.tensor([p for r in sel for p in r], dtype=torch.long)
        flat = (rows * width + cols).to(model.device)
        dense = len(rows) == ids.numel()  # every position of every row, in order
        span = slice(filled, filled + len(rows))
        filled += len(rows)
        batch = _read_batch(model, ids, mask, sites, flat, span, dense, out_dtype, into)
        batch["prompt_index"] = rows + start + offset
        batch["position"] = cols
        batch["token_id"] = ids.cpu()[rows, cols]
        yield batch


def _read_batch(
    model: Model,
    ids: torch.Tensor,
    mask: torch.Tensor,
    sites: Sequence[str],
    flat: torch.Tensor,
    span: slice,
    dense: bool,
    out_dtype: torch.dtype,
    into: Mapping[str, torch.Tensor] | None,
) -> dict[str, Any]:
    """One forward pass reading ``sites``: site -> selected rows (or written into ``into``).

    A dense CPU read of the output dtype keeps the model's own tensor when that tensor owns
    its whole storage (no copy, as the peers do).  The model could still change such a
    tensor in place later in the pass, so the pass runs under ``no_grad`` (which keeps
    version counters, unlike ``inference_mode``) and a batch in which any kept tensor was
    modified is read again with copies.
    """
    kept: dict[str, tuple[torch.Tensor, int]] = {}

    def reader(t: torch.Tensor, site: str, share: bool) -> torch.Tensor | None:
        src = t.reshape(-1, *t.shape[2:])
        if not dense:  # a device_map's later layers may compute on another device
            src = src.index_select(0, flat.to(src.device))
        if into is not None:
            # asynchronous from a GPU into pinned buffers; the caller synchronises
            into[site][span].copy_(src, non_blocking=True)
            return None
        if share and src.device.type == "cpu" and src.dtype == out_dtype and _owns_storage(src):
            kept[site] = (src, src._version)
            return src
        return src.to("cpu", out_dtype, copy=dense)

    for share in (dense and into is None, False):
        kept.clear()
        readers = {s: functools.partial(reader, site=s, share=share) for s in sites}
        with torch.no_grad(), hooked(model, readers) as cache:
            model.forward(ids, mask)
        if all(t._version == v for t, v in kept.values()):
            break
    return {k: v for k, v in cache.items() if v is not None}


def _owns_storage(t: torch.Tensor) -> bool:
    """``t`` is contiguous and its storage holds nothing else (keeping it pins no more)."""
    return t.is_contiguous() and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def collect(
    model: Model,
    prompts: Sequence[Any],
    sites: Sequence[str],
    *,
    positions: PositionSpec = "all",
    named_positions: Mapping[str, Sequence[int]] | None = None,
    dtype: str | torch.dtype = "float32",
    batch_size: int = 8,
) -> dict[str, torch.Tensor]:
    """Activations of a small job in memory: site -> ``[n_tokens, *shape]`` plus indices."""
    _, toks = as_token_lists(prompts)
    sel = select_positions([len(t) for t in toks], positions, named_positions)
    parts = list(
        iter_activations(model, toks, sites, selections=sel, dtype=dtype, batch_size=batch_size)
    )
    return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}


@dataclass
class ModelRef:
    """How to get a model in a worker: the live object in this process, a reload elsewhere."""

    name: str
    device: str = "cpu"
    dtype: str = "float32"
    seed: int = 0
    live: Model | None = field(default=None, repr=False, compare=False)
    #: :attr:`Model.load_options` (device_map, revision, quantization, ...): a worker loads
    #: the same checkpoint placed the same way
    options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, model: Model, seed: int = 0) -> ModelRef:
        dtype = str(model.dtype).removeprefix("torch.")
        return cls(model.name, str(model.device), dtype, seed, model, dict(model.load_options))

    def get(self) -> Model:
        if self.live is None:
            placed = "device_map" in self.options or "quantization" in self.options
            self.live = load_model(
                self.name,
                device=None if placed else self.device,
                dtype=self.dtype,
                seed=self.seed,
                **self.options,
            )
        return self.live

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "live": None}


@dataclass
class _ShardJob:
    """Everything one shard needs; picklable so an executor can run it anywhere."""

    model: ModelRef
    store: str
    token_lists: list[list[int]]
    selections: list[list[int]]
    sites: list[str]
    dtype: str
    batch_size: int
    plan: list[tuple[int, int, int]]

    def __call__(self, index: int) -> dict[str, Any]:
        start, stop, n_tokens = self.plan[index]
        model = self.model.get()
        # the shard's buffers, filled in place by the hooks (no per-batch parts to concatenate)
        dtype = resolve_dtype(self.dtype)
        # page-locked, so device-to-host copies run async (from every GPU of a device_map)
        gpus = [d for d in model.devices if d.type == "cuda"]
        pin = bool(gpus)
        tensors = {
            s: torch.empty((n_tokens, *model.site_shape(s)), dtype=dtype, pin_memory=pin)
            for s in self.sites
        }
        parts = list(
            iter_activations(
                model,
                self.token_lists[start:stop],
                self.sites,
                selections=self.selections[start:stop],
                dtype=self.dtype,
                batch_size=self.batch_size,
                offset=start,
                into=tensors,
            )
        )
        for gpu in gpus:
            torch.cuda.synchronize(gpu)  # the last async copies have landed
        tensors.update({k: torch.cat([p[k] for p in parts]) for k in parts[0]})
        return write_shard(Path(self.store) / f"shard-{index:05d}.safetensors", tensors)


def capture(
    model: Model,
    prompts: Sequence[Any],
    sites: Sequence[str],
    *,
    root: str | Path = "activations",
    positions: PositionSpec = "all",
    named_positions: Mapping[str, Sequence[int]] | None = None,
    dtype: str = "float32",
    batch_size: int = 8,
    shard_mb: float = 256.0,
    data_name: str = "",
    executor: str | Executor | None = None,
    progress: bool = True,
) -> ActivationStore:
    """Capture ``sites`` over ``prompts`` into an activation store under ``root``.

    The store's directory name is a content hash of the model (weights and config), the sites,
    the token data, the positions, the dtype and the shard plan: running the same capture again
    returns the finished store at once, and an interrupted capture resumes, writing only the
    shards that are missing.  Memory use is bounded by one shard (``shard_mb``) whatever the
    number of tokens.

    Parameters
    ----------
    prompts
        Prompt-like objects (``.id`` and ``.token_ids``, e.g. from
        :func:`structlens.data.corpus.chunk_documents`), ``(id, token_ids)`` pairs, or lists of
        token ids (ids become their indices).
    sites
        Site names (``blocks.3.hook_resid_pre``, ...).
    positions, named_positions
        Which tokens to keep (see the module docstring).
    data_name
        A label for the data, recorded in the metadata (not part of the hash: the tokens are).
    """
    sites = list(dict.fromkeys(sites))
    if not sites:
        raise ValueError("name at least one site to capture")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not shard_mb > 0:
        raise ValueError(f"shard_mb must be > 0, got {shard_mb}")
    for s in sites:
        model.site(s)
    prompt_ids, toks = as_token_lists(prompts)
    if not toks:
        raise ValueError("no prompts to capture")
    sel = select_positions([len(t) for t in toks], positions, named_positions)
    shapes = {s: list(model.site_shape(s)) for s in sites}
    elem = torch.tensor([], dtype=resolve_dtype(dtype)).element_size()
    bytes_per_token = elem * sum(int(torch.tensor(v).prod()) for v in shapes.values())
    plan = plan_shards([len(r) for r in sel], bytes_per_token, int(shard_mb * 2**20))
    import hashlib

    data_hash = hashlib.sha256(repr((prompt_ids, toks, sel)).encode()).hexdigest()[:20]
    model_info = {
        "name": model.name,
        "source": model.source,
        "family": model.family.name,
        "fingerprint": model.fingerprint(),
        "n_layers": model.n_layers,
        "d_model": model.d_model,
    }
    key = content_key(
        {
            "model": model_info["fingerprint"],
            "sites": sites,
            "data": data_hash,
            "dtype": dtype,
            "plan": plan,
            "store_format": STORE_FORMAT,
        }
    )
    path = Path(root) / key
    metadata: dict[str, Any] = {
        "store_format": STORE_FORMAT,
        "code_version": structlens.__version__,
        "key": key,
        "model": model_info,
        "sites": shapes,
        "data": {"name": data_name, "fingerprint": data_hash, "n_prompts": len(toks)},
        "positions": positions if isinstance(positions, str) else "explicit",
        "dtype": dtype,
        "n_tokens": sum(len(r) for r in sel),
        "prompt_ids": prompt_ids,
        "shards": [
            {
                "file": f"shard-{i:05d}.safetensors",
                "prompt_start": a,
                "prompt_stop": b,
                "n_tokens": n,
            }
            for i, (a, b, n) in enumerate(plan)
        ],
        "complete": False,
    }
    todo = _prepare_store(path, metadata)
    if not todo:
        return ActivationStore(path)
    job = _ShardJob(ModelRef.of(model), str(path), toks, sel, sites, dtype, batch_size, plan)
    # resident: a distributed executor keeps one loaded model per worker, not one per shard
    results = get_executor(executor).map(
        job, todo, desc=f"capture {len(sites)} sites", progress=progress, resident=True
    )
    for index, digest in zip(todo, results):
        # recorded as each shard lands, so a resume trusts exactly the shards with a digest
        metadata["shards"][index].update(digest)
        write_metadata(path, metadata)
    metadata["complete"] = True
    write_metadata(path, metadata)
    return ActivationStore(path, verify=False)


def _prepare_store(path: Path, metadata: dict[str, Any]) -> list[int]:
    """Create or check the store at ``path``; return the shards that must be (re)written.

    Shard digests of an existing store are kept only where its metadata is intact and plans
    the same shard; every shard is then verified in full, and bad, missing or unrecorded ones
    are deleted and returned (a finished, sound store returns none: a cache hit).
    """
    path.mkdir(parents=True, exist_ok=True)
    try:
        old: dict[str, Any] | None = ActivationStore(path, verify=None).metadata
    except StoreError:
        old = None
    plan_keys = ("file", "prompt_start", "prompt_stop", "n_tokens")
    carried = 0
    for new, prev in zip(metadata["shards"], old["shards"] if old else []):
        if all(new[k] == prev.get(k) for k in plan_keys) and "sha256" in prev:
            new.update(bytes=prev["bytes"], sha256=prev["sha256"])
            carried += 1
    if old and old["complete"] and carried == len(metadata["shards"]):
        if not ActivationStore(path, verify=None).shard_problems(full=True):
            return []  # a sound finished store: cache hit, nothing rewritten
    metadata["complete"] = False
    write_metadata(path, metadata)
    store = ActivationStore(path, verify=None)
    bad = sorted(store.shard_problems(full=True))
    for i in bad:
        store.shard_path(i).unlink(missing_ok=True)
        for k in ("bytes", "sha256"):
            metadata["shards"][i].pop(k, None)
    if not bad:
        metadata["complete"] = True
    write_metadata(path, metadata)
    return bad
