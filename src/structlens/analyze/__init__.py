"""The main job: every method of structlens on one model, cached stage by stage.

:func:`run_analysis` runs five stages on a loaded model — circuit-task sanity, Koopman
spectral analysis, NDM subspaces, causal dimensionality and interpretive equivalence — and
returns an :class:`AnalysisReport` whose JSON form (``DIR/analysis.json``) has one top-level
key per method.  Each method's entry holds ``headline`` numbers (``{"value", "ci", "unit",
"label"}``; ``ci`` is a 95% interval or ``None`` where the estimator has none), a
``caveats`` list (``{"kind", "message"}``: results that must not be read as plain numbers)
and ``details`` (the tables and figure data the HTML report draws).

The stages live in one module each (:mod:`.tasks`, :mod:`.koopman`, :mod:`.ndm`,
:mod:`.causal`, :mod:`.equivalence`); :mod:`.config` holds the profiles and settings,
:mod:`.runtime` the cache and progress bars, :mod:`.run` the driver.

Every stage is cached in ``DIR/cache/<stage>-<key>.json`` under a content key: the model's
fingerprint, the stage's settings (from the profile), the analysis layers and the seed.  A
second run with the same key loads the stage instead of recomputing it; an interrupted run
resumes at the first stage without a cache entry (activation captures resume shard by shard
in ``DIR/activations``).

Profiles fix the sizes: ``smoke`` (a tiny model in well under three minutes on two CPU
cores; what the tests run), ``cpu`` (SmolLM2-135M on a laptop CPU) and ``full`` (the
replication settings, for a GPU or a Ray cluster).
"""

from structlens.analyze.config import (
    PROFILES,
    STAGES,
    AnalysisReport,
    AnalyzeConfig,
    Profile,
    parse_layers,
)
from structlens.analyze.run import load_report, run_analysis

__all__ = [
    "PROFILES",
    "STAGES",
    "AnalysisReport",
    "AnalyzeConfig",
    "Profile",
    "load_report",
    "parse_layers",
    "run_analysis",
]
