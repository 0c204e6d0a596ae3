"""The Koopman stages: the only code that turns depth activations into Koopman numbers.

Each stage is a function ``(protocol, rows, ...) -> Result`` of a frozen, typed result; the
``koopman`` CLI, ``structlens analyze`` and the replication call these and only render what
they return, so one :class:`~structlens.koopman.protocol.KoopmanProtocol` gives one answer
whichever driver runs it.

``rows`` are the ``(X, U, Y, prompt_ids)`` of one layer or of pooled layers
(:func:`layer_rows`), with the protocol's row rule applied.  Every dictionary is fitted by
:func:`fit_dictionary` on the protocol's fit rows.
"""

from __future__ import annotations

import copy
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from structlens.koopman.protocol import KoopmanProtocol, dictionary_label, parse_dictionary
from structlens.results import Result, to_jsonable

__all__ = [
    "LayerRows",
    "layer_rows",
    "fit_dictionary",
    "SplitHalfFit",
    "split_half",
    "SpectrumFit",
    "spectrum",
    "InvarianceFit",
    "invariance",
    "ReductionRow",
    "reduction",
    "AblationEffects",
    "mode_ablation",
    "DepthAnalysis",
    "analysis",
    "invariance_size",
    "SAEInvariance",
    "sae_invariance",
    "SAESeedRun",
    "sae_seed_run",
    "SpectralComparison",
    "spectral_comparison",
    "Universality",
    "universality",
    "Reduction",
]


@dataclass(frozen=True)
class LayerRows:
    """The samples of the depth map at ``layers``: states ``X``, controls ``U`` (attention
    writes), successors ``Y`` and the prompt id of every row."""

    layers: tuple[int, ...]
    X: np.ndarray
    U: np.ndarray
    Y: np.ndarray
    prompt_ids: np.ndarray

    @property
    def label(self) -> str:
        """``"8"`` for one layer, ``"4-12"`` for a pooled range."""
        if len(self.layers) == 1:
            return str(self.layers[0])
        return f"{self.layers[0]}-{self.layers[-1]}"

    def fit_rows(self, protocol: KoopmanProtocol) -> np.ndarray:
        """Boolean mask of the rows dictionaries are fitted on (``protocol.dictionary_fit``)."""
        from structlens.koopman.invariance import prompt_split

        if protocol.dictionary_fit == "all":
            return np.ones(len(self.X), dtype=bool)
        return ~prompt_split(self.prompt_ids, protocol.seed)


def layer_rows(protocol: KoopmanProtocol, store: Any, layers: Sequence[int]) -> LayerRows:
    """The rows of ``layers`` (pooled when several) of a depth store, position 0 left out when
    ``protocol.exclude_position0``."""
    from structlens.koopman.data import load_layers

    layers = tuple(int(v) for v in layers)
    X, U, Y, pid = load_layers(store, layers, exclude_position0=protocol.exclude_position0)
    return LayerRows(layers, X, U, Y, pid)


def fit_dictionary(
    protocol: KoopmanProtocol,
    spec: str,
    rows: LayerRows,
    *,
    sae_path: str | Path | None = None,
    dictionary: Any = None,
) -> Any:
    """Dictionary ``spec`` (``"pca:32"``) fitted on the protocol's fit rows of ``rows``.

    A given ``dictionary`` (e.g. SAE features chosen on training prompts) is copied and
    fitted instead; pre-trained dictionaries fit as a no-op.  Bad data raises ``ValueError``
    naming the dictionary.
    """
    from structlens.koopman.pipeline import make_dictionary

    if dictionary is None:
        name, size = parse_dictionary(spec)
        dictionary = make_dictionary(name, size, seed=protocol.seed, sae_path=sae_path)
    else:
        dictionary = copy.deepcopy(dictionary)
    keep = rows.fit_rows(protocol)
    try:
        return dictionary.fit(rows.X[keep], rows.U[keep], rows.Y[keep])
    except ValueError as err:
        raise ValueError(f"{spec} dictionary at layer {rows.label}: {err}") from err


# ---------------------------------------------------------------- split-half convergence
@dataclass(frozen=True)
class SplitHalfFit(Result):
    """Split-half spectral distance against the half size M and its log-log slope (the claim:
    −1/2) for one dictionary at ``layers``.

    ``blocks_used`` of the ``blocks_requested`` prompt blocks passed the protocol's block
    filter.  ``slope_ci`` is the delete-a-group jackknife interval over prompt blocks
    (:class:`structlens.koopman.convergence.SplitHalfResult`).
    """

    layers: list[int]
    dictionary: str
    n_features: int
    n_samples_total: int
    blocks_requested: int
    blocks_used: int
    slope: float
    slope_ci: list[float]
    slope_se: float
    slope_last4: float
    slope_w2: float
    n_samples: np.ndarray
    w_inf_mean: np.ndarray
    w2_mean: np.ndarray
    eig_condition_max: float
    eig_condition_median: float
    n_repeats: int


