"""Figures for each method (matplotlib, Agg backend); one saver shared by all of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay out ``fig``, write it as a 120-dpi image to ``path`` (parents created), close it."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
