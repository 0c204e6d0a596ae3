"""Neighbor distance minimisation (NDM): learn an orthogonal R and a partition of its columns.

Huang & Hahn, *Decomposing Representation Space into Interpretable Subspaces with Unsupervised
Learning* (ICLR 2026).  Activations ``h`` (rows = samples, width ``d``) are rotated, ``z = h R``,
and the columns of ``z`` are cut into contiguous blocks by a partition ``[d_1, ..., d_S]``.
Training minimises the mean over subspaces of the Euclidean distance from each query to its
nearest key inside that subspace, the keys being a large memory bank that never contains the
query.  Starting from equal small blocks, the KSG mutual information between every pair of
subspaces (divided by ``d_a + d_b``) is estimated periodically; pairs above a threshold are
merged (disjoint pairs, highest first, a few per round), ``R`` is re-based so the merged
rotation spans the same subspaces, and the optimiser restarts.  Training stops when no pair
exceeds the threshold.

``R`` is parametrised as ``B exp(A - A^T)`` with ``B`` fixed (PyTorch's trivialisation of the
orthogonal group); each merge sets ``B`` to the current ``R`` with reordered columns and
``A = 0`` — the reference code's restart.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from structlens.ndm.search import RotatedKeys, neighbor_distance_loss
from structlens.results import Result, atomic_write_bytes, atomic_write_json
from structlens.stats.mutual_info import subspace_mutual_information

ActivationSource = (
    np.ndarray | torch.Tensor | Callable[[], Iterable[torch.Tensor]] | Iterable[torch.Tensor]
)


@dataclasses.dataclass
class NDMConfig:
    """Settings of :class:`NDM` (defaults: the authors' GPT-2 small run, CPU-sized MI sample).

    Attributes
    ----------
    unit_size
        Size of the initial equal subspaces; must divide ``d`` unless ``initial_partition`` is
        given.
    initial_partition
        Explicit starting block sizes (summing to ``d``); overrides ``unit_size``.
    lr, betas
        Adam settings.
    batch_size
        Queries per optimisation step.
    grad_clip
        Gradient-norm clip (``None`` for none).
    max_steps
        Hard limit on optimisation steps.
    bank_size
        Keys in the memory bank searched for neighbours.
    refresh_interval
        Steps served by one memory-bank refresh; each refresh draws ``bank_size`` keys and
        ``refresh_interval * batch_size`` queries, disjoint rows, from the source.
    reproject_interval
        Steps between re-rotating the key bank used to rank candidates (the chosen neighbour is
        always re-scored with the current R).
    rerank
        Candidates per query and subspace whose exact distance picks the neighbour.
    search_chunk
        Keys per matrix product in the search.
    merge_start, merge_interval
        First step at which subspaces may merge, and steps between merge rounds.
    merge_threshold
        Merge when KSG MI / (d_a + d_b) exceeds this (nats per dimension).
    max_merges_per_round
        Cap on merged pairs per round; ``None`` means ``max(1, S // 8)``.
    min_subspaces
        Never merge below this many subspaces.
    mi_k, mi_samples
        KSG neighbours and the number of bank rows the MI is estimated on.
    stop_when_converged
        Stop when a merge round finds no pair above the threshold.
    init
        ``"identity"`` (reference) or ``"random"`` (Haar-random start from ``seed``).
    log_interval
        Steps per entry of the loss history.
    seed
        Seeds the initial rotation and every draw from the source.
    device, dtype
        Where and in which precision activations are searched (R itself is kept in float64).
    """

    unit_size: int = 32
    initial_partition: list[int] | None = None
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.999)
    batch_size: int = 128
    grad_clip: float | None = 100.0
    max_steps: int = 100_000
    bank_size: int = 409_600
    refresh_interval: int = 1_000
    reproject_interval: int = 10
    rerank: int = 8
    search_chunk: int = 65_536
    merge_start: int = 20_000
    merge_interval: int = 8_000
    merge_threshold: float = 0.04
    max_merges_per_round: int | None = None
    min_subspaces: int = 1
    mi_k: int = 1
    mi_samples: int = 4_096
    stop_when_converged: bool = True
    init: Literal["identity", "random"] = "identity"
    log_interval: int = 100
    seed: int = 0
    device: str = "cpu"
    dtype: Literal["float32", "float64"] = "float32"

    def validate(self) -> None:
        """Raise ``ValueError`` on an inconsistent setting."""
        positive = {
            "unit_size": self.unit_size,
            "batch_size": self.batch_size,
            "max_steps": self.max_steps,
            "bank_size": self.bank_size,
            "refresh_interval": self.refresh_interval,
            "reproject_interval": self.reproject_interval,
            "rerank": self.rerank,
            "search_chunk": self.search_chunk,
            "merge_interval": self.merge_interval,
            "min_subspaces": self.min_subspaces,
            "mi_k": self.mi_k,
            "log_interval": self.log_interval,
        }
        for name, value in positive.items():
            if value < 1:
                raise ValueError(f"NDMConfig.{name} must be >= 1, got {value}.")
        if self.mi_samples <= self.mi_k:
            raise ValueError(
                f"NDMConfig.mi_samples ({self.mi_samples}) must exceed mi_k ({self.mi_k})."
            )
        if self.init not in ("identity", "random"):
            raise ValueError(f"NDMConfig.init must be 'identity' or 'random', got {self.init!r}.")
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"NDMConfig.dtype must be 'float32' or 'float64', got {self.dtype!r}.")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class NDMResult(Result):
    """A learned decomposition.

    Attributes
    ----------
    rotation
        Orthogonal ``(d, d)`` float64 matrix ``R``; rotated activations are ``z = h @ R`` and
        subspace ``s`` is the column block ``partition[s]`` of ``R`` (sizes in descending order).
    partition
        Subspace sizes summing to ``d``.
    merge_history
        One entry per merge round: ``step``, merged ``pairs`` (indices into the partition
        before the round), their normalised ``mi``, ``partition_before``, ``partition_after``.
    steps
        Optimisation steps taken.
    converged
        Whether training stopped because no subspace pair exceeded the merge threshold.
    loss_history
        Mean loss over each ``log_interval`` steps.
    config
        The :class:`NDMConfig` as a dict.
    """

    rotation: np.ndarray
    partition: list[int]
    merge_history: list[dict[str, Any]]
    steps: int
    converged: bool
    loss_history: list[float]
    config: dict[str, Any]

    def bases(self) -> list[np.ndarray]:
        """Orthonormal basis ``(d, d_s)`` of every subspace (column blocks of ``rotation``)."""
        bounds = np.concatenate([[0], np.cumsum(self.partition)])
        return [self.rotation[:, bounds[s] : bounds[s + 1]] for s in range(len(self.partition))]

    def project(self, h: np.ndarray) -> list[np.ndarray]:
        """Coordinates of activations ``h`` (``(n, d)``) in every subspace."""
        return [np.asarray(h) @ basis for basis in self.bases()]

    def training_record(self, n_activations: int, seconds: float) -> dict[str, Any]:
        """The JSON record of one layer's run in ``ndm_train.json`` (without the rotation)."""
        return {
            "partition": self.partition,
            "steps": self.steps,
            "converged": self.converged,
            "merge_history": self.merge_history,
            "loss_history": self.loss_history,
            "config": self.config,
            "n_activations": int(n_activations),
            "seconds": seconds,
            "queries_per_second": self.steps * self.config["batch_size"] / max(seconds, 1e-9),
        }


class _Rotation(torch.nn.Module):
    """``R = B exp(A - A^T)`` in float64: orthogonal for any ``A``; ``B`` is fixed."""

    def __init__(self, base: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("base", base.to(torch.float64).clone())
        self.A = torch.nn.Parameter(torch.zeros_like(self.base))

    def forward(self) -> torch.Tensor:
        return self.base @ torch.linalg.matrix_exp(self.A - self.A.T)


class _Feed:
    """Draws disjoint key banks and query pools from an in-memory array or a tensor stream.

    Its only randomness is a ``torch.Generator``; its state before the latest draw and the
    stream position then are what a checkpoint needs to rebuild the same bank.
    """

    def __init__(self, source: ActivationSource, seed: int) -> None:
        self.pool: torch.Tensor | None = None
        self.factory: Callable[[], Iterable[torch.Tensor]] | None = None
        if isinstance(source, (np.ndarray, torch.Tensor)):
            pool = torch.as_tensor(source)
            if pool.ndim != 2:
                raise ValueError(
                    f"activations must have shape (n_samples, d), got {tuple(pool.shape)}."
                )
            self.pool = pool
        elif callable(source):
            self.factory = source
        elif isinstance(source, Iterable):
            if iter(source) is source:
                raise ValueError(
                    "source is a one-shot iterator; pass a re-iterable (list, store) or a "
                    "callable returning a fresh iterator, so the bank can be refreshed and resumed."
                )
            self.factory = lambda: source
        else:
            raise ValueError(
                "source must be an (n, d) array/tensor, an iterable of (rows, d) tensors, or a "
                f"callable returning such an iterable; got {type(source).__name__}."
            )
        self.generator = torch.Generator().manual_seed(seed)
        self.epoch = 0
        self.position = 0
        self._iterator: Iterator[torch.Tensor] | None = None

    def state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "position": self.position}

    def restore(self, state: dict[str, Any], generator_state: torch.Tensor) -> None:
        self.generator.set_state(generator_state)
        self.epoch = int(state["epoch"])
        self.position = 0
        self._iterator = None
        if self.factory is not None:
            self._iterator = iter(self.factory())
            for _ in range(int(state["position"])):
                next(self._iterator)
            self.position = int(state["position"])

    def _next_tensor(self) -> torch.Tensor:
        assert self.factory is not None
        if self._iterator is None:
            self._iterator = iter(self.factory())
        try:
            t = next(self._iterator)
        except StopIteration:
            self.epoch += 1
            self.position = 0
            self._iterator = iter(self.factory())
            try:
                t = next(self._iterator)
            except StopIteration:
                raise ValueError("the activation source yielded no tensors.") from None
        self.position += 1
        return torch.as_tensor(t)

    def draw(self, n_rows: int) -> torch.Tensor:
        """``n_rows`` activation rows in random order (no row repeated)."""
        if self.pool is not None:
            if self.pool.shape[0] < n_rows:
                raise ValueError(
                    f"a refresh needs {n_rows} rows (bank_size + refresh_interval * batch_size) "
                    f"but the activations hold {self.pool.shape[0]}; lower bank_size or "
                    "refresh_interval, or supply more activations."
                )
            idx = torch.randperm(self.pool.shape[0], generator=self.generator)[:n_rows]
            return self.pool[idx]
        parts, have = [], 0
        while have < n_rows:
            t = self._next_tensor()
            if t.ndim != 2:
                raise ValueError(f"source tensors must be (rows, d), got {tuple(t.shape)}.")
            parts.append(t)
            have += t.shape[0]
        rows = torch.cat(parts)[:n_rows] if len(parts) > 1 else parts[0][:n_rows]
        return rows[torch.randperm(n_rows, generator=self.generator)]


class NDM:
    """Neighbor distance minimisation trainer.

    Examples
    --------
    >>> h = np.random.default_rng(0).standard_normal((6000, 8)).astype(np.float32)
    >>> cfg = NDMConfig(unit_size=2, batch_size=32, max_steps=20, bank_size=2000,
    ...                 refresh_interval=10, merge_start=10, merge_interval=10, mi_samples=500)
    >>> result = NDM(cfg).fit(h)
    >>> sum(result.partition)
    8
    """

    def __init__(self, config: NDMConfig | None = None) -> None:
        self.config = config or NDMConfig()
        self.config.validate()

    def fit(
        self,
        source: ActivationSource,
        *,
        checkpoint_dir: str | Path | None = None,
        checkpoint_every: int = 1_000,
        resume: bool = True,
        stop_at_step: int | None = None,
        progress: Callable[[int, float, list[int]], None] | None = None,
    ) -> NDMResult:
        """Train on activations and return the rotation and partition.

        Parameters
        ----------
        source
            Activations, rows = samples, width ``d``: an ``(n, d)`` array or tensor (rows drawn
            at random under the seed), an iterable of ``(rows, d)`` tensors that can be iterated
            again (e.g. an activation store), or a callable returning a fresh iterable; streams
            are read in order, restarted when exhausted, and each refresh's rows are shuffled.
        checkpoint_dir
            Where to write ``checkpoint.safetensors`` + ``checkpoint.json`` every
            ``checkpoint_every`` steps, at merges and at the end.  With ``resume``, training
            continues from a checkpoint found there and gives the same result as an
            uninterrupted run with the same source and config.
        stop_at_step
            Stop (and checkpoint) once this many steps are done, as for a time-limited job.
        progress
            Called every ``log_interval`` steps with ``(step, mean loss, partition)``.
        """
        cfg = self.config
        device = torch.device(cfg.device)
        dtype = torch.float32 if cfg.dtype == "float32" else torch.float64
        feed = _Feed(source, cfg.seed)
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        state = _load_checkpoint(ckpt) if (ckpt is not None and resume) else None

        if state is None:
            d = self._peek_width(feed)
            partition = self._initial_partition(d)
            base = self._initial_rotation(d)
            step, history, losses, converged = 0, [], [], False
            rotation = _Rotation(base).to(device)
            optimizer = self._optimizer(rotation)
            gen_state = feed.generator.get_state()
            feed_state = feed.state()
            keys, queries = self._refresh(feed, device, dtype)
            key_rotation = rotation().detach()
        else:
            meta, arrays = state
            if meta["config"] != _jsonable_config(cfg):
                raise ValueError(
                    f"checkpoint in {ckpt} was written with a different NDMConfig; "
                    "resume with the same config or use a fresh checkpoint_dir."
                )
            partition = list(meta["partition"])
            step, history = int(meta["step"]), list(meta["merge_history"])
            losses, converged = list(meta["loss_history"]), bool(meta["converged"])
            rotation = _Rotation(arrays["base"]).to(device)
            with torch.no_grad():
                rotation.A.copy_(arrays["A"])
            optimizer = self._optimizer(rotation)
            if "exp_avg" in arrays:
                optimizer.load_state_dict(
                    {
                        "state": {
                            0: {
                                "step": arrays["adam_step"].reshape(()),
                                "exp_avg": arrays["exp_avg"].to(device),
                                "exp_avg_sq": arrays["exp_avg_sq"].to(device),
                            }
                        },
                        "param_groups": optimizer.state_dict()["param_groups"],
                    }
                )
            gen_state = arrays["generator"]
            feed_state = meta["feed"]
            feed.restore(feed_state, gen_state)
            keys, queries = self._refresh(feed, device, dtype)
            key_rotation = arrays["key_rotation"].to(device)
        bank = RotatedKeys(keys, key_rotation, partition, cfg.search_chunk)
        steps_since_refresh = int(meta["steps_since_refresh"]) if state is not None else 0
        running: list[float] = list(meta["running"]) if state is not None else []

        def save() -> None:
            if ckpt is None:
                return
            _save_checkpoint(
                ckpt,
                cfg=cfg,
                rotation=rotation,
                optimizer=optimizer,
                key_rotation=bank.rotation,
                generator_state=gen_state,
                feed_state=feed_state,
                partition=partition,
                step=step,
                steps_since_refresh=steps_since_refresh,
                history=history,
                losses=losses,
                running=running,
                converged=converged,
            )

        limit = cfg.max_steps if stop_at_step is None else min(cfg.max_steps, stop_at_step)
        while step < limit and not converged:
            if steps_since_refresh == cfg.refresh_interval:
                gen_state = feed.generator.get_state()
                feed_state = feed.state()
                keys, queries = self._refresh(feed, device, dtype)
                bank = RotatedKeys(keys, rotation().detach(), partition, cfg.search_chunk)
                steps_since_refresh = 0
            elif step % cfg.reproject_interval == 0 and step > 0:
                bank = RotatedKeys(keys, rotation().detach(), partition, cfg.search_chunk)

            q = queries[
                steps_since_refresh * cfg.batch_size : (steps_since_refresh + 1) * cfg.batch_size
            ]
            R = rotation()
            neighbors = bank.nearest(q, R.detach(), cfg.rerank)
            loss = neighbor_distance_loss(q, keys, neighbors, R, partition)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_([rotation.A], cfg.grad_clip)
            optimizer.step()
            step += 1
            steps_since_refresh += 1
            running.append(float(loss.detach()))
            if len(running) == cfg.log_interval:
                losses.append(float(np.mean(running)))
                running = []
                if progress is not None:
                    progress(step, losses[-1], list(partition))

            if step >= cfg.merge_start and (step - cfg.merge_start) % cfg.merge_interval == 0:
                with torch.no_grad():
                    R_now = rotation().detach()
                entry = self._merge_round(keys, R_now, partition, step)
                if entry is None:
                    converged = cfg.stop_when_converged
                else:
                    history.append(entry)
                    perm = entry.pop("_perm")
                    partition = entry["partition_after"]
                    rotation = _Rotation(R_now[:, perm]).to(device)
                    optimizer = self._optimizer(rotation)
                    bank = RotatedKeys(keys, rotation().detach(), partition, cfg.search_chunk)
                save()
            elif ckpt is not None and step % checkpoint_every == 0:
                save()
        save()
        with torch.no_grad():
            R_final = rotation().detach().cpu().numpy()
        return NDMResult(
            rotation=R_final,
            partition=list(partition),
            merge_history=history,
            steps=step,
            converged=converged,
            loss_history=losses,
            config=_jsonable_config(cfg),
        )

    def _optimizer(self, rotation: _Rotation) -> torch.optim.Adam:
        return torch.optim.Adam([rotation.A], lr=self.config.lr, betas=self.config.betas)

    def _peek_width(self, feed: _Feed) -> int:
        if feed.pool is not None:
            return int(feed.pool.shape[1])
        assert feed.factory is not None
        for t in feed.factory():
            return int(torch.as_tensor(t).shape[-1])
        raise ValueError("the activation source yielded no tensors.")

    def _initial_partition(self, d: int) -> list[int]:
        cfg = self.config
        if cfg.initial_partition is not None:
            sizes = [int(s) for s in cfg.initial_partition]
            if sum(sizes) != d or any(s < 1 for s in sizes):
                raise ValueError(
                    f"initial_partition {sizes} must hold positive sizes summing to d={d} "
                    f"(it sums to {sum(sizes)})."
                )
            return sorted(sizes, reverse=True)
        if d % cfg.unit_size:
            raise ValueError(
                f"unit_size={cfg.unit_size} does not divide d={d}; choose a divisor of d or "
                "give initial_partition explicitly."
            )
        return [cfg.unit_size] * (d // cfg.unit_size)

    def _initial_rotation(self, d: int) -> torch.Tensor:
        if self.config.init == "identity":
            return torch.eye(d, dtype=torch.float64)
        g = torch.Generator().manual_seed(self.config.seed)
        q, r = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=torch.float64))
        return q * torch.sign(torch.diagonal(r))

    def _refresh(
        self, feed: _Feed, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        n_queries = cfg.refresh_interval * cfg.batch_size
        rows = feed.draw(cfg.bank_size + n_queries).to(device=device, dtype=dtype)
        if not bool(torch.isfinite(rows).all()):
            raise ValueError("activations contain NaN or infinite values; clean the source.")
        return rows[: cfg.bank_size].contiguous(), rows[cfg.bank_size :].contiguous()

    def _merge_round(
        self, keys: torch.Tensor, R: torch.Tensor, partition: list[int], step: int
    ) -> dict[str, Any] | None:
        cfg = self.config
        n_sub = len(partition)
        if n_sub <= cfg.min_subspaces:
            return None
        z = keys[: cfg.mi_samples].to(torch.float64) @ R.to(keys.device)
        mi = subspace_mutual_information(z, partition, k=cfg.mi_k, standardize=True, normalize=True)
        cap = cfg.max_merges_per_round or max(1, n_sub // 8)
        cap = min(cap, n_sub - cfg.min_subspaces)
        candidates = sorted(
            ((mi[a, b], a, b) for a in range(n_sub) for b in range(a + 1, n_sub)),
            reverse=True,
        )
        used: set[int] = set()
        pairs: list[tuple[int, int, float]] = []
        for value, a, b in candidates:
            if value <= cfg.merge_threshold or len(pairs) == cap:
                break
            if a in used or b in used:
                continue
            used.update((a, b))
            pairs.append((a, b, float(value)))
        if not pairs:
            return None
        bounds = np.concatenate([[0], np.cumsum(partition)])
        groups = [
            list(range(bounds[a], bounds[a + 1])) + list(range(bounds[b], bounds[b + 1]))
            for a, b, _ in pairs
        ]
        groups += [list(range(bounds[s], bounds[s + 1])) for s in range(n_sub) if s not in used]
        groups.sort(key=len, reverse=True)  # stable: merged pairs first among equal sizes
        perm = [c for g in groups for c in g]
        return {
            "step": step,
            "pairs": [[a, b] for a, b, _ in pairs],
            "mi": [v for _, _, v in pairs],
            "max_mi": float(max(v for v, _, _ in candidates)),
            "partition_before": list(partition),
            "partition_after": [len(g) for g in groups],
            "_perm": perm,
        }


def _jsonable_config(cfg: NDMConfig) -> dict[str, Any]:
    return json.loads(json.dumps(cfg.to_dict()))


def _save_checkpoint(
    directory: Path,
    *,
    cfg: NDMConfig,
    rotation: _Rotation,
    optimizer: torch.optim.Adam,
    key_rotation: torch.Tensor,
    generator_state: torch.Tensor,
    feed_state: dict[str, Any],
    partition: list[int],
    step: int,
    steps_since_refresh: int,
    history: list[dict[str, Any]],
    losses: list[float],
    running: list[float],
    converged: bool,
) -> None:
    from safetensors.torch import save

    tensors = {
        "base": rotation.base.detach().cpu().contiguous(),
        "A": rotation.A.detach().cpu().contiguous(),
        "key_rotation": key_rotation.detach().cpu().contiguous(),
        "generator": generator_state.clone(),
    }
    adam = optimizer.state.get(rotation.A)
    if adam:
        tensors["exp_avg"] = adam["exp_avg"].detach().cpu().contiguous()
        tensors["exp_avg_sq"] = adam["exp_avg_sq"].detach().cpu().contiguous()
        tensors["adam_step"] = torch.as_tensor(adam["step"], dtype=torch.float32).reshape(1)
    atomic_write_bytes(directory / "checkpoint.safetensors", save(tensors))
    atomic_write_json(
        directory / "checkpoint.json",
        {
            "config": _jsonable_config(cfg),
            "partition": partition,
            "step": step,
            "steps_since_refresh": steps_since_refresh,
            "feed": feed_state,
            "merge_history": history,
            "loss_history": losses,
            "running": running,
            "converged": converged,
        },
    )


def _load_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]] | None:
    from safetensors.torch import load_file

    meta_path = directory / "checkpoint.json"
    if not meta_path.exists():
        return None
    meta = json.loads(meta_path.read_text())
    arrays = load_file(str(directory / "checkpoint.safetensors"))
    return meta, arrays


def subspace_variances(
    h: np.ndarray | torch.Tensor, rotation: np.ndarray, partition: Sequence[int]
) -> list[float]:
    """Total variance of the activations inside each subspace (for variance-normalised Gini).

    ``h`` is ``(n, d)`` (rows = samples); returns ``sum_c var(z[:, c])`` over each block's
    columns of ``z = h @ rotation``.
    """
    z = np.asarray(h, dtype=np.float64) @ np.asarray(rotation, dtype=np.float64)
    var = z.var(0)
    bounds = np.concatenate([[0], np.cumsum(partition)])
    return [float(var[bounds[s] : bounds[s + 1]].sum()) for s in range(len(partition))]
