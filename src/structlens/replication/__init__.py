"""Replications of the four methods' papers: cached runs, markdown and claims JSON.

``python -m structlens.replication <method> [--profile cpu|gpu|smoke]`` (or
``structlens replicate <method>``) runs one replication.  Each method is a package
``replication/<method>/`` with ``run.py`` (profiles and stages, every stage cached through
:class:`~structlens.pipeline.cache.StageCache`) and ``render.py`` (the markdown and the
:class:`~structlens.replication.claims.ClaimsDocument` written beside it, both from the
stage results).
"""

from __future__ import annotations

from pathlib import Path

METHODS = {
    "koopman": "structlens.replication.koopman.run",
    "ndm": "structlens.replication.ndm.run",
    "causal-dimension": "structlens.replication.causal_dim.run",
    "equivalence": "structlens.replication.equivalence.run",
}

_REPO = Path(__file__).resolve().parents[3]


def repo_root() -> Path:
    """The source checkout holding this package, else the working directory."""
    return _REPO if (_REPO / "pyproject.toml").exists() else Path.cwd()


def default_paths(
    method: str, profile: str, out: str | Path | None, doc_dir: str | Path | None
) -> tuple[Path, Path]:
    """(stage cache directory, directory of the markdown and claims JSON).

    Defaults: ``results/replication/<method>/<profile>`` and ``docs/replication`` for the
    cpu/gpu profiles; a smoke run writes its documents into its cache directory, never
    over the committed ones.
    """
    root = repo_root()
    out = Path(out) if out is not None else root / "results" / "replication" / method / profile
    if doc_dir is None:
        doc_dir = out if profile == "smoke" else root / "docs" / "replication"
    out.mkdir(parents=True, exist_ok=True)
    return out, Path(doc_dir)


def command(method: str, profile: str) -> str:
    """The command line that reproduces a document, as the document states it."""
    return f"python -m structlens.replication {method} --profile {profile}"
