"""The import contracts in pyproject.toml hold (import-linter), and they do bite."""

from pathlib import Path

import pytest

importlinter_cli = pytest.importorskip("importlinter.cli")

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_are_kept():
    assert (
        importlinter_cli.lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
        == 0
    )


def test_a_core_that_imports_models_breaks_the_contract(tmp_path, monkeypatch):
    # a throwaway package with the same contract: its core imports its models
    pkg = tmp_path / "fakepkg"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text("")
    (pkg / "core.py").write_text("from fakepkg.models import x\n")
    (tmp_path / "contracts.toml").write_text(
        '[tool.importlinter]\nroot_package = "fakepkg"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "core never imports models"\ntype = "forbidden"\n'
        'source_modules = ["fakepkg.core"]\nforbidden_modules = ["fakepkg.models"]\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rc = importlinter_cli.lint_imports(
        config_filename=str(tmp_path / "contracts.toml"), no_cache=True
    )
    assert rc == 1
