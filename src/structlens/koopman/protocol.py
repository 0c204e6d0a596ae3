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

from structlens.config import Protocol
from structlens.errors import InputError

__all__ = [
    "KoopmanProtocol",
    "PROFILES",
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
        default=("pca:32", "pca:8"), metadata={"help": "Dictionaries of the split-half grid."}
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
        fit_dictionaries=("identity", "pca:8"),
        henrici_blocks=8,
        spectrum_bootstrap=20,
        mom_blocks=4,
        invariance_dictionaries=("spectral:16", "rff-features:16", "relu:16"),
        headline_dictionary="pca:8",
    ),
}
