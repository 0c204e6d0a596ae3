"""The Koopman protocol: every scientific choice of the depth-dynamics analysis, in one place.

A :class:`KoopmanProtocol` is frozen and validated at construction.  The ``koopman`` CLI,
``structlens analyze`` and the Koopman replication build one instance each (the CLI from its
options, ``analyze`` and the replication from their profiles, :data:`PROFILES`) and hand it
to the stages of :mod:`structlens.koopman.stages`, which are the only code that turns
activations into Koopman numbers.  Two drivers given equal protocols therefore give equal
stage results.

Rows and splits
    Position 0 (the attention sink) is left out of every fit (``exclude_position0``).
    Dictionaries are fitted on the *training* prompts of a seeded 50/50 split by prompt
    (:func:`structlens.koopman.invariance.prompt_split`); the operator is fitted on all rows
    and held-out scores use the other half.
Control basis
    A fit keeps the fewest principal components of the attention write holding
    ``control_energy`` of its variance.  Split-half fits of single prompt blocks keep a fixed
    ``split_half_control_rank`` instead, so that every half of the smallest split still
    over-determines the fit.
Block filter
    A prompt block enters the split-half grid only if it holds more than
    ``block_min_ratio · (features + split_half_control_rank)`` rows (hashed blocks can be
    nearly empty).

Dictionaries are named ``"name"`` or ``"name:size"`` with ``name`` in the registry
:data:`structlens.koopman.pipeline.DICTIONARIES`.

>>> p = KoopmanProtocol(fit_dictionaries=("identity", "pca:16"))
>>> p.fit_dictionaries
('identity', 'pca:16')
>>> KoopmanProtocol(control_energy=1.5)
Traceback (most recent call last):
...
structlens.errors.InputError: control_energy must be in (0, 1]; got 1.5.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from structlens.config import Protocol, Settings
from structlens.errors import InputError

__all__ = [
    "KoopmanProtocol",
    "PROFILES",
    "REPLICATION_PROFILES",
    "ReplicationProfile",
    "DICTIONARY_NAMES",
    "parse_dictionary",
    "dictionary_label",
]

#: The names of :data:`structlens.koopman.pipeline.DICTIONARIES`, copied because that module
#: imports SciPy and a protocol is read before any computation (a test keeps the two equal).
DICTIONARY_NAMES = ("identity", "pca", "rff", "rff-features", "relu", "spectral", "sae")


def parse_dictionary(spec: str, default_size: int = 32) -> tuple[str, int]:
    """``"pca:32" -> ("pca", 32)``; a bare name takes ``default_size``.

    Raises
    ------
    InputError
        The name is not registered or the size is not an integer >= 1.
    """
    name, _, size = spec.partition(":")
    if name not in DICTIONARY_NAMES:
        raise InputError(
            f"unknown dictionary {name!r} in {spec!r}; choose from {', '.join(DICTIONARY_NAMES)}."
        )
    try:
        n = int(size) if size else default_size
    except ValueError:
        raise InputError(
            f"dictionary size in {spec!r} must be an integer, e.g. 'pca:32'."
        ) from None
    if n < 1:
        raise InputError(f"dictionary size must be >= 1, got {n} in {spec!r}.")
    return name, n


def dictionary_label(spec: str, default_size: int = 32) -> str:
    """The name a dictionary's results are filed under: ``identity``, ``pca32``, ``rff256``."""
    name, n = parse_dictionary(spec, default_size)
    return "identity" if name == "identity" else f"{name}{n}"


