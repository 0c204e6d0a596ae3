"""Source conventions that review alone does not keep: site names come from ``sites.py``, and
issue numbers stay out of the package and the documents it generates (protocol history is in
``docs/changelog.md``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "structlens"
GENERATED = ROOT / "docs" / "replication"

#: a layer site spelled out: ``blocks.{…}.hook_…`` or ``decoder.{…}.attn.hook_…``
_SITE = re.compile(r"(?<![\w.])(blocks|encoder|decoder)\.\{\}\.(\w+\.)?hook_")
_ISSUE = re.compile(r"\bissues?[ -]#?\d+|\bissues? \d+ and \d+|(?<![\w&])#\d{1,3}\b(?!-)", re.I)


def _where(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _template(node: ast.JoinedStr) -> str:
    """The f-string with every replacement field written as ``{}``."""
    return "".join(
        v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else "{}"
        for v in node.values
    )


def _f_string_sites(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{_where(path)}:{node.lineno}: {_template(node)!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr) and _SITE.search(_template(node))
    ]


def test_site_names_are_built_only_by_sites_py():
    found = [
        hit
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "sites.py" or path.parent != PACKAGE
        for hit in _f_string_sites(path)
    ]
    assert not found, "build these with structlens.sites.site_name:\n" + "\n".join(found)


def test_the_site_check_catches_an_f_string_site(tmp_path):
    # the positive control: the check above would see a site spelled out in an f-string
    src = tmp_path / "m.py"
    src.write_text('L = 3\nx = f"blocks.{L}.hook_resid_pre"\ny = f"decoder.{L}.attn.hook_z"\n')
    assert len(_f_string_sites(src)) == 2


def _issue_mentions(paths: list[Path]) -> list[str]:
    return [
        f"{_where(p)}:{i}: {line.strip()}"
        for p in paths
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if _ISSUE.search(line)
    ]


def test_no_issue_numbers_in_the_package_or_generated_documents():
    paths = [
        p
        for p in sorted(PACKAGE.rglob("*"))
        if p.suffix in {".py", ".md", ".json", ".html", ".js", ".css"} and p.is_file()
    ]
    paths += sorted(p for p in GENERATED.iterdir() if p.suffix in {".md", ".json"})
    found = _issue_mentions(paths)
    assert not found, "protocol history belongs in docs/changelog.md:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line",
    ["the protocol of issue 15", "see issue-16", "issues 15 and 16", "fixed in #17"],
)
def test_the_issue_check_catches_a_mention(tmp_path, line):
    p = tmp_path / "x.md"
    p.write_text(f"text\nsee #ff0000 and 1,000 & #x;\n{line}\n")
    assert len(_issue_mentions([p])) == 1


#: The drivers: they run stages and render, so a long function there is science in the wrong
#: place (verdicts belong in ``<method>/verdicts.py``, computation in ``<method>/stages.py``).
DRIVERS = ("analyze", "cli", "replication", "calibration", "report")
MAX_DRIVER_LINES = 80


def _long_functions(path: Path, limit: int = MAX_DRIVER_LINES) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{_where(path)}:{node.lineno}: {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > limit
    ]


def test_no_driver_function_is_longer_than_80_lines():
    found = [
        f for d in DRIVERS for p in sorted((PACKAGE / d).rglob("*.py")) for f in _long_functions(p)
    ]
    assert not found, "driver functions over 80 lines:\n" + "\n".join(found)


def test_the_length_check_catches_a_long_function(tmp_path):
    src = tmp_path / "long.py"
    src.write_text("def f():\n" + "    x = 1\n" * 80 + "\n\ndef g():\n    return 1\n")
    assert [line.split(": ")[1] for line in _long_functions(src)] == ["f (81 lines)"]
