"""Streaming SAE training, matched-L0 control and one-pass width sweeps.

Training reads any iterable of activation batches (``torch.Tensor`` ``[batch, d_in]``, rows =
tokens): an ActivationStore iterator, a generator running the model on the fly, or a list.

Learning-rate rule
------------------
Unless ``lr`` is set, ``lr = lr_base / sqrt(d_sae / 2**14)`` (the rule of Gao et al. 2024 used
by sparsify and dictionary_learning): wider dictionaries take proportionally smaller steps,
so ``lr_base`` tuned at 16k latents transfers across a width sweep.  Adam, β = (0.9, 0.999).

Decoder norms
-------------
With ``decoder_norm="unit"`` (default except for ReLU) decoder rows are kept at unit norm:
the radial part of their gradient is removed before each step and the rows are projected
back onto the unit sphere after it.  ``"free"`` (default for ReLU, whose L1 penalty is
weighted by ``‖W_dec[i]‖``) leaves them unconstrained; ReLU decoders start at norm 0.1.

Dead features
-------------
A feature is *dead* once it has not fired for ``dead_tokens`` consecutive training tokens.
TopK/BatchTopK SAEs feed dead features to the AuxK loss (coefficient ``aux_k_coefficient``).

Scale
-----
The penalties of ReLU (L1, linear in the activations) and JumpReLU (L0, independent of them)
do not scale like the squared reconstruction error, and Adam moves every parameter by about
``lr`` per step in its own units, so a fixed coefficient, learning rate or threshold suits one
activation scale only.  For these two architectures the trainer measures the scale ``σ`` of
the first batch (its RMS deviation from the mean per dimension) and trains in the data's own
units exactly as it would train on ``x / σ``: the sparsity coefficient is multiplied by ``σ``
(ReLU) or ``σ²`` (JumpReLU), the biases ``b_enc``, ``b_dec`` step at ``lr·σ``, and JumpReLU's
bandwidth and initial threshold are multiplied by ``σ``.  ``sparsity_coefficient`` and
``final_coefficient`` are therefore in the units of inputs with unit scale per dimension.

Matched L0
----------
For TopK/BatchTopK the L0 is ``k`` by construction (``target_l0`` sets ``k``).  For ReLU and
JumpReLU, ``target_l0`` turns on a multiplicative controller on the sparsity coefficient,
``λ ← λ·exp(controller_rate·clip(log(L0_batch/target), −1, 1))``.  JumpReLU also holds its L0
at the target during training: its thresholds start at the per-latent quantile of the first
batch's pre-activations at which every latent fires on a ``target/d_sae`` share of the rows,
and after every step all of them move by one common factor,
``log θ ← log θ + threshold_rate·clip(log(L0_batch/target), −1, 1)``.  (Thresholds learned by
the pseudo-gradient alone move ~``lr`` per step in ``log θ``: far too slowly to reach the
target, which left the final calibration to shift them by a large factor after training, and
that silenced most latents.)  At the end (unless ``calibrate_l0=False``) one scalar is
calibrated by bisection on the last ``tail_tokens`` training tokens so the L0 lands on the
target: a common shift of ``b_enc`` (ReLU) or of ``log θ`` (JumpReLU).  The result records the
L0 and FVU before and after, the share of latents silent on those tokens afterwards, and
whether the final L0 is within ``l0_tolerance`` of the target.

Degenerate input
----------------
The first batch sets ``b_dec`` and the scale; a constant first batch (every column with zero
variance) cannot, and raises :class:`~structlens.errors.DegenerateInputError`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from structlens.errors import DegenerateInputError
from structlens.registry import Registry
from structlens.results import Result, atomic_write_json
from structlens.sae.models import (
    BatchTopKSAE,
    JumpReLUSAE,
    ReLUSAE,
    SparseAutoencoder,
    TopKSAE,
)

#: Relative spread (RMS deviation from the mean over RMS size) at or below which a batch
#: counts as constant: far above float64 rounding, far below any float32 variation.
CONSTANT_SPREAD = 1e-12


@dataclasses.dataclass(frozen=True)
class SAETrainConfig:
    """Settings of one SAE training run.

    Attributes
    ----------
    architecture : str
        A name in :data:`SAE_ARCHITECTURES`: built in ``"relu"``, ``"topk"``, ``"batchtopk"``,
        ``"jumprelu"``.
    d_sae : int
        Dictionary width.
    k : int
        Active features per row for TopK, mean per row for BatchTopK.
    target_l0 : float | None
        Target mean L0.  Sets ``k`` for TopK/BatchTopK (rounded); drives the coefficient
        controller for ReLU/JumpReLU.  ``None``: no matching.
    l0_tolerance : float
        Relative tolerance for ``l0_matched`` in the result.
    sparsity_coefficient : float | None
        L1 coefficient (ReLU) or L0 coefficient (JumpReLU); default 5.0 and 1e-3 respectively,
        in the units of inputs with unit scale per dimension (the trainer rescales it to the
        data's scale, see the module doc).
    controller_rate : float
        Step size of the L0 controller in log-coefficient space.
    threshold_rate : float
        Step size of the JumpReLU threshold controller in ``log θ`` per step, per unit of the
        clipped log-ratio of batch L0 to ``target_l0`` (0 turns it off; also the quantile
        initialisation of the thresholds then gives way to ``jumprelu_init_threshold``).
        At 0.05 a batch with twice the target L0 raises every threshold by ~3.5 %.
    calibrate_l0 : bool
        Calibrate the final L0 onto ``target_l0`` (ReLU/JumpReLU, see module doc).
    lr : float | None
        Fixed learning rate; ``None`` uses the width rule with ``lr_base``.
    lr_base : float
        Learning rate at width 2**14 for the width rule.
    aux_k_coefficient : float
        AuxK loss weight (TopK/BatchTopK); 1/32 as in Gao et al.
    dead_tokens : int
        Tokens without firing after which a feature counts as dead.
    decoder_norm : {"unit", "free"} | None
        ``None``: ``"free"`` for ReLU (its L1 penalty is weighted by decoder norms, as in
        SAELens's standard SAE), ``"unit"`` otherwise.
    jumprelu_bandwidth, jumprelu_init_threshold : float
        JumpReLU pseudo-gradient kernel width and initial threshold (in units of the data's
        scale).  With ``target_l0`` the thresholds start at the quantile that gives the
        target instead, and ``jumprelu_init_threshold`` is only their floor.
    seed : int
        Seeds the initialisation.
    """

    architecture: str = "topk"
    d_sae: int = 4096
    k: int = 32
    target_l0: float | None = None
    l0_tolerance: float = 0.1
    sparsity_coefficient: float | None = None
    controller_rate: float = 0.01
    threshold_rate: float = 0.05
    calibrate_l0: bool = True
    lr: float | None = None
    lr_base: float = 2e-4
    aux_k_coefficient: float = 1 / 32
    dead_tokens: int = 1_000_000
    decoder_norm: Literal["unit", "free"] | None = None
    jumprelu_bandwidth: float = 0.05
    jumprelu_init_threshold: float = 0.01
    seed: int = 0

    def __post_init__(self) -> None:
        arch = SAE_ARCHITECTURES.get(self.architecture)
        if self.d_sae < 1 or self.k < 1:
            raise ValueError("d_sae and k must be positive.")
        if self.target_l0 is not None and not 0 < self.target_l0 <= self.d_sae:
            raise ValueError(f"target_l0 must lie in (0, d_sae], got {self.target_l0}.")
        if self.decoder_norm not in ("unit", "free", None):
            raise ValueError("decoder_norm must be 'unit', 'free' or None.")
        if self.dead_tokens < 1 or self.l0_tolerance <= 0:
            raise ValueError("dead_tokens and l0_tolerance must be positive.")
        if not self.threshold_rate >= 0:
            raise ValueError(f"threshold_rate must be >= 0, got {self.threshold_rate}.")
        if arch.requires_unit_decoder and self.decoder_norm == "free":
            raise ValueError(
                f"{self.architecture} needs decoder_norm='unit' (one global threshold)."
            )

    @property
    def effective_decoder_norm(self) -> str:
        if self.decoder_norm is not None:
            return self.decoder_norm
        return SAE_ARCHITECTURES.get(self.architecture).decoder_norm

    @property
    def effective_k(self) -> int:
        return int(round(self.target_l0)) if self.target_l0 is not None else self.k

    @property
    def learning_rate(self) -> float:
        """The rate actually used: ``lr`` or ``lr_base / sqrt(d_sae / 2**14)``."""
        return self.lr if self.lr is not None else self.lr_base / math.sqrt(self.d_sae / 2**14)

    @property
    def initial_coefficient(self) -> float:
        if self.sparsity_coefficient is not None:
            return self.sparsity_coefficient
        arch = SAE_ARCHITECTURES.get(self.architecture)
        if arch.sparsity == "k":
            return self.aux_k_coefficient
        assert arch.default_coefficient is not None
        return arch.default_coefficient


@dataclasses.dataclass(frozen=True)
class SAEArchitecture:
    """How to build and train one SAE architecture (an entry of :data:`SAE_ARCHITECTURES`).

    Attributes
    ----------
    build : ``(config, d_in) -> SparseAutoencoder``, an untrained SAE.
    sparsity : ``"k"``: the number of active features is set by ``config.effective_k`` and
        the coefficient weighs the AuxK loss; ``"penalty"``: a sparsity penalty whose
        coefficient the L0 controller drives towards ``target_l0`` (and the final L0 is
        calibrated).
    default_coefficient : initial penalty coefficient (``"penalty"`` architectures).
    decoder_norm : decoder row norm mode used when the config leaves it ``None``.
    requires_unit_decoder : reject ``decoder_norm="free"``.
    """

    build: Callable[[SAETrainConfig, int], SparseAutoencoder]
    sparsity: Literal["k", "penalty"]
    default_coefficient: float | None = None
    decoder_norm: Literal["unit", "free"] = "unit"
    requires_unit_decoder: bool = False

    def __post_init__(self) -> None:
        if self.sparsity not in ("k", "penalty"):
            raise ValueError(f"sparsity must be 'k' or 'penalty', got {self.sparsity!r}.")
        if self.sparsity == "penalty" and self.default_coefficient is None:
            raise ValueError("a 'penalty' architecture needs a default_coefficient.")


#: SAE architectures by name; add one with
#: ``SAE_ARCHITECTURES.register(name, SAEArchitecture(...))`` (see docs/architecture.md).
SAE_ARCHITECTURES: Registry[SAEArchitecture] = Registry("architecture")
SAE_ARCHITECTURES.register(
    "relu",
    SAEArchitecture(
        # Small initial rows (SAELens's decoder_init_norm = 0.1): with ~half of all ReLU
        # features active at initialisation, unit rows would start at FVU ≫ 1.
        lambda c, d_in: ReLUSAE(d_in, c.d_sae, decoder_init_norm=0.1, seed=c.seed),
        sparsity="penalty",
        default_coefficient=5.0,
        decoder_norm="free",
    ),
)
SAE_ARCHITECTURES.register(
    "topk",
    SAEArchitecture(lambda c, d_in: TopKSAE(d_in, c.d_sae, c.effective_k, seed=c.seed), "k"),
)
SAE_ARCHITECTURES.register(
    "batchtopk",
    SAEArchitecture(
        lambda c, d_in: BatchTopKSAE(d_in, c.d_sae, c.effective_k, seed=c.seed),
        "k",
        requires_unit_decoder=True,
    ),
)
SAE_ARCHITECTURES.register(
    "jumprelu",
    SAEArchitecture(
        lambda c, d_in: JumpReLUSAE(
            d_in,
            c.d_sae,
            bandwidth=c.jumprelu_bandwidth,
            init_threshold=c.jumprelu_init_threshold,
            seed=c.seed,
        ),
        sparsity="penalty",
        default_coefficient=1e-3,
    ),
)


def build_sae(config: SAETrainConfig, d_in: int) -> SparseAutoencoder:
    """An untrained SAE of ``config``'s architecture and width for inputs of size ``d_in``."""
    return SAE_ARCHITECTURES.get(config.architecture).build(config, d_in)


def _validate_batch(x: Any, d_in: int | None, finite: bool = True) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"activation batches must be torch tensors, got {type(x).__name__}.")
    if x.ndim != 2:
        raise ValueError(
            f"activation batches must be [batch, d_in], got shape {tuple(x.shape)}; "
            "flatten positions into the batch dimension first."
        )
    if d_in is not None and x.shape[1] != d_in:
        raise ValueError(f"batch has d_in = {x.shape[1]}, earlier batches had {d_in}.")
    if x.shape[0] < 2:
        # FVU divides by the batch's variance about its mean, which one row does not have
        raise DegenerateInputError(
            f"an activation batch has {x.shape[0]} row(s); the fraction of variance "
            "unexplained needs at least 2 per batch: use batch_size >= 2."
        )
    if finite and not torch.isfinite(x).all():
        raise ValueError("activation batch contains NaN or inf.")
    return x


def _stacked(values: list[Any], device: torch.device) -> np.ndarray:
    """Logged per-step scalars (0-d tensors or floats) as float64, with one device transfer."""
    if not values:
        return np.zeros(0)
    t = [torch.as_tensor(v, dtype=torch.float64, device=device) for v in values]
    return torch.stack(t).cpu().numpy()


@dataclasses.dataclass(frozen=True)
class SAETrainingResult(Result):
    """Outcome of training one SAE.

    Attributes
    ----------
    sae : SparseAutoencoder
        The trained module (saved in SAELens format under ``<dir>/sae``).
    config : dict
        The :class:`SAETrainConfig` as a dict.
    d_in, tokens, steps : int
    learning_rate : float
    final_coefficient : float
        Sparsity coefficient at the end (moves only under L0 matching).
    final_l0 : float
        Mean L0 over the last ``tail_tokens`` training tokens (after L0 calibration).
    l0_before_calibration : float
        The same before calibration (equal to ``final_l0`` when none was done).
    final_fvu : float
        FVU over the same tail (``Σ‖x−x̂‖² / Σ‖x−x̄‖²``; during training for TopK, with the
        final weights after calibration).
    l0_matched : bool | None
        Whether ``final_l0`` is within ``l0_tolerance`` of ``target_l0`` (None: no target).
    dead_fraction : float
        Fraction of features dead at the end (``dead_tokens`` rule, counted during training,
        so it cannot see what the calibration did).
    loss_history, l0_history : np.ndarray
        Per-step total loss and L0.
    fvu_before_calibration : float
        ``final_fvu`` before calibration (equal to it when none was done).
    tail_dead_fraction : float | None
        Fraction of features that fire on none of the tail's tokens with the final weights
        (after calibration); ``None`` when no calibration was done (then ``dead_fraction``
        describes the final weights).
    scale : float
        The first batch's scale ``σ`` the penalised architectures were trained at (1.0 for
        TopK/BatchTopK, which do not use it).
    """

    sae: Any
    config: dict
    d_in: int
    tokens: int
    steps: int
    learning_rate: float
    final_coefficient: float
    final_l0: float
    l0_before_calibration: float
    final_fvu: float
    l0_matched: bool | None
    dead_fraction: float
    loss_history: np.ndarray
    l0_history: np.ndarray
    # defaults: results saved before these fields existed still load
    fvu_before_calibration: float = float("nan")
    tail_dead_fraction: float | None = None
    scale: float = 1.0

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["sae"] = {"architecture": self.sae.architecture, "d_sae": self.sae.d_sae}
        return out

    def save(self, directory: str | os.PathLike) -> Path:
        from safetensors.numpy import save as save_arrays

        from structlens.results import atomic_write_bytes
        from structlens.sae.io import save_sae

        directory = Path(directory)
        save_sae(self.sae, directory / "sae")
        arrays = {"loss_history": self.loss_history, "l0_history": self.l0_history}
        atomic_write_bytes(directory / "arrays.safetensors", save_arrays(arrays))
        atomic_write_json(directory / "result.json", self.to_json())
        return directory

    @classmethod
    def load(cls, directory: str | os.PathLike) -> SAETrainingResult:
        from safetensors.numpy import load_file

        from structlens.sae.io import load_sae

        directory = Path(directory)
        meta = json.loads((directory / "result.json").read_text())
        if meta.get("kind") != cls.__name__:
            raise ValueError(f"{directory} holds a {meta.get('kind')!r}, not {cls.__name__}.")
        arrays = load_file(str(directory / "arrays.safetensors"))
        kw = {f.name: meta[f.name] for f in dataclasses.fields(cls) if f.name in meta}
        kw.update(arrays)
        kw["sae"] = load_sae(directory / "sae")
        return cls(**kw)


def _adam(params: list[Any], lr: float) -> torch.optim.Optimizer:
    """Adam with the fused kernel where the device supports it (one pass per tensor instead of
    about six; the update is the same algorithm)."""
    try:
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999), fused=True)
    except (RuntimeError, ValueError):
        return torch.optim.Adam(params, lr=lr, betas=(0.9, 0.999))