@dataclass(frozen=True)
class KoopmanProtocol(Protocol):
    """Every scientific choice of the Koopman analysis (see the module docstring).

    Each field's ``metadata["help"]`` says what it sets; :meth:`key` is a digest of the
    canonical JSON, the part of a stage's cache key that the protocol contributes.
    """

    exclude_position0: bool = field(
        default=True, metadata={"help": "Leave position 0 (the attention sink) out of fits."}
    )
    dictionary_fit: str = field(
        default="train",
        metadata={
            "help": "Rows a dictionary is fitted on: 'train' (training prompts of the seeded "
            "prompt split) or 'all'."
        },
    )
    alpha: float = field(default=1e-6, metadata={"help": "Relative ridge of the EDMDc solve."})
    control_energy: float = field(
        default=0.9, metadata={"help": "Fraction of Var(attn_out) the control basis keeps."}
    )
    control_rank: int | None = field(
        default=None,
        metadata={"help": "Keep this many control components in fits (overrides the energy)."},
    )
    split_half_control_rank: int = field(
        default=16, metadata={"help": "Control components of split-half (single-block) fits."}
    )
    block_min_ratio: float = field(
        default=2.0,
        metadata={"help": "A split-half block needs > ratio x (features + controls) rows."},
    )
    split_half_blocks: int = field(default=32, metadata={"help": "Prompt blocks (>= 4)."})
    # 40 pairs: with 10 the slope's jackknife interval is twice as wide and accepts a true
    # M^-1/4 (a Jordan block) as M^-1/2 in 97% of planted instances, with 40 in 63%
    # (benchmarks/koopman/split_half_interval.py)
    split_half_repeats: int = field(default=40, metadata={"help": "Half pairs per size (>= 2)."})
    split_half_dictionaries: tuple[str, ...] = field(
        default=("spectral:32", "pca:32", "pca:8"),
        metadata={"help": "Dictionaries of the split-half grid."},
    )
    split_half_headline: str = field(
        default="spectral:32",
        metadata={
            "help": "The split-half dictionary the convergence claim judges, fixed in advance "
            "(the paper's: spectral)."
        },
    )
    fit_dictionaries: tuple[str, ...] = field(
        default=("identity", "pca:64", "pca:32", "rff:256"),
        metadata={"help": "Dictionaries of the spectrum fits."},
    )
    henrici_blocks: int = field(
        default=16, metadata={"help": "Prompt blocks of the Henrici noise floor and bootstrap."}
    )
    spectrum_bootstrap: int = field(
        default=200, metadata={"help": "Block-bootstrap resamples of the spectral radius."}
    )
    mom_blocks: int = field(
        default=10, metadata={"help": "Blocks of the median-of-means fit (0: none)."}
    )
    dissociation_k: int = field(
        default=8, metadata={"help": "Top PCA directions vs dominant modes compared."}
    )
    invariance_dictionaries: tuple[str, ...] = field(
        default=("spectral:64", "rff-features:64", "relu:64"),
        metadata={"help": "Dictionaries of the held-out invariance residual."},
    )
    reduction_dictionary: str = field(
        default="pca:32", metadata={"help": "The dictionary of the pooled operator reduced."}
    )
    headline_dictionary: str = field(
        default="pca:32",
        metadata={"help": "The fit dictionary whose numbers are the headline, fixed in advance."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of splits, blocks and random lifts."})

    def __post_init__(self) -> None:
        self.check_types()
        if self.dictionary_fit not in ("train", "all"):
            raise InputError(
                f"dictionary_fit must be 'train' or 'all'; got {self.dictionary_fit!r}."
            )
        if not 0 < self.control_energy <= 1:
            raise InputError(f"control_energy must be in (0, 1]; got {self.control_energy}.")
        if self.alpha < 0:
            raise InputError(f"alpha must be >= 0; got {self.alpha}.")
        self.check_counts(
            {
                "split_half_control_rank": 1, "split_half_blocks": 4, "split_half_repeats": 2,
                "henrici_blocks": 4, "spectrum_bootstrap": 0, "mom_blocks": 0,
                "dissociation_k": 1, "seed": 0,
            }
        )  # fmt: skip
        if self.control_rank is not None and self.control_rank < 1:
            raise InputError(f"control_rank must be >= 1 or None; got {self.control_rank}.")
        if self.block_min_ratio < 1:
            raise InputError(f"block_min_ratio must be >= 1; got {self.block_min_ratio}.")
        for name in ("split_half_dictionaries", "fit_dictionaries", "invariance_dictionaries"):
            for spec in getattr(self, name):
                parse_dictionary(spec)
        parse_dictionary(self.headline_dictionary)
        parse_dictionary(self.reduction_dictionary)
        if self.split_half_headline not in self.split_half_dictionaries:
            raise InputError(
                f"split_half_headline {self.split_half_headline!r} must be one of "
                f"split_half_dictionaries {list(self.split_half_dictionaries)}."
            )

    def edmdc(self, *, split_half: bool = False) -> Any:
        """The solver settings of a fit (``split_half``: of a single-block split-half fit)."""
        from structlens.koopman.edmdc import EDMDcConfig

        if split_half:
            return EDMDcConfig(alpha=self.alpha, control_rank=self.split_half_control_rank)
        if self.control_rank is not None:
            return EDMDcConfig(alpha=self.alpha, control_rank=self.control_rank)
        return EDMDcConfig(alpha=self.alpha, control_energy=self.control_energy)


#: The protocol instances the drivers start from.  ``paper`` follows the paper's protocol at
#: the replication's sizes; ``smoke`` shrinks the sizes for the tiny test model and keeps
#: every rule.
PROFILES: dict[str, KoopmanProtocol] = {
    "paper": KoopmanProtocol(),
    "smoke": KoopmanProtocol(
        split_half_blocks=8,
        split_half_repeats=3,
        split_half_control_rank=4,
        split_half_dictionaries=("pca:8",),
        split_half_headline="pca:8",
        fit_dictionaries=("identity", "pca:8"),
        henrici_blocks=8,
        spectrum_bootstrap=20,
        mom_blocks=4,
        invariance_dictionaries=("spectral:16", "rff-features:16", "relu:16"),
        headline_dictionary="pca:8",
    ),
}


@dataclass(frozen=True)
class ReplicationProfile(Settings):
    """One profile of the Koopman replication: its model and prompts, the protocol of every
    section, and the sizes of the sections only the replication runs.  Frozen and checked at
    construction.

    ``layers`` is the first and last layer of the captured range (the reduction's operator
    pools them; ``probe_layers`` lie inside it); ``n_task`` IOI prompts join the fit's
    corpus, ``n_ioi`` others are ablated at ``ioi_layers`` (empty: no IOI section);
    ``sae_penalty`` is λ of the invariance-penalised SAE seeds; ``invariance_sae_width`` the
    wide SAE whose features are chosen at the protocol's invariance size; the seed replicas
    and fine-tune of the universality section come from profile ``seed_models_profile`` of
    the equivalence replication (``None``: none, and the claim says so);
    ``split_half_corpus`` corpus chunks (``None``: every chunk of the bundled corpus) plus
    the ``n_task`` IOI prompts are the split-half section's own prompts, captured at the probe
    layers only, so that the half sizes M span more than a decade of samples.
    """

    profile: str
    model: str
    protocol: KoopmanProtocol
    n_corpus: int
    prompt_tokens: int
    n_task: int
    layers: tuple[int, int]
    probe_layers: tuple[int, ...]
    n_ioi: int
    ioi_layers: tuple[int, ...]
    sae_seeds: int
    sae_epochs: int
    sae_penalty: float
    invariance_sae_width: int
    universality_resamples: int
    seed_models_profile: str | None
    seed: int
    split_half_corpus: int | None = None

    def __post_init__(self) -> None:
        first, last = self.layers
        if not 0 <= first <= last or not self.probe_layers:
            raise InputError(
                f"layers must be (first, last) with 0 <= first <= last and probe_layers "
                f"non-empty; got {self.layers} and {self.probe_layers}."
            )
        outside = [v for v in self.probe_layers if not first <= v <= last]
        if outside:
            raise InputError(
                f"probe_layers {outside} lie outside the captured layers {first}..{last}."
            )
        counts = ("n_corpus", "prompt_tokens", "sae_seeds", "sae_epochs", "invariance_sae_width")
        low = {n: getattr(self, n) for n in counts if getattr(self, n) < 1}
        if self.split_half_corpus is not None and self.split_half_corpus < 1:
            low["split_half_corpus"] = self.split_half_corpus
        low |= {n: getattr(self, n) for n in ("n_task", "n_ioi", "seed") if getattr(self, n) < 0}
        if low:
            raise InputError(f"sizes must be >= 1 (n_task, n_ioi, seed: >= 0); got {low}.")
        if bool(self.ioi_layers) != bool(self.n_ioi):
            raise InputError(
                f"ioi_layers and n_ioi go together (both empty/0 leaves IOI out); got "
                f"{list(self.ioi_layers)} and {self.n_ioi}."
            )


_REPLICATION_CPU = ReplicationProfile(
    profile="cpu", model="smollm2-135m", protocol=PROFILES["paper"], n_corpus=150,
    prompt_tokens=64, n_task=40, layers=(5, 11), probe_layers=(6, 10), n_ioi=24,
    ioi_layers=(6, 10, 14, 18, 22), sae_seeds=3, sae_epochs=20, sae_penalty=10.0,
    invariance_sae_width=1024, universality_resamples=200, seed_models_profile="cpu", seed=0,
)  # fmt: skip

#: The replication's profiles: ``cpu`` on SmolLM2-135M, ``gpu`` the same with a wider SAE for
#: the equal-size invariance comparison, ``smoke`` on the tiny test model (its byte-level
#: tokenizer has no single-token names, so no IOI; no trained seed replicas).
REPLICATION_PROFILES: dict[str, ReplicationProfile] = {
    "cpu": _REPLICATION_CPU,
    "gpu": _REPLICATION_CPU.replace(profile="gpu", invariance_sae_width=4096),
    "smoke": _REPLICATION_CPU.replace(
        profile="smoke", model="tiny-llama", protocol=PROFILES["smoke"], n_corpus=64,
        prompt_tokens=32, n_task=0, layers=(0, 1), probe_layers=(1,), n_ioi=0, ioi_layers=(),
        sae_seeds=2, sae_epochs=1, invariance_sae_width=64, universality_resamples=20,
        seed_models_profile=None, split_half_corpus=64,
    ),
}  # fmt: skip
