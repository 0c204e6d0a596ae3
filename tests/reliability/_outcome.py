"""Outcome classes the reliability suite asserts: a clear one-line error, or success."""

from __future__ import annotations

import dataclasses

from structlens.cli.main import main


@dataclasses.dataclass
class Outcome:
    code: int
    out: str
    err: str


def run_cli(capsys, *args) -> Outcome:
    """Run ``structlens ARGS`` in this process through the real entry point."""
    capsys.readouterr()
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def assert_user_error(o: Outcome, *needles: str) -> None:
    """Exit 2, no traceback, and exactly one ``error:`` line that mentions every needle."""
    text = o.out + o.err
    assert o.code == 2, f"exit {o.code}, expected 2:\n{text}"
    assert "Traceback" not in text, text
    lines = [ln for ln in text.splitlines() if "error" in ln.lower()[:12]]
    assert len(lines) == 1, f"expected one error line:\n{text}"
    for n in needles:
        assert n in lines[0], f"{n!r} not in {lines[0]!r}"


def assert_ok(o: Outcome) -> None:
    assert o.code == 0, f"exit {o.code}:\n{o.out}{o.err}"
    assert "Traceback" not in o.out + o.err
