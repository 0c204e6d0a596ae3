"""Options naming published SAEs (a folder in a published layout or a registry name
``RELEASE/SAE_ID`` of :mod:`structlens.sae.registry`), checked without importing torch."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlens


def _releases() -> dict[str, Any]:
    # the registry's data file read directly: importing structlens.sae.registry imports torch
    data = Path(structlens.__file__).parent / "sae" / "pretrained.json"
    return json.loads(data.read_text(encoding="utf-8"))["releases"]


def unpublished_saes(specs: list[str]) -> list[str]:
    """The values of an SAE option that are neither an existing path nor a registry name
    ``RELEASE/SAE_ID`` (checked without importing torch)."""
    releases = _releases()

    def published(spec: str) -> bool:
        release, _, sae_id = spec.partition("/")
        return sae_id in releases.get(release, {}).get("saes", {})

    return [s for s in specs if not Path(s).exists() and not published(s)]


def unpublished_message(option: str, spec: str) -> str:
    """One line for an :func:`unpublished_saes` value of ``option``."""
    return (
        f"{option} {spec!r} is neither a folder nor a published SAE (RELEASE/SAE_ID); known "
        f"releases: {', '.join(sorted(_releases()))} (structlens.sae.registry)."
    )