class SAETrainer:
    """Trains one SAE step by step from activation batches.

    The SAE and its dead-feature counters live on ``device``; batches are moved there, so a
    host-side activation stream can feed a GPU trainer.  ``tail_tokens`` is how many of the most
    recent training tokens the final L0/FVU (and the L0 calibration) are measured on.

    A step does not wait for the device: logged values stay 0-d tensors until
    :meth:`result`; the finiteness of the loss (NaN/inf in a batch or a diverged run) is
    checked every ``check_every`` steps and at the end; the dead-feature mask is read only
    once some feature can have reached ``dead_tokens`` (the counters' maximum, read once,
    bounds when that can happen).  The ReLU architecture (its sparse/dense choice) and the
    L0 controller of penalised architectures still read one scalar per step.

    Examples
    --------
    >>> trainer = SAETrainer(SAETrainConfig(architecture="topk", d_sae=512, k=8), d_in=64)
    >>> for x in batches:                               # doctest: +SKIP
    ...     trainer.step(x)
    >>> result = trainer.result()                       # doctest: +SKIP
    """

    def __init__(
        self,
        config: SAETrainConfig,
        d_in: int,
        tail_tokens: int = 100_000,
        device: str | torch.device = "cpu",
        check_every: int = 100,
    ) -> None:
        if check_every < 1:
            raise ValueError(f"check_every must be positive, got {check_every}.")
        self.config = config
        self.d_in = int(d_in)
        self.device = torch.device(device)
        self.sae = build_sae(config, self.d_in).to(self.device)
        self._penalized = SAE_ARCHITECTURES.get(config.architecture).sparsity == "penalty"
        self.coefficient = (
            config.initial_coefficient if self._penalized else config.aux_k_coefficient
        )
        if self._penalized:
            # the biases get their own group so _initialize can scale their rate by σ
            biases = [self.sae.b_enc, self.sae.b_dec]
            rest = [p for p in self.sae.parameters() if all(p is not b for b in biases)]
            self.optimizer = _adam([{"params": rest}, {"params": biases}], config.learning_rate)
        else:
            self.optimizer = _adam(list(self.sae.parameters()), config.learning_rate)
        self.scale = 1.0  # σ of the first batch (penalised architectures), see the module doc
        self._penalty_scale = 1.0  # σ (ReLU) or σ² (JumpReLU)
        self.tokens_since_fired = torch.zeros(config.d_sae, dtype=torch.int64, device=self.device)
        self.tokens = 0
        self.steps = 0
        self.tail_tokens = int(tail_tokens)
        self.check_every = int(check_every)
        self._losses: list[torch.Tensor] = []
        self._l0s: list[Any] = []  # 0-d tensors or floats, read in result()
        self._tail: list[tuple[int, Any, torch.Tensor, torch.Tensor]] = []  # tokens, l0, mse, sst
        self._tail_x: list[torch.Tensor] = []
        self._finite = torch.ones((), dtype=torch.bool, device=self.device)
        self._no_dead_before = 0  # token count before which no feature can be dead
        self._initialized = False

    @torch.no_grad()
    def _initialize(self, x: torch.Tensor) -> None:
        # b_dec starts at the data mean so the encoder sees centred inputs from step one.
        mean = x.mean(0)
        self.sae.b_dec.copy_(mean.to(self.sae.b_dec.dtype))
        xd = x.double()
        scale = float((xd - xd.mean(0)).pow(2).mean().sqrt())
        if not math.isfinite(scale):
            raise ValueError("activation batch contains NaN or inf.")
        # identical rows leave a spread of float64 rounding (~1e-16 of their size), not 0
        if scale <= CONSTANT_SPREAD * float(xd.pow(2).mean().sqrt()):
            raise DegenerateInputError(
                f"the first activation batch ({x.shape[0]} rows) is constant (every column "
                "has zero variance), so there is nothing to reconstruct and no scale to start "
                "from: capture more varied prompts or another site, or shuffle the stream if "
                "only its first rows are identical."
            )
        if self._penalized:
            self._scale_to(scale, x)
        self._initialized = True

    @torch.no_grad()
    def _scale_to(self, scale: float, x: torch.Tensor) -> None:
        """Make training in the data's units equal training on ``x / scale`` (module doc)."""
        self.scale = scale
        self._penalty_scale = scale if isinstance(self.sae, ReLUSAE) else scale**2
        self.optimizer.param_groups[1]["lr"] = self.config.learning_rate * scale
        if isinstance(self.sae, JumpReLUSAE):
            cfg = self.config
            self.sae.bandwidth = cfg.jumprelu_bandwidth * scale
            floor = cfg.jumprelu_init_threshold * scale
            theta = torch.full_like(self.sae.log_threshold, floor)
            if cfg.target_l0 is not None and cfg.threshold_rate > 0:
                # start at the L0 the controller is to hold: each latent fires on a
                # target/d_sae share of the first batch, so none starts silent
                pre = self.sae.preacts(x)
                b = pre.shape[0]
                fire = min(b - 1, round(b * cfg.target_l0 / cfg.d_sae))  # rows above θ
                # kthvalue, not torch.quantile, which refuses inputs over 2**24 elements
                kth = torch.kthvalue(pre, b - fire, dim=0).values
                theta = kth.to(theta.dtype).clamp_min(floor)
            self.sae.log_threshold.copy_(theta.log())

    def _dead_mask(self) -> torch.Tensor | None:
        """Dead features, or ``None`` while none can be dead (exact; reads the device rarely).

        Every counter grows by the batch size per step, so with maximum ``m`` now no feature
        is dead before another ``dead_tokens − m`` tokens have been trained on.
        """
        if self.tokens < self._no_dead_before:
            return None
        m = int(self.tokens_since_fired.max())
        if m >= self.config.dead_tokens:
            return self.tokens_since_fired >= self.config.dead_tokens
        self._no_dead_before = self.tokens + self.config.dead_tokens - m
        return None

    def _check_finite(self) -> None:
        if not bool(self._finite):
            raise ValueError(
                "the training loss became NaN or inf: an activation batch contains NaN or inf, "
                "or training diverged (lower the learning rate)."
            )

    def step(
        self,
        x: torch.Tensor,
        extra_loss: Callable[[SparseAutoencoder], torch.Tensor] | None = None,
    ) -> dict[str, Any]:
        """One optimiser step on batch ``x`` [batch, d_in]; returns loss, mse, l0.

        The values are 0-d tensors where they are (reading them with ``float`` waits for the
        device).  ``extra_loss(sae)``, if given, is a scalar added to the SAE's own loss
        before the backward pass (e.g. an invariance penalty on the codes of paired inputs).
        """
        x = _validate_batch(x, self.d_in, finite=False)
        x = x.to(device=self.device, dtype=self.sae.W_dec.dtype)
        if not self._initialized:
            self._initialize(x)
        out = self.sae.training_output(x, self._dead_mask(), self.coefficient * self._penalty_scale)
        total = out.loss if extra_loss is None else out.loss + extra_loss(self.sae)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        unit = self.config.effective_decoder_norm == "unit"
        if unit:
            self.sae.remove_parallel_decoder_grad()
        self.optimizer.step()
        if unit:
            self.sae.normalize_decoder()
        b = x.shape[0]
        self.tokens_since_fired += b
        self.tokens_since_fired.masked_fill_(out.fired > 0, 0)
        self.tokens += b
        self.steps += 1
        target = self.config.target_l0
        if target is not None and self._penalized:
            # Log-ratio error, clipped, so one odd batch cannot blow the coefficient up.
            err = max(-1.0, min(1.0, math.log(max(float(out.l0), 1e-3) / target)))
            self.coefficient *= math.exp(self.config.controller_rate * err)
            if isinstance(self.sae, JumpReLUSAE) and self.config.threshold_rate > 0:
                with torch.no_grad():
                    self.sae.log_threshold.add_(self.config.threshold_rate * err)
        with torch.no_grad():
            sst = (x - x.mean(0)).pow(2).sum()
        mse, loss = out.mse.detach(), total.detach()
        self._tail.append((b, out.l0, mse, sst))
        self._tail_x.append(x.detach())
        while sum(t[0] for t in self._tail[1:]) >= self.tail_tokens:
            self._tail.pop(0)
            self._tail_x.pop(0)
        self._finite &= torch.isfinite(loss)
        if self.steps % self.check_every == 0:
            self._check_finite()
        self._losses.append(loss)
        self._l0s.append(out.l0)
        return {"loss": loss, "mse": mse, "l0": out.l0}

    def result(self) -> SAETrainingResult:
        """Freeze the current state into an :class:`SAETrainingResult`."""
        if self.steps == 0:
            raise ValueError("no training step was taken; the batch iterator was empty.")
        self._check_finite()
        sizes = [t[0] for t in self._tail]
        n = sum(sizes)
        # the same float64 sums as one float per step would give, in one transfer
        l0s, mses, ssts = (_stacked([t[i] for t in self._tail], self.device) for i in (1, 2, 3))
        l0 = sum(b * v for b, v in zip(sizes, l0s.tolist())) / n
        sst = sum(ssts.tolist())
        # constant activations have no variance to explain: FVU is undefined, not huge
        sse = sum(v * b for b, v in zip(sizes, mses.tolist()))
        fvu = sse / sst if sst > 0 else float("nan")
        target = self.config.target_l0
        l0_before, fvu_before, tail_dead = l0, fvu, None
        if target is not None and self.config.calibrate_l0 and self._penalized:
            x = torch.cat(self._tail_x)
            l0 = calibrate_l0(self.sae, x, target)
            with torch.no_grad():
                f = self.sae.encode(x)
                recon = self.sae.decode(f)
                fvu = float((recon - x).pow(2).sum() / (x - x.mean(0)).pow(2).sum())
                tail_dead = float(((f > 0).sum(0) == 0).double().mean())
        matched = None if target is None else abs(l0 - target) <= self.config.l0_tolerance * target
        dead = self.tokens_since_fired >= self.config.dead_tokens
        return SAETrainingResult(
            sae=self.sae,
            config=dataclasses.asdict(self.config),
            d_in=self.d_in,
            tokens=self.tokens,
            steps=self.steps,
            learning_rate=self.config.learning_rate,
            final_coefficient=float(self.coefficient),
            final_l0=float(l0),
            l0_before_calibration=float(l0_before),
            final_fvu=float(fvu),
            l0_matched=matched,
            dead_fraction=float(dead.float().mean()),
            loss_history=_stacked(self._losses, self.device),
            l0_history=_stacked(self._l0s, self.device),
            fvu_before_calibration=float(fvu_before),
            tail_dead_fraction=tail_dead,
            scale=float(self.scale),
        )