def split_half(
    protocol: KoopmanProtocol, rows: LayerRows, spec: str, *, dictionary: Any = None
) -> SplitHalfFit:
    """Split-half convergence of dictionary ``spec`` on ``rows`` (see :class:`SplitHalfFit`)."""
    from structlens.koopman.convergence import split_half_convergence
    from structlens.koopman.edmdc import EDMDc

    dic = fit_dictionary(protocol, spec, rows, dictionary=dictionary)
    cfg = protocol.edmdc(split_half=True)
    blocks = EDMDc(dic, cfg).statistics(
        rows.X, rows.U, rows.Y, rows.prompt_ids,
        n_blocks=protocol.split_half_blocks, seed=protocol.seed,
    )  # fmt: skip
    # A half built from one block must still hold more samples than features + controls.
    need = protocol.block_min_ratio * (dic.n_features + protocol.split_half_control_rank)
    kept = [b for b in blocks if b.n > need]
    if len(kept) < 4:
        raise ValueError(
            f"layer {rows.label}, {spec}: {len(kept)} of {len(blocks)} prompt blocks hold more "
            f"than {need:.0f} rows (the split-half filter); pass more prompts or fewer blocks."
        )
    sh = split_half_convergence(
        kept, cfg, n_repeats=protocol.split_half_repeats, seed=protocol.seed
    )
    return SplitHalfFit(
        layers=list(rows.layers),
        dictionary=dictionary_label(spec),
        n_features=int(dic.n_features),
        n_samples_total=int(len(rows.X)),
        blocks_requested=protocol.split_half_blocks,
        blocks_used=len(kept),
        slope=float(sh.slope),
        slope_ci=[float(v) for v in sh.slope_ci],
        slope_se=float(sh.slope_se),
        slope_last4=float(sh.slope_last4),
        slope_w2=float(sh.slope_w2),
        n_samples=np.asarray(sh.n_samples, dtype=np.float64),
        w_inf_mean=np.asarray(sh.w_inf_mean, dtype=np.float64),
        w2_mean=np.asarray(sh.w2_mean, dtype=np.float64),
        eig_condition_max=float(sh.eig_condition_max),
        eig_condition_median=float(np.median(sh.eig_condition)),
        n_repeats=protocol.split_half_repeats,
    )


# ---------------------------------------------------------------- spectrum and non-normality
@dataclass(frozen=True)
class SpectrumFit(Result):
    """The fitted operator's spectrum and its diagnostics for one dictionary at ``layers``.

    ``spectral_radius_ci``: 95% percentile interval over bootstrap resamples of the prompt
    blocks (``None`` without resamples).  ``henrici_noise_floor_relative`` and
    ``henrici_extrapolated_relative``: the sampling part of the relative Henrici departure and
    its ``M → ∞`` extrapolation (:func:`structlens.koopman.diagnostics.henrici_noise_floor`);
    ``None`` with ``noise_floor_reason`` when a quarter of the blocks cannot determine a fit.
    ``state_tails`` / ``lifted_tails``: heavy-tail numbers before and after lifting, the
    kurtosis bounds jackknifed over prompts
    (:func:`structlens.koopman.diagnostics.tail_statistics`; no lifted tails for identity).
    ``mom_eigenvalues`` and ``mom_bottleneck``: the median-of-means fit's spectrum and its
    bottleneck distance to the mean fit's (``None`` with ``mom_reason`` when
    ``protocol.mom_blocks`` is 0 or a block cannot determine a fit).
    """

    layers: list[int]
    dictionary: str
    n_features: int
    n_samples: int
    eigenvalues: np.ndarray
    spectral_radius: float
    spectral_radius_ci: list[float] | None
    henrici_relative: float
    henrici_noise_floor_relative: float | None
    henrici_extrapolated_relative: float | None
    noise_floor_reason: str | None
    kappa_V: float
    eig_condition_max: float
    eig_condition_median: float
    dissociation_k: int | None
    dissociation_mean_cos2: float | None
    dissociation_largest_angle_deg: float | None
    control_rank: int
    control_energy_kept: float
    cond_gram: float
    state_tails: dict[str, float]
    lifted_tails: dict[str, float] | None
    mom_eigenvalues: np.ndarray | None
    mom_bottleneck: float | None
    mom_reason: str | None


