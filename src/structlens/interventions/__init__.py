"""Interventions on a running model: reading/writing sites, patching, ablation, attribution."""

from structlens.interventions.hooks import hooked, site_grads
from structlens.interventions.patching import (
    ablate,
    ablation_source,
    attribution_patch,
    patch,
    replace_writer,
    run_with_cache,
    run_with_grads,
    run_with_writes,
    subspace_basis,
)

__all__ = [
    "ablate",
    "ablation_source",
    "attribution_patch",
    "hooked",
    "patch",
    "replace_writer",
    "run_with_cache",
    "run_with_grads",
    "run_with_writes",
    "site_grads",
    "subspace_basis",
]