@torch.no_grad()
def calibrate_l0(sae: SparseAutoencoder, x: torch.Tensor, target: float, iters: int = 50) -> float:
    """Shift one scalar so the mean L0 of ``sae`` on ``x`` is as close to ``target`` as possible.

    ReLU: ``b_enc −= c``; JumpReLU: ``log θ += c``.  L0 decreases monotonically in ``c``, so
    bisection on ``c`` converges; returns the achieved L0.
    """
    if isinstance(sae, JumpReLUSAE):
        param = sae.log_threshold
        sign = 1.0
    elif isinstance(sae, ReLUSAE):
        param = sae.b_enc
        sign = -1.0
    else:
        raise ValueError("L0 calibration applies to ReLU and JumpReLU SAEs only.")
    base = param.detach().clone()

    def l0_at(c: float) -> float:
        param.copy_(base + sign * c)
        return float((sae.encode(x) > 0).sum()) / x.shape[0]

    pre = sae.preacts(x)
    span = float(pre.abs().max()) + 1.0
    lo, hi = (-span, span) if isinstance(sae, ReLUSAE) else (-20.0, 20.0)
    for _ in range(iters):
        mid = (lo + hi) / 2
        if l0_at(mid) > target:
            lo = mid
        else:
            hi = mid
    # Pick the end of the final bracket whose L0 is closer to the target.
    best = min((lo, hi), key=lambda c: abs(l0_at(c) - target))
    return l0_at(best)


