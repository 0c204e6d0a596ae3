"""Replications of the four methods' papers: cached runs, markdown and claims JSON.

``python -m structlens.replication <method> [--profile cpu|gpu|smoke]`` (or
``structlens replicate <method>``) runs one replication.  Each method is a package
``replication/<method>/`` with ``run.py`` (profiles and stages, every stage cached through
:class:`~structlens.replication.stage.StageCache`) and ``render.py`` (the markdown and the
:class:`~structlens.replication.claims.ClaimsDocument` written beside it, both from the
stage results).
"""

from __future__ import annotations

METHODS = {
    "koopman": "structlens.replication.koopman.run",
    "ndm": "structlens.replication.ndm.run",
    "causal-dimension": "structlens.replication.causal_dim.run",
    "equivalence": "structlens.replication.equivalence.run",
}
