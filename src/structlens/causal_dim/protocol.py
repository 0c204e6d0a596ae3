"""The causal-dimensionality protocol: every scientific choice of exact κ and the SAE width
sweep, in one place.

A :class:`CausalProtocol` is frozen and validated at construction.  The ``causal-dim`` CLI,
``structlens analyze`` and the causal-dimension replication build one instance each (the CLI
from ``--protocol`` and its options, ``analyze`` and the replication from their profiles,
:data:`PROFILES`) and hand it to the stages of :mod:`structlens.causal_dim.stages`, which are
the only code that turns a model into κ and sweep numbers.  Two drivers given equal
protocols therefore give equal stage results.

Prompt sets
    The corpus is cut into chunks of ``chunk_tokens`` tokens (full chunks only); every
    ``holdout_every``-th chunk is held out of SAE training (every shorter stride's chunk
    where that holds out fewer than the evaluation and CE prompts need: a tokenizer with a
    larger vocabulary cuts the corpus into fewer chunks).  SAEs train on the first
    ``sae_train_prompts`` other chunks and on ``sae_train_extra`` further ones after those the
    evaluation takes (null: every one left); the sweep evaluates on the first
    ``sae_eval_prompts`` held-out chunks plus ``sae_eval_extra`` training-side chunks left over
    after the training prompts; CE recovered uses the next ``ce_prompts`` held-out chunks.
    These three sets are disjoint by construction (and checked).  ``sae_generated_prompts``
    texts sampled from the model itself, each continuing the first ``sae_generated_prefix``
    tokens of a training chunk, are added to SAE training (never to evaluation: their prefixes
    are training text).
Exact κ
    One residual vector per window of ``jacobian_tokens`` tokens (the window's last token),
    windows cut from chunks ``jacobian_gap`` tokens apart and ordered chunk-major, held-out
    chunks first: the first vectors all come from different chunks.  κ involves no SAE, so
    once the held-out chunks are used up the windows continue into SAE training chunks.
    Vectors are doubled from ``kappa_start`` until κ is identified within a factor
    ``kappa_tolerance`` (the interval, raised by the bias left after the jackknife's
    correction, within ``±(kappa_tolerance − 1)·κ``) or ``kappa_max_vectors``; point and
    interval are the bias-corrected delete-a-group jackknife over ``kappa_unit`` (windows of
    one chunk share text, so the chunk is the unit).
Width sweep
    TopK SAEs of ``sweep_widths`` (the base at least ``min_base_width_ratio · d``) trained to
    convergence of a held-out tenth of the training rows; AtP on the LM loss over the
    evaluation prompts in ``sweep_blocks`` prompt blocks (the resampling unit is the prompt),
    ε at ``percentile`` of the base width, ``sweep_bootstrap`` resamples.

>>> p = CausalProtocol(sweep_widths=(256, 512))
>>> p.sweep_widths
(256, 512)
>>> CausalProtocol(kappa_unit="token")
Traceback (most recent call last):
...
structlens.errors.InputError: kappa_unit must be 'chunk' or 'vector'; got 'token'.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structlens.config import Protocol, Settings, described
from structlens.errors import InputError

__all__ = ["CausalProtocol", "PROFILES", "REPLICATION_PROFILES", "ReplicationProfile"]

_CHOICES = {
    "jacobian_output": ("log_probs", "raw"),
    "jacobian_positions": ("same", "downstream"),
    "kappa_unit": ("chunk", "vector"),
}


@dataclass(frozen=True)
class CausalProtocol(Protocol):
    """Every scientific choice of exact κ and the SAE width sweep (see the module docstring).

    Each field's ``metadata["help"]`` says what it sets (the CLI's option help);
    :meth:`key` is a digest of the canonical JSON, the part of a stage's cache key that the
    protocol contributes.
    """

    chunk_tokens: int = described(128, "Tokens of every corpus chunk (full chunks only).")
    holdout_every: int = described(20, "Every n-th corpus chunk is held out of SAE training.")
    sae_train_prompts: int = described(760, "Corpus chunks the SAEs train on.")
    sae_train_extra: int | None = described(
        None,
        "Further non-held-out chunks the SAEs train on, after those the evaluation takes "
        "(null: every one the corpus has left; 0: none).",
    )
    sae_generated_prompts: int = described(
        760,
        "Texts of chunk_tokens tokens sampled from the model itself (temperature 1, seeded), "
        "each continuing a training chunk's first sae_generated_prefix tokens, added to SAE "
        "training.",
    )
    sae_generated_prefix: int = described(
        8, "Tokens of a training chunk that a generated text continues."
    )
    sae_eval_prompts: int = described(36, "Held-out chunks the width sweep evaluates on.")
    sae_eval_extra: int = described(
        12, "Training-side chunks left over after the training prompts, added to evaluation."
    )
    ce_prompts: int = described(8, "Held-out chunks (after the evaluation ones) of CE recovered.")
    jacobian_tokens: int = described(24, "Tokens of every Jacobian window.")
    jacobian_gap: int = described(2, "Tokens skipped between the windows of one chunk.")
    jacobian_output: str = described(
        "log_probs", "Σ of the next-token 'log_probs' or of the 'raw' logits."
    )
    jacobian_positions: str = described(
        "same", "Outputs at the 'same' (last) position or at every 'downstream' one."
    )
    kappa_start: int = described(16, "Residual vectors per layer before the first doubling.")
    kappa_max_vectors: int = described(128, "Residual vectors per layer at most (the cap).")
    kappa_tolerance: float = described(
        1.05, "κ is identified once its interval and residual bias lie within this factor."
    )
    kappa_unit: str = described(
        "chunk", "Jackknife unit of κ: the corpus 'chunk' a window comes from, or the 'vector'."
    )
    kappa_ci: float = described(0.95, "Level of κ's jackknife t interval.")
    kappa_curve_draws: int = described(10, "Random subsets per size of the few-vector curve.")
    sweep_widths: tuple[int, ...] = described(
        (2304, 4608, 9216, 18432), "SAE widths of the sweep (ascending, at least two)."
    )
    sweep_width_ratios: tuple[float, ...] | None = described(
        None,
        "SAE widths as multiples of d (null: sweep_widths); a model's protocol "
        "(for_model) has the widths they give, the same sweep at any width of model.",
    )
    min_base_width_ratio: float = described(
        4.0, "The base (smallest) width must be at least this times d (0: no check)."
    )
    sae_k: int = described(32, "Active features of the TopK SAEs.")
    sae_lr_base: float = described(
        5e-4, "Learning rate at width 2^14 (scaled by 1/sqrt(width / 2^14))."
    )
    sae_batch_size: int = described(256, "SAE training batch (tokens).")
    sae_max_epochs: int = described(10, "Epochs at most; training stops on a held-out plateau.")
    sae_converge_tol: float = described(
        0.01, "Stop once the held-out FVU improves by less than this (relative) in an epoch."
    )
    sae_dead_tokens: int = described(
        25_000, "Tokens without firing after which a feature is dead (gets the AuxK loss)."
    )
    sae_train_tokens: int | None = described(
        None, "Cap on the training tokens each SAE sees (null: all)."
    )
    massive_norm_factor: float = described(
        10.0, "Training rows with a norm above this times the median are left out."
    )
    fvu_rise_tol: float = described(
        0.01,
        "A rise of held-out FVU with width below this share of the narrower width's FVU (plus "
        "1.645 standard errors over prompt blocks) does not fail the sweep gate.",
    )
    depth_k_ladder: tuple[int, ...] = described(
        (4, 8, 16, 32, 64, 128),
        "TopK k values the ε-by-depth SAEs may take besides sae_k, where the search starts "
        "(ascending; those above the SAE width are skipped).",
    )
    depth_k_trials: int = described(
        3, "SAE trainings per depth layer at most in the search for a k of matched FVU."
    )
    depth_fvu_tol: float = described(
        0.02,
        "The k search stops once a depth SAE's held-out FVU is within this of the sweep layer's.",
    )
    percentile: float = described(98.0, "ε is this percentile of the base width's |AtP|.")
    min_count: int = described(1, "Firings a feature needs to count in N_repr.")
    sweep_bootstrap: int = described(200, "Bootstrap resamples of prompt blocks in the sweep.")
    sweep_blocks: int = described(
        64, "Prompt blocks the sweep resamples (each holds whole prompts)."
    )
    seed: int = described(0, "Seed of SAE initialisation, batches, curves and resamples.")

    def __post_init__(self) -> None:
        self.check_types()
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise InputError(
                    f"{name} must be {' or '.join(repr(a) for a in allowed)}; got {value!r}."
                )
        self.check_counts(
            {
                "chunk_tokens": 2, "holdout_every": 2, "sae_train_prompts": 1,
                "sae_eval_prompts": 1, "sae_eval_extra": 0, "ce_prompts": 0,
                "jacobian_tokens": 1, "jacobian_gap": 0, "kappa_start": 2,
                "kappa_max_vectors": 2, "kappa_curve_draws": 1, "sae_k": 1,
                "sae_batch_size": 2, "sae_max_epochs": 1, "sae_dead_tokens": 1,
                "min_count": 1, "sweep_bootstrap": 0, "sweep_blocks": 1, "seed": 0,
                "sae_generated_prompts": 0, "sae_generated_prefix": 1, "depth_k_trials": 1,
            }
        )  # fmt: skip
        if self.sae_train_extra is not None and self.sae_train_extra < 0:
            raise InputError(f"sae_train_extra must be null or >= 0; got {self.sae_train_extra}.")
        if self.sae_generated_prefix >= self.chunk_tokens:
            raise InputError(
                f"sae_generated_prefix ({self.sae_generated_prefix}) must be below chunk_tokens "
                f"({self.chunk_tokens}): a generated text continues a chunk's first tokens."
            )
        if self.jacobian_tokens > self.chunk_tokens:
            raise InputError(
                f"jacobian_tokens ({self.jacobian_tokens}) must not exceed chunk_tokens "
                f"({self.chunk_tokens}): windows are cut from chunks."
            )
        if self.kappa_start > self.kappa_max_vectors:
            raise InputError(
                f"kappa_start ({self.kappa_start}) must not exceed kappa_max_vectors "
                f"({self.kappa_max_vectors})."
            )
        if not self.kappa_tolerance > 1:
            raise InputError(f"kappa_tolerance must exceed 1; got {self.kappa_tolerance}.")
        for name in ("kappa_ci", "sae_converge_tol", "fvu_rise_tol", "depth_fvu_tol"):
            if not 0 < getattr(self, name) < 1:
                raise InputError(f"{name} must lie in (0, 1); got {getattr(self, name)}.")
        if not 0 < self.percentile < 100:
            raise InputError(f"percentile must lie in (0, 100); got {self.percentile}.")
        widths = self.sweep_widths
        if len(widths) < 2 or min(widths) < 1 or list(widths) != sorted(set(widths)):
            raise InputError(
                f"sweep_widths must be at least two ascending distinct widths >= 1; got "
                f"{list(widths)}."
            )
        ratios = self.sweep_width_ratios
        if ratios is not None and (
            len(ratios) < 2 or min(ratios) <= 0 or list(ratios) != sorted(set(ratios))
        ):
            raise InputError(
                f"sweep_width_ratios must be at least two ascending distinct multiples of d "
                f"above 0 (or null); got {list(ratios)}."
            )
        if self.min_base_width_ratio < 0 or self.massive_norm_factor <= 1:
            raise InputError(
                "min_base_width_ratio must be >= 0 and massive_norm_factor > 1; got "
                f"{self.min_base_width_ratio} and {self.massive_norm_factor}."
            )
        if not (self.sae_lr_base > 0):
            raise InputError(f"sae_lr_base must be > 0; got {self.sae_lr_base}.")
        if self.sae_train_tokens is not None and self.sae_train_tokens < self.sae_batch_size:
            raise InputError(
                f"sae_train_tokens must be null or at least sae_batch_size "
                f"({self.sae_batch_size}); got {self.sae_train_tokens}."
            )
        self._check_depth_rule()

    def _check_depth_rule(self) -> None:
        """The k ladder of ε by depth: ascending distinct positive integers."""
        ladder = self.depth_k_ladder
        if not ladder or min(ladder) < 1 or list(ladder) != sorted(set(ladder)):
            raise InputError(
                f"depth_k_ladder must be ascending distinct integers >= 1; got {list(ladder)}."
            )

    def sae_config(
        self,
        width: int,
        architecture: str = "topk",
        target_l0: float | None = None,
        k: int | None = None,
    ) -> Any:
        """The :class:`~structlens.sae.SAETrainConfig` of one SAE of this protocol (TopK at
        ``sae_k``, or ``k`` for ε by depth, in the sweep; other architectures at a matched
        ``target_l0`` for the controls)."""
        from structlens.sae import SAETrainConfig

        return SAETrainConfig(
            architecture=architecture, d_sae=int(width), k=self.sae_k if k is None else int(k),
            target_l0=target_l0, lr_base=self.sae_lr_base, seed=self.seed,
            dead_tokens=self.sae_dead_tokens,
        )  # fmt: skip

    def width_sweep(self, d_model: int | None, *, n_bootstrap: int | None = None) -> Any:
        """The :class:`~structlens.causal_dim.sweep.WidthSweepConfig` of the sweep analysis
        (``d_model`` enables the base-width check)."""
        from structlens.causal_dim.sweep import WidthSweepConfig

        return WidthSweepConfig(
            percentile=self.percentile, min_count=self.min_count,
            n_bootstrap=self.sweep_bootstrap if n_bootstrap is None else n_bootstrap,
            seed=self.seed, d_model=d_model, min_base_width_ratio=self.min_base_width_ratio,
            fvu_rise_tol=self.fvu_rise_tol,
        )  # fmt: skip

    def for_model(self, d_model: int) -> CausalProtocol:
        """This protocol for a model of width ``d_model``: ``sweep_widths`` the multiples
        ``sweep_width_ratios`` of ``d_model`` (rounded) where they are set, else itself.

        >>> CausalProtocol(sweep_width_ratios=(4, 8)).for_model(640).sweep_widths
        (2560, 5120)
        """
        if self.sweep_width_ratios is None:
            return self
        return self.replace(
            sweep_widths=tuple(int(round(r * d_model)) for r in self.sweep_width_ratios)
        )

    def check_widths(self, d_model: int) -> None:
        """A one-line :class:`InputError` when the base width is below the protocol's
        ``min_base_width_ratio · d_model`` (before any SAE is trained)."""
        need = self.min_base_width_ratio * d_model
        if self.sweep_widths[0] < need:
            raise InputError(
                f"the base width {self.sweep_widths[0]} is below {self.min_base_width_ratio:g}·d "
                f"= {need:g} (d = {d_model}); start the sweep at >= {need:g} "
                "(ε is the base width's own percentile, so a narrow base pins the curve)."
            )


_PAPER = CausalProtocol()
_GPU = _PAPER.replace(
    sweep_widths=(2304, 4608, 9216, 18432, 36864, 73728, 147456),
    kappa_start=64, kappa_max_vectors=2048, sae_batch_size=4096, sae_max_epochs=100,
    sae_dead_tokens=100_000, sae_generated_prompts=3040,
)  # fmt: skip
_SMOKE = _PAPER.replace(
    chunk_tokens=32, sae_train_prompts=40, sae_eval_prompts=8, sae_eval_extra=4,
    ce_prompts=4, jacobian_tokens=8, kappa_start=2, kappa_max_vectors=8,
    kappa_curve_draws=3, sweep_widths=(256, 512, 1024), sae_k=4, sae_batch_size=64,
    sae_max_epochs=3, sae_dead_tokens=1000, sweep_bootstrap=20, sweep_blocks=8,
    sae_train_extra=8, sae_generated_prompts=16, depth_k_ladder=(1, 2, 4, 8, 16),
    depth_k_trials=2,
)  # fmt: skip

#: The protocol instances the drivers start from.  ``paper`` is the paper's protocol at the
#: replication's CPU sizes (SmolLM2-135M, d = 576: base width 4·d up to 8× it; SAEs on the
#: whole non-held-out corpus and as many generated texts as training chunks); ``gpu`` widens
#: the sweep to the paper's 64× span and the κ vector cap, and generates four times as many
#: texts; ``smoke`` shrinks the sizes for the tiny test model (d = 64) and keeps every rule.
PROFILES: dict[str, CausalProtocol] = {"paper": _PAPER, "gpu": _GPU, "smoke": _SMOKE}


#: SAE architectures the replication's controls may train beside TopK.
CONTROL_ARCHITECTURES = ("jumprelu", "relu", "batchtopk", "gated")


@dataclass(frozen=True)
class ReplicationProfile(Settings):
    """One profile of the causal-dimension replication: its model, the protocol of exact κ
    and the width sweep, and the layers and widths of the sections only the replication runs
    (CE recovered, the architecture controls and their growth, ε by depth, the four cells,
    IOI, the synthetic model).  Frozen and checked at construction.

    ``ablation_width`` (the four-cell and architecture controls) and ``depth_width`` are
    widths of the protocol's sweep; ``arch_sweep_widths`` are the widths of the controls'
    growth sweeps at matched L0 (empty: no growth section); ``ioi_prompts`` 0 leaves IOI out.
    ``cross_family`` names a model of another family whose exact κ is measured at the
    layers of matched relative depth (``None``: no cross-family section).
    """

    profile: str
    model: str
    protocol: CausalProtocol
    jacobian_layers: tuple[int, ...]
    sweep_layer: int
    ablation_width: int
    arch_controls: tuple[str, ...]
    arch_sweep_widths: tuple[int, ...]
    depth_layers: tuple[int, ...]
    depth_width: int
    ioi_prompts: int
    seed: int
    synthetic_steps: int
    cross_family: str | None = None

    def __post_init__(self) -> None:
        if self.cross_family == self.model:
            raise InputError(
                f"cross_family must name another model than {self.model!r}, or be None."
            )
        widths = self.protocol.sweep_widths
        for name in ("ablation_width", "depth_width"):
            if getattr(self, name) not in widths:
                raise InputError(
                    f"{name} must be one of the protocol's sweep_widths {list(widths)}; got "
                    f"{getattr(self, name)}."
                )
        unknown = sorted(set(self.arch_controls) - set(CONTROL_ARCHITECTURES))
        if unknown:
            raise InputError(
                f"arch_controls {unknown} are not SAE architectures; use some of "
                f"{list(CONTROL_ARCHITECTURES)}."
            )
        layers = (*self.jacobian_layers, self.sweep_layer, *self.depth_layers)
        if not self.jacobian_layers or min(layers) < 0:
            raise InputError(f"layers must be >= 0 and jacobian_layers non-empty; got {layers}.")
        if self.ioi_prompts < 0 or self.synthetic_steps < 1:
            raise InputError(
                f"ioi_prompts must be >= 0 and synthetic_steps >= 1; got {self.ioi_prompts} "
                f"and {self.synthetic_steps}."
            )

    def sae_layout(self) -> dict[str, Any]:
        """The keyword arguments of :func:`structlens.causal_dim.stages.sae_jobs`: which SAEs
        of fixed settings the sections read (the ε-by-depth SAEs at ``depth_layers`` come
        from :func:`structlens.causal_dim.stages.match_k`)."""
        names = ("sweep_layer", "ablation_width", "arch_controls", "arch_sweep_widths")
        return {name: getattr(self, name) for name in names}

    def depth_search_layers(self) -> list[int]:
        """The layers whose ε-by-depth SAE is searched for (the sweep layer's is the sweep's
        own SAE of ``depth_width``, the target of the others' FVU)."""
        return sorted(set(self.depth_layers) - {self.sweep_layer})


_REPLICATION_CPU = ReplicationProfile(
    profile="cpu", model="smollm2-135m", protocol=_PAPER,
    # three layers on the CPU (each vector costs ~4 s there); five on the gpu profile
    jacobian_layers=(15, 5, 25), sweep_layer=15, ablation_width=2304,
    arch_controls=("jumprelu", "relu"), arch_sweep_widths=(),
    depth_layers=(1, 5, 10, 20, 27), depth_width=2304, ioi_prompts=32, seed=0,
    synthetic_steps=600, cross_family="gemma3-270m",
)  # fmt: skip

#: The replication's profiles: ``cpu`` at the paper protocol's CPU sizes (no growth sweeps of
#: the controls), ``gpu`` with the paper's span, ``smoke`` on the tiny test model (its
#: byte-level tokenizer has no single-token names, so no IOI; fewer than 600 synthetic steps
#: leave the atoms control untrained).  The cross-family model of the CPU and GPU profiles is
#: Gemma 3 270M (18 layers against SmolLM2's 30: layers 5, 15, 25 match 3, 9, 15), a
#: stand-in for the paper's Gemma-2-2B against 9B (another family as well as another size).
REPLICATION_PROFILES: dict[str, ReplicationProfile] = {
    "cpu": _REPLICATION_CPU,
    "gpu": _REPLICATION_CPU.replace(
        profile="gpu", protocol=_GPU, jacobian_layers=(15, 5, 10, 20, 25),
        arch_sweep_widths=(2304, 4608, 9216, 18432, 36864, 73728, 147456),
        depth_layers=(1, 4, 7, 10, 13, 16, 19, 22, 25, 27), synthetic_steps=3000,
    ),
    "smoke": _REPLICATION_CPU.replace(
        profile="smoke", model="tiny-llama", protocol=_SMOKE, jacobian_layers=(1, 2),
        sweep_layer=1, ablation_width=256, arch_sweep_widths=(256, 512), depth_layers=(0, 2),
        depth_width=256, ioi_prompts=0, cross_family="tiny-gpt2",
    ),
}  # fmt: skip