def _batches(batches: Iterable[torch.Tensor], max_tokens: int | None) -> Iterator[torch.Tensor]:
    seen = 0
    for x in batches:
        if max_tokens is not None and seen >= max_tokens:
            return
        seen += x.shape[0]
        yield x


def train_sae(
    config: SAETrainConfig,
    batches: Iterable[torch.Tensor],
    *,
    max_tokens: int | None = None,
    tail_tokens: int = 100_000,
    device: str | torch.device = "cpu",
) -> SAETrainingResult:
    """Train one SAE on a stream of ``[batch, d_in]`` activation batches (on ``device``)."""
    return train_sweep(
        [config], batches, max_tokens=max_tokens, tail_tokens=tail_tokens, device=device
    )[0]


def train_sweep(
    configs: Sequence[SAETrainConfig],
    batches: Iterable[torch.Tensor],
    *,
    max_tokens: int | None = None,
    tail_tokens: int = 100_000,
    device: str | torch.device = "cpu",
) -> list[SAETrainingResult]:
    """Train several SAEs (e.g. a width sweep) on ONE pass over the activation stream.

    Every batch is drawn once and fed to every SAE in turn, so all SAEs see exactly the same
    tokens in the same order and the model runs once.
    """
    if not configs:
        raise ValueError("configs is empty; pass at least one SAETrainConfig.")
    trainers: list[SAETrainer] | None = None
    for x in _batches(batches, max_tokens):
        x = _validate_batch(x, None, finite=False)  # the trainers check the loss instead
        if trainers is None:
            trainers = [SAETrainer(c, x.shape[1], tail_tokens, device) for c in configs]
        for t in trainers:
            t.step(x)
    if trainers is None:
        raise ValueError("the batch iterator was empty; no SAE was trained.")
    return [t.result() for t in trainers]


def width_sweep_configs(base: SAETrainConfig, widths: Sequence[int]) -> list[SAETrainConfig]:
    """Copies of ``base`` at each width (same k / target L0, seed and lr rule)."""
    if not widths or any(int(w) < 1 for w in widths):
        raise ValueError("widths must be a non-empty list of positive integers.")
    return [dataclasses.replace(base, d_sae=int(w)) for w in widths]
