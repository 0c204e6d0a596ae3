"""Bad input versus bugs: a validation error ends in one line (exit 2), but a ValueError or
TypeError from inside the code (a format string, a library call) is a bug: its traceback and
a request to report it, exit 1, both at the top level and inside commands whose options are
declared by ``common_options``."""

from __future__ import annotations

import numpy as np
import pytest
from _outcome import assert_user_error, run_cli

from structlens.errors import ForeignResultError, InputError, UserError, is_user_error

M = "tiny-llama"


def _caught(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001  (the classification is under test)
        return err
    raise AssertionError("no exception")


def test_input_error_is_a_user_error_and_a_value_error():
    err = InputError("bad --n")
    assert isinstance(err, ValueError) and isinstance(err, UserError) and is_user_error(err)
    assert issubclass(ForeignResultError, UserError)


def test_validation_raised_by_structlens_is_a_user_error():
    from structlens.registry import Registry
    from structlens.stats.validation import check_array

    assert is_user_error(_caught(lambda: check_array([1.0, 2.0], name="X")))
    assert isinstance(_caught(lambda: check_array([1.0, 2.0], name="X")), InputError)
    # a plain ValueError from a `raise` in structlens (written before InputError) still counts
    err = _caught(lambda: Registry("shape").register("", object()))
    assert type(err) is ValueError and is_user_error(err)


def test_value_errors_from_inside_the_code_are_bugs():
    assert not is_user_error(_caught(lambda: f"{'text':.3f}"))  # format code 'f' for str
    assert not is_user_error(_caught(lambda: np.zeros(3).reshape(2, 2)))
    assert not is_user_error(_caught(lambda: int("x")))
    assert not is_user_error(_caught(lambda: None + 1))  # TypeError


def test_a_validation_error_passing_on_a_bug_is_a_bug(monkeypatch):
    import structlens.koopman.pipeline as pipeline
    from structlens.koopman.protocol import KoopmanProtocol
    from structlens.koopman.stages import LayerRows, fit_dictionary

    def broken(*a, **k):
        raise ValueError("Unknown format code 'f' for object of type 'str'")

    monkeypatch.setattr(pipeline, "make_dictionary", lambda *a, **k: _Fits(broken))
    protocol = KoopmanProtocol(dictionary_fit="all")
    rows = LayerRows((1,), *(np.zeros((4, 2)) for _ in range(3)), np.arange(4))
    # fit_dictionary re-raises every ValueError of the fit as "pca:2 dictionary ..." from it
    err = _caught(lambda: fit_dictionary(protocol, "pca:2", rows))
    assert type(err) is ValueError and str(err).startswith("pca:2 dictionary")
    assert not is_user_error(err)
    # the same wrapper around a validation error stays a user error
    monkeypatch.setattr(pipeline, "make_dictionary", lambda *a, **k: _Fits(lambda *a: check_rows()))
    assert is_user_error(_caught(lambda: fit_dictionary(protocol, "pca:2", rows)))


def check_rows():
    from structlens.stats.validation import check_array

    check_array([1.0], name="X")


class _Fits:
    def __init__(self, fit):
        self.fit = fit


def test_a_translated_library_error_is_a_user_error():
    from structlens.models.loading import check_device

    err = _caught(lambda: check_device("quantum"))
    assert is_user_error(err) and "quantum" in str(err)


@pytest.fixture
def sae_dir(tmp_path):
    from structlens.models import load_model
    from structlens.provenance import provenance
    from structlens.sae import TopKSAE, save_sae

    m = load_model(M)
    return save_sae(
        TopKSAE(m.d_model, 8, 2), tmp_path / "sae", **provenance(m, "blocks.0.hook_resid_pre")
    )


def _format_bug(*a, **k):
    return f"{'a string':.3f}"


def _type_bug(*a, **k):
    raise TypeError("unsupported operand type(s) for +: 'NoneType' and 'int'")


@pytest.mark.parametrize("bug", [_format_bug, _type_bug], ids=["format-value-error", "type-error"])
def test_internal_bug_inside_a_common_options_command_is_reported_as_a_bug(
    capsys, tmp_path, monkeypatch, sae_dir, bug
):
    import structlens.sae.experiment as experiment

    monkeypatch.setattr(experiment, "evaluate", bug)
    o = run_cli(
        capsys, "sae", "eval", M, "--sae", sae_dir, "--eval-prompts", 1, "--prompt-tokens", 8,
        "--out", tmp_path / "out", "-q",
    )  # fmt: skip
    assert o.code == 1, o.err
    assert "Traceback" in o.err and "_bug" in o.err
    assert "bug in structlens" in o.err and "report" in o.err


def test_internal_value_error_at_the_top_level_is_a_bug(capsys, tmp_path, monkeypatch):
    import structlens.cli.models as models_cli

    monkeypatch.setattr(models_cli, "write_results", _format_bug)
    o = run_cli(capsys, "models", "--out", tmp_path, "-q")
    assert o.code == 1 and "Traceback" in o.err and "report" in o.err


def test_internal_value_error_in_model_loading_is_a_bug(capsys, tmp_path, monkeypatch):
    import structlens.models as models

    monkeypatch.setattr(models, "load_model", _format_bug)
    o = run_cli(capsys, "sites", M, "--out", tmp_path, "-q")
    assert o.code == 1 and "Traceback" in o.err and "report" in o.err


def test_bad_input_inside_the_same_command_is_still_one_line(capsys, tmp_path, sae_dir):
    o = run_cli(
        capsys, "sae", "eval", M, "--sae", sae_dir, "--eval-prompts", 0, "--out", tmp_path, "-q"
    )
    assert_user_error(o, "--eval-prompts")
