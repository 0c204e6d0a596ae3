"""``python -m structlens.replication <method> [--profile cpu|gpu|smoke]``."""

from __future__ import annotations

import argparse
import importlib
import sys

from structlens.replication import METHODS


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m structlens.replication",
        description="Run (or resume) one replication and write its markdown and claims JSON.",
    )
    ap.add_argument("method", choices=sorted(METHODS))
    ap.add_argument("--profile", default="cpu", choices=["cpu", "gpu", "smoke"])
    ap.add_argument("--out", default=None, help="stage cache (default results/replication/...)")
    ap.add_argument("--doc-dir", default=None, help="where the .md and .json go")
    ap.add_argument("--device", default="cpu", help="torch device for models and training")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (shared: 1)")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(a.threads)
    module = importlib.import_module(METHODS[a.method])
    module.run(a.profile, out=a.out, doc_dir=a.doc_dir, device=a.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