def _radius_bootstrap(
    blocks: Sequence[Any], cfg: Any, n_boot: int, seed: int
) -> list[float] | None:
    """95% percentile interval of the spectral radius over ``n_boot`` block-bootstrap
    resamples (multinomial counts of the blocks, all pooled in one pass).  Each resample's
    eigenvalues are :func:`structlens.koopman.edmdc.solve`'s -- its own control basis, the
    operator's spectrum -- without the read-out and state moments, which they do not use."""
    from structlens.koopman.edmdc import control_basis, merge_statistics_many, state_operator
    from structlens.stats.lanes import serial_blas

    if n_boot == 0:
        return None
    rng = np.random.default_rng(seed)
    K = len(blocks)
    counts = np.stack([np.bincount(rng.integers(0, K, K), minlength=K) for _ in range(n_boot)])
    radii = np.empty(n_boot)
    with serial_blas():
        for b, stats in enumerate(merge_statistics_many(blocks, counts, with_state=False)):
            V = control_basis(stats, cfg)[0]
            ev = np.linalg.eigvals(state_operator(stats, cfg, V))
            radii[b] = float(np.max(np.abs(ev)))
    return [float(v) for v in np.percentile(radii, [2.5, 97.5])]


def spectrum(
    protocol: KoopmanProtocol,
    rows: LayerRows,
    spec: str,
    *,
    sae_path: str | Path | None = None,
    dictionary: Any = None,
) -> SpectrumFit:
    """Fit dictionary ``spec`` on ``rows`` and measure its spectrum (see :class:`SpectrumFit`)."""
    from structlens.koopman.diagnostics import henrici_noise_floor, tail_statistics
    from structlens.koopman.edmdc import EDMDc, merge_statistics, solve, solve_median_of_means
    from structlens.koopman.spectral import modal_principal_dissociation, non_normality
    from structlens.stats.matching import bottleneck_distance

    seed = protocol.seed
    dic = fit_dictionary(protocol, spec, rows, sae_path=sae_path, dictionary=dictionary)
    cfg = protocol.edmdc()
    try:
        blocks = EDMDc(dic, cfg).statistics(
            rows.X, rows.U, rows.Y, rows.prompt_ids, n_blocks=protocol.henrici_blocks, seed=seed
        )
        blocks = [b for b in blocks if b.n > 0]  # a hashed block may have received no prompt
        res = solve(merge_statistics(blocks), cfg, dic)
    except ValueError as err:
        raise ValueError(f"layer {rows.label}, {spec}: {err}") from err
    nn = non_normality(res.A)
    # A quarter of the prompt blocks must over-determine the fit; the smallest quarters bound
    # every quarter from below.
    quarter = sum(sorted(b.n for b in blocks)[: len(blocks) // 4])
    need = res.A.shape[0] + res.control_rank
    floor, reason = None, None
    if len(blocks) >= 4 and quarter > need:
        floor = henrici_noise_floor(blocks, cfg, seed=seed)
    else:
        reason = f"a quarter of the prompt blocks holds {quarter} samples, a fit needs > {need}"
    k = min(protocol.dissociation_k, res.A.shape[0] - 1, res.state_mean.shape[0] - 1)
    dis = modal_principal_dissociation(res, k) if k >= 1 else None
    mom_ev, mom_w = None, None
    mom_reason: str | None = "mom_blocks is 0"
    if protocol.mom_blocks:
        mom_blocks = EDMDc(dic, cfg).statistics(
            rows.X, rows.U, rows.Y, rows.prompt_ids, n_blocks=protocol.mom_blocks, seed=seed
        )
        smallest = min(b.n for b in mom_blocks)
        if smallest > need:
            mom_ev = solve_median_of_means(mom_blocks, cfg, dic).eigenvalues
            mom_w, mom_reason = float(bottleneck_distance(mom_ev, res.eigenvalues)), None
        else:
            mom_reason = (
                f"the smallest of {protocol.mom_blocks} blocks holds {smallest} samples, a "
                f"fit needs > {need}"
            )
    lifted = None
    if parse_dictionary(spec)[0] != "identity":
        lifted = tail_statistics(dic.transform(rows.X), rows.prompt_ids, seed=seed)
    return SpectrumFit(
        layers=list(rows.layers),
        dictionary=dictionary_label(spec),
        n_features=int(res.A.shape[0]),
        n_samples=int(res.n_samples),
        eigenvalues=np.asarray(res.eigenvalues),
        spectral_radius=float(np.max(np.abs(res.eigenvalues))),
        spectral_radius_ci=_radius_bootstrap(blocks, cfg, protocol.spectrum_bootstrap, seed),
        henrici_relative=float(nn.henrici_relative),
        henrici_noise_floor_relative=floor.noise_floor_relative if floor else None,
        henrici_extrapolated_relative=floor.henrici_extrapolated_relative if floor else None,
        noise_floor_reason=reason,
        kappa_V=float(nn.kappa_V),
        eig_condition_max=float(np.max(nn.eig_condition)),
        eig_condition_median=float(np.median(nn.eig_condition)),
        dissociation_k=int(dis.dimension) if dis else None,
        dissociation_mean_cos2=float(dis.mean_cos2) if dis else None,
        dissociation_largest_angle_deg=float(np.degrees(dis.largest_angle)) if dis else None,
        control_rank=int(res.control_rank),
        control_energy_kept=float(res.control_energy_kept),
        cond_gram=float(res.cond_gram),
        state_tails=tail_statistics(rows.X, rows.prompt_ids, seed=seed),
        lifted_tails=lifted,
        mom_eigenvalues=None if mom_ev is None else np.asarray(mom_ev),
        mom_bottleneck=mom_w,
        mom_reason=mom_reason,
    )


# ---------------------------------------------------------------- invariance residual
@dataclass(frozen=True)
class InvarianceFit(Result):
    """Held-out one-step invariance residual (1 − R² of ``Ψ(y)`` from ``[Ψ(x), u]``) of one
    dictionary, fitted (dictionary and operator) on training prompts, scored on the others."""

    layers: list[int]
    dictionary: str
    n_features: int
    pooled: float
    mean: float
    median: float
    n_dead: int
    dictionary_fit_split: str
    n_train_prompts: int
    n_test_prompts: int


def invariance(
    protocol: KoopmanProtocol,
    rows: LayerRows,
    spec: str,
    *,
    sae_path: str | Path | None = None,
    dictionary: Any = None,
    label: str | None = None,
) -> InvarianceFit:
    """Invariance residual of dictionary ``spec`` on ``rows`` by the protocol's prompt split.

    ``dictionary`` (with ``label``) passes a pre-built one, e.g. SAE features chosen on the
    training prompts.
    """
    from structlens.koopman.invariance import invariance_residual_split
    from structlens.koopman.pipeline import make_dictionary

    if dictionary is None:
        name, size = parse_dictionary(spec)
        dictionary = make_dictionary(name, size, seed=protocol.seed, sae_path=sae_path)
    try:
        r = invariance_residual_split(
            dictionary, rows.X, rows.U, rows.Y, rows.prompt_ids, protocol.edmdc(),
            seed=protocol.seed,
        )  # fmt: skip
    except ValueError as err:
        raise ValueError(f"layer {rows.label}, {spec}: {err}") from err
    return InvarianceFit(
        layers=list(rows.layers),
        dictionary=label or dictionary_label(spec),
        n_features=int(len(r.per_feature)),
        pooled=float(r.pooled),
        mean=float(r.mean),
        median=float(r.median),
        n_dead=int(r.n_dead),
        dictionary_fit_split=str(r.dictionary_fit_split),
        n_train_prompts=int(r.n_train_prompts),
        n_test_prompts=int(r.n_test_prompts),
    )


# ---------------------------------------------------------------- model reduction
@dataclass(frozen=True)
class ReductionRow(Result):
    """Balanced truncation of the pooled operator to ``order``: the error and the bounds that
    certify it (Enns–Glover for the worst-case input; the instance bound for inputs with the
    attention writes' covariance), with :attr:`bound_ratio` and :attr:`instance_ratio` in the
    norm each bound certifies.

    ``error <= enns_glover`` holds by construction when the code is right, so it is a check;
    its positive control is a reduced model known to be wrong: the output map scaled so that,
    by the triangle inequality, its error must exceed ``2 · enns_glover``.
    ``control_error`` is that model's error through the same error computation and
    ``control_flagged`` whether the comparison rejects it (it must).
    """

    layers: list[int]
    dictionary: str
    order: int
    horizon: int
    error: float
    enns_glover: float
    certified: bool
    markov_bound: float
    instance_error: float
    instance_bound: float
    effective_rank: float
    rho0: float
    control_error: float
    control_flagged: bool

    @property
    def bound_ratio(self) -> float:
        """``enns_glover / error``: how loose the worst-case certificate is (>= 1 when it holds)."""
        return self.enns_glover / self.error if self.error > 0 else float("inf")

    @property
    def instance_ratio(self) -> float:
        """``instance_bound / instance_error`` (>= 1 when the instance certificate holds)."""
        if self.instance_error <= 0:
            return float("inf")
        return self.instance_bound / self.instance_error


def reduction(
    protocol: KoopmanProtocol,
    rows: LayerRows,
    spec: str,
    orders: Sequence[int],
    *,
    sae_path: str | Path | None = None,
) -> list[ReductionRow]:
    """Balanced truncation of the operator fitted on the pooled ``rows`` (horizon = number of
    pooled layers) to each of ``orders``."""
    from structlens.koopman.edmdc import EDMDc
    from structlens.koopman.reduction import balanced_truncation, operator_distance

    dic = fit_dictionary(protocol, spec, rows, sae_path=sae_path)
    res = EDMDc(dic, protocol.edmdc()).fit(rows.X, rows.U, rows.Y)
    n = res.A.shape[0]
    if any(not 1 <= r < n for r in orders):
        raise ValueError(f"orders must be in [1, {n - 1}]; got {list(orders)}.")
    horizon = len(rows.layers)
    out = []
    for r in orders:
        red = balanced_truncation(res.A, res.B, res.C, r, horizon, input_cov=res.control_cov)
        reduced = (red.A_r, red.B_r, red.C_r)
        # scale C_r by 1 + c with c·‖T_r‖ ≥ 2·bound + 2·error: then ‖T − T'_r‖ ≥ 2·bound
        size = operator_distance(reduced, (red.A_r, red.B_r, np.zeros_like(red.C_r)), horizon)
        c = 2.0 * (red.enns_glover + red.error) / size if size > 0 else 0.0
        control = operator_distance(
            (res.A, res.B, res.C), (red.A_r, red.B_r, (1.0 + c) * red.C_r), horizon
        )
        out.append(
            ReductionRow(
                layers=list(rows.layers),
                dictionary=dictionary_label(spec),
                order=int(r),
                horizon=horizon,
                error=float(red.error),
                enns_glover=float(red.enns_glover),
                certified=bool(red.certified),
                markov_bound=float(red.markov_bound),
                instance_error=float(red.instance_error),
                instance_bound=float(red.instance_bound),
                effective_rank=float(red.effective_rank),
                rho0=float(red.rho0),
                control_error=float(control),
                control_flagged=bool(control > red.enns_glover),
            )
        )
    return out


@dataclass(frozen=True)
class Reduction(Result):
    """The :class:`ReductionRow` of every order of one pooled operator, as one stage Result."""

    rows: list[ReductionRow]


# ---------------------------------------------------------------- IOI mode ablation
@dataclass(frozen=True)
class AblationEffects(Result):
    """Effect on the task metric of ablating ``dimension`` real directions at
    ``resid_pre(layer)``: Koopman modes vs PCA vs random directions (``mean`` and 95% ``ci``
    per method, in ``methods`` order)."""

    layer: int
    dictionary: str
    positions: str
    dimension: int
    clean_metric: float
    depth_to_readout: int
    methods: list[str]
    mean: list[float]
    ci: list[list[float]]
    mode_eigenvalues: np.ndarray


def mode_ablation(
    protocol: KoopmanProtocol,
    model: Any,
    task: Any,
    rows: LayerRows,
    spec: str,
    k: int,
    *,
    positions: str = "all",
    n_random: int = 5,
) -> AblationEffects:
    """Fit an affine dictionary ``spec`` (identity or PCA) on ``rows`` of one layer and ablate
    ``k`` modes, ``k`` PCA and ``k`` random directions in ``model`` on ``task``."""
    from structlens.koopman.edmdc import EDMDc
    from structlens.koopman.interventions import compare_ablations

    (layer,) = rows.layers
    dic = fit_dictionary(protocol, spec, rows)
    try:
        res = EDMDc(dic, protocol.edmdc()).fit(rows.X, rows.U, rows.Y)
        c = compare_ablations(
            model, task, layer, res, dic, k, positions=positions, n_random=n_random,
            exclude_position0=protocol.exclude_position0, seed=protocol.seed,
        )  # fmt: skip
    except ValueError as err:
        raise ValueError(f"layer {layer}: {err}") from err
    return AblationEffects(
        layer=layer,
        dictionary=dictionary_label(spec),
        positions=positions,
        dimension=int(c.dimension),
        clean_metric=float(c.clean_metric_mean),
        depth_to_readout=int(model.n_layers - layer),
        methods=list(c.methods),
        mean=[float(v) for v in c.mean],
        ci=[[float(a), float(b)] for a, b in c.ci],
        mode_eigenvalues=np.asarray(c.mode_eigenvalues),
    )


# ---------------------------------------------------------------- the per-layer analysis
@dataclass(frozen=True)
class DepthAnalysis(Result):
    """The protocol's headline dictionary at every layer of ``layers`` (``split_half`` and
    ``spectra`` in layer order) and the invariance residual of the protocol's invariance
    dictionaries at ``invariance_layer``, the middle layer, fixed in advance.  A dictionary
    whose residual cannot be computed is in ``invariance_not_run`` (spec -> why)."""

    protocol: dict[str, Any]
    layers: list[int]
    split_half: list[SplitHalfFit]
    spectra: list[SpectrumFit]
    invariance_layer: int
    invariance: list[InvarianceFit]
    invariance_not_run: dict[str, str]
    n_prompts: int


def analysis(
    protocol: KoopmanProtocol,
    model: Any,
    layers: Sequence[int],
    *,
    n_corpus: int,
    max_tokens: int,
    root: str | Path,
    executor: Any = None,
    progress: bool = False,
    step: Callable[[str], None] = lambda what: None,
) -> DepthAnalysis:
    """Capture the depth sites of ``layers`` over ``n_corpus`` corpus chunks of ``max_tokens``
    tokens (content-hashed under ``root``) and run :func:`split_half` and :func:`spectrum` of
    the headline dictionary per layer, then :func:`invariance` at the middle layer.  ``step``
    is told what starts next (``"capture"``, ``"layer 3"``, ...)."""
    from structlens.koopman.data import capture_depth, depth_prompts

    step("capture")
    prompts = depth_prompts(model.tokenizer, n_corpus=n_corpus, max_tokens=max_tokens, task=None)
    store = capture_depth(model, prompts, layers, root=root, executor=executor, progress=progress)
    head = protocol.headline_dictionary
    halves, spectra = [], []
    for layer in layers:
        step(f"layer {layer}")
        rows = layer_rows(protocol, store, [layer])
        halves.append(split_half(protocol, rows, head))
        spectra.append(spectrum(protocol, rows, head))
    mid = int(layers[len(layers) // 2])
    step(f"invariance (layer {mid})")
    rows = layer_rows(protocol, store, [mid])
    inv, not_run = [], {}
    for spec in protocol.invariance_dictionaries:
        try:
            inv.append(invariance(protocol, rows, spec))
        except ValueError as err:
            not_run[spec] = str(err)
    return DepthAnalysis(
        protocol=protocol.to_json(),
        layers=[int(v) for v in layers],
        split_half=halves,
        spectra=spectra,
        invariance_layer=mid,
        invariance=inv,
        invariance_not_run=not_run,
        n_prompts=len(prompts),
    )


# ---------------------------------------------------------------- SAE dictionaries
def invariance_size(protocol: KoopmanProtocol) -> int:
    """The one size N of the protocol's invariance dictionaries (the gap is compared at equal
    N); ``ValueError`` if they differ."""
    sizes = {parse_dictionary(spec)[1] for spec in protocol.invariance_dictionaries}
    if len(sizes) != 1:
        raise ValueError(
            f"the invariance gap compares dictionaries of equal size; the protocol's "
            f"invariance_dictionaries have sizes {sorted(sizes)}."
        )
    return sizes.pop()


@dataclass(frozen=True)
class SAEInvariance(Result):
    """The invariance residuals of :func:`sae_invariance`: ``sae`` is the wide SAE's training
    summary (its ``d_sae`` among it), ``fits`` the SAE selections' and the protocol's
    invariance dictionaries' :class:`InvarianceFit`, all of ``n`` features."""

    n: int
    sae: dict[str, Any]
    fits: list[InvarianceFit]


def sae_invariance(
    protocol: KoopmanProtocol, rows: LayerRows, n: int, *, width: int, epochs: int
) -> SAEInvariance:
    """The invariance residual of ``n`` features of one wide TopK SAE (``width`` latents),
    chosen by code variance and by firing frequency (``sae_variance<n>``,
    ``sae_frequency<n>``), then of the protocol's invariance dictionaries.  The SAE and its
    feature choice see the protocol's fit rows only."""
    from structlens.koopman.invariance import select_sae_features, train_sae_dictionary

    train = rows.fit_rows(protocol)
    sae, info = train_sae_dictionary(
        rows.X[train], d_sae=width, k=16, epochs=epochs, seed=protocol.seed
    )
    fits = []
    for rule in ("variance", "frequency"):
        label = f"sae_{rule}{n}"
        chosen = select_sae_features(sae, rows.X[train], n, rule)
        fits.append(invariance(protocol, rows, label, dictionary=chosen, label=label))
    fits += [invariance(protocol, rows, spec) for spec in protocol.invariance_dictionaries]
    summary = {k: v for k, v in info.items() if k != "decoder"} | {"d_sae": width}
    return SAEInvariance(n=n, sae=to_jsonable(summary), fits=fits)


@dataclass(frozen=True)
class SAESeedRun(Result):
    """TopK SAEs (``d_sae`` latents) trained with ``len(seeds)`` seeds at invariance penalty
    ``penalty`` on the training prompts of one layer: per seed the held-out pooled residual,
    dead features and final FVU; per seed pair (``pairs``) the one-to-one matched decoder
    ``|cos|`` and the share of matches above 0.9 (run-to-run variability)."""

    layer: int
    penalty: float
    d_sae: int
    seeds: list[int]
    residual: list[float]
    n_dead: list[int]
    fvu: list[float]
    pairs: list[list[int]]
    mean_cos: list[float]
    share_above: list[float]


def sae_seed_run(
    protocol: KoopmanProtocol,
    rows: LayerRows,
    penalty: float,
    n_seeds: int,
    *,
    epochs: int,
    d_sae: int = 256,
) -> SAESeedRun:
    """The :class:`SAESeedRun` of ``n_seeds`` seeds at invariance penalty ``penalty``;
    residuals are scored on the held-out prompts."""
    from structlens.koopman.invariance import (
        decoder_agreement,
        invariance_residual_split,
        prompt_split,
        train_sae_dictionary,
    )

    (layer,) = rows.layers
    X, U, Y, pid = rows.X, rows.U, rows.Y, rows.prompt_ids
    train = ~prompt_split(pid, protocol.seed)
    decoders, residual, dead, fvu = [], [], [], []
    for sd in range(n_seeds):
        dic, info = train_sae_dictionary(
            X[train], U[train], Y[train], d_sae=d_sae, k=16, invariance_weight=penalty,
            epochs=epochs, batch_size=512, seed=sd,
        )  # fmt: skip
        inv = invariance_residual_split(dic, X, U, Y, pid, protocol.edmdc(), seed=protocol.seed)
        decoders.append(info["decoder"])
        residual.append(float(inv.pooled))
        dead.append(int(inv.n_dead))
        fvu.append(float(info["final_fvu"]))
    pairs = [[i, j] for i in range(n_seeds) for j in range(i + 1, n_seeds)]
    agree = [decoder_agreement(decoders[i], decoders[j]) for i, j in pairs]
    return SAESeedRun(
        layer=int(layer),
        penalty=float(penalty),
        d_sae=d_sae,
        seeds=list(range(n_seeds)),
        residual=residual,
        n_dead=dead,
        fvu=fvu,
        pairs=pairs,
        mean_cos=[float(a["mean_cos"]) for a in agree],
        share_above=[float(a["share_above"]) for a in agree],
    )


# ---------------------------------------------------------------- universality
@dataclass(frozen=True)
class SpectralComparison(Result):
    """W∞ between two models' spectra at one layer each against a sampling null.

    ``kind``: ``seeds`` (seed replicas of one depth), ``depth`` (replicas of two depths) or
    ``fine-tune``.  ``test`` names the lift and the null (see :func:`compare_spectra`); a
    ``shared_size`` basis
    (fitted on the first model) adds the block-permutation test
    (:func:`~structlens.koopman.convergence.universality_test`, ``shared_*``, else ``None``).
    ``p_value`` is ``(1 + k) / (1 + n_resamples)``, so it is never below
    ``1 / (1 + n_resamples)``.
    """

    pair: str
    kind: str
    test: str
    distance: float
    null_q95: float
    p_value: float
    n_resamples: int
    n_samples: list[int]
    shared_distance: float | None
    shared_null_q95: float | None
    shared_p_value: float | None


def row_blocks(protocol: KoopmanProtocol, rows: LayerRows, dic: Any) -> Any:
    """The split-half fit's EDMDc statistics of ``rows`` in 16 prompt blocks, lifted by
    ``dic``."""
    from structlens.koopman.edmdc import EDMDc

    cfg = protocol.edmdc(split_half=True)
    return EDMDc(dic, cfg).statistics(
        rows.X, rows.U, rows.Y, rows.prompt_ids, n_blocks=16, seed=protocol.seed
    )


#: The lifts :func:`compare_spectra` compares spectra in.
COMPARISON_DICTIONARIES = ("identity", "pca")


def compare_spectra(
    protocol: KoopmanProtocol,
    rows_a: LayerRows,
    rows_b: LayerRows,
    *,
    pair: str,
    kind: str,
    n_resamples: int,
    dictionary: str = "identity",
    shared_size: int | None = None,
) -> SpectralComparison:
    """The :class:`SpectralComparison` of two models' rows at one layer each.

    ``dictionary``: ``"identity"`` compares the spectra of the states themselves against the
    split-half null of :func:`~structlens.koopman.convergence.spectral_distance_test` (no
    fitted basis, so nothing but the dynamics can differ); ``"pca:K"`` lifts each model by
    the PCA-K of its own states, with the null of
    :func:`~structlens.koopman.convergence.refit_distance_test`, which refits the PCA on
    every half.  With ``shared_size``, both are also lifted by the PCA of ``rows_a``'s states
    for the block-permutation test.
    """
    from structlens.koopman.convergence import (
        refit_distance_test,
        spectral_distance_test,
        universality_test,
    )
    from structlens.koopman.dictionaries import IdentityDictionary, PCADictionary

    cfg, seed = protocol.edmdc(split_half=True), protocol.seed
    name, size = parse_dictionary(dictionary, default_size=8)
    if name not in COMPARISON_DICTIONARIES:
        raise ValueError(
            f"compare spectra in one of {', '.join(COMPARISON_DICTIONARIES)}; got {dictionary!r}."
        )
    if name == "identity":
        ba, bb = (row_blocks(protocol, r, IdentityDictionary().fit(r.X)) for r in (rows_a, rows_b))
        t = spectral_distance_test(ba, bb, cfg, n_resamples=n_resamples, seed=seed)
        test = "split-half null, identity"
    else:
        a, b = ((r.X, r.U, r.Y, r.prompt_ids) for r in (rows_a, rows_b))
        t = refit_distance_test(
            a, b, lambda X: PCADictionary(size).fit(X), cfg, n_resamples=n_resamples, seed=seed
        )
        test = f"split-half null refitting each half's basis, own PCA-{size}"
    shared: list[float | None] = [None, None, None]
    if shared_size is not None:
        dic = PCADictionary(shared_size).fit(rows_a.X)
        sa = row_blocks(protocol, rows_a, dic)
        sb = row_blocks(protocol, rows_b, dic)
        u = universality_test(sa, sb, cfg, n_permutations=n_resamples, seed=seed)
        shared = [float(u.distance), float(np.quantile(u.null, 0.95)), float(u.p_value)]
        test += f"; permutation null, shared PCA-{shared_size}"
    return SpectralComparison(
        pair=pair, kind=kind, test=test, distance=float(t.distance),
        null_q95=float(np.quantile(t.null, 0.95)), p_value=float(t.p_value),
        n_resamples=int(t.n_resamples), n_samples=[int(v) for v in t.n_samples],
        shared_distance=shared[0], shared_null_q95=shared[1], shared_p_value=shared[2],
    )  # fmt: skip


def spectral_comparison(
    protocol: KoopmanProtocol,
    a: tuple[str, Any, int],
    b: tuple[str, Any, int],
    prompts: Any,
    *,
    kind: str,
    root: str | Path,
    n_resamples: int,
    dictionary: str = "identity",
    shared_size: int | None = None,
) -> SpectralComparison:
    """Compare models ``a`` and ``b``, each ``(name, model, layer)``, on ``prompts`` (the
    depth sites are captured, content-hashed, under ``root``) by :func:`compare_spectra`."""
    from structlens.koopman.data import capture_depth

    (na, ma, la), (nb, mb, lb) = a, b
    rows_a, rows_b = (
        layer_rows(protocol, capture_depth(m, prompts, [layer], root=root), [layer])
        for m, layer in ((ma, la), (mb, lb))
    )
    return compare_spectra(
        protocol, rows_a, rows_b, pair=f"{na}@{la} vs {nb}@{lb}", kind=kind,
        n_resamples=n_resamples, dictionary=dictionary, shared_size=shared_size,
    )  # fmt: skip


# The equivalence replication's seed replicas, the layer compared in each, and the pairs.
REPLICA_LAYER = {"L4-s0": 2, "L4-s1": 2, "L4-s2": 2, "L8-s0": 4}
REPLICA_PAIRS = [
    ("L4-s0", "L4-s1", "seeds"), ("L4-s0", "L4-s2", "seeds"), ("L4-s1", "L4-s2", "seeds"),
    ("L4-s0", "L8-s0", "depth"),
]  # fmt: skip


@dataclass(frozen=True)
class Universality(Result):
    """The :class:`SpectralComparison` of every pair :func:`universality` compared; a group
    (``seeds``, ``fine-tune``) not compared is in ``not_run`` with why."""

    comparisons: list[SpectralComparison]
    not_run: dict[str, str]


def universality(
    protocol: KoopmanProtocol,
    model: Any,
    prompts: Any,
    models: typing.Mapping[str, str | Path | None],
    *,
    probe_layer: int,
    n_corpus: int,
    root: str | Path,
    n_resamples: int,
) -> Universality:
    """The seed and depth replicas of :data:`REPLICA_LAYER` against each other (the
    spectra of their states, on their own corpus prompts), and ``model`` against its
    fine-tuned copy ``models["smollm2-ft-ioi"]`` at ``probe_layer`` and layer 20 on
    ``prompts`` (the states' spectra, and a shared PCA-16).  A group that cannot be compared
    (its models are missing) is in ``not_run``."""
    from structlens.koopman.data import depth_prompts
    from structlens.models import load_model

    out, not_run = [], {}
    if all(models.get(m) for m in REPLICA_LAYER):
        loaded = {m: load_model(str(models[m])) for m in REPLICA_LAYER}
        own = depth_prompts(loaded["L4-s0"].tokenizer, n_corpus=n_corpus, max_tokens=64, n_task=0)
        out += [spectral_comparison(
            protocol, (x, loaded[x], REPLICA_LAYER[x]), (y, loaded[y], REPLICA_LAYER[y]), own,
            kind=kind, root=root, n_resamples=n_resamples,
        ) for x, y, kind in REPLICA_PAIRS]  # fmt: skip
    else:
        not_run["seeds"] = "the equivalence replication's seed replicas are missing"
    tuned = models.get("smollm2-ft-ioi")
    if tuned is not None and model.n_layers > 20:
        ft = load_model(str(tuned))
        # the fine-tune updated layers 15-29 only: the probe layer is an exact-equality
        # check, layer 20 the real comparison
        out += [spectral_comparison(
            protocol, ("smollm2", model, layer), ("smollm2-ft-ioi", ft, layer), prompts,
            kind="fine-tune", root=root, n_resamples=n_resamples, shared_size=16,
        ) for layer in (probe_layer, 20)]  # fmt: skip
    else:
        not_run["fine-tune"] = "the equivalence replication's smollm2-ft-ioi is missing"
    return Universality(comparisons=out, not_run=not_run)
