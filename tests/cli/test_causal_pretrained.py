"""``structlens causal-dim sweep --saes``: the width sweep of published SAEs, nothing trained.

SAEs that the sweep trained in-process and saved, given back with ``--saes``, give the same
sweep (N_repr, N_causal, the wedge, κ̂ and every other field) and κ; SAEs made from another
model or site are refused unless ``--allow-foreign``; bad ``--saes`` values fail before torch
is imported."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from typer.testing import CliRunner

from structlens.cli.main import app
from structlens.sae import TopKSAE, save_sae

M = "tiny-llama"
LAYER = 1
SITE = f"blocks.{LAYER}.hook_resid_pre"
WIDTHS = (256, 512, 1024)
SEED = 3
runner = CliRunner()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _tied_topk(width, d, seed):
    """A TopK SAE with random unit decoder rows and the tied encoder (a wider dictionary
    holds more directions to pick from)."""
    sae = TopKSAE(d, width, 8, seed=seed)
    with torch.no_grad():
        sae.W_enc_t.copy_(sae.W_dec)
    return sae


@pytest.fixture(scope="module")
def model():
    from structlens.models import load_model

    return load_model(M, seed=SEED)  # a tiny model's weights follow the seed


@pytest.fixture(scope="module")
def saved(model, tmp_path_factory):
    from structlens.provenance import provenance

    root = tmp_path_factory.mktemp("pretrained")
    saes = {w: _tied_topk(w, model.d_model, seed=i) for i, w in enumerate(WIDTHS)}
    for w, sae in saes.items():
        save_sae(sae, root / str(w), **provenance(model, SITE))
    # the same SAEs as another model's
    for w, sae in saes.items():
        save_sae(sae, root / "other" / str(w), hook_name=SITE, model_name="someone/else")
    return root, saes


def test_pretrained_sweep_equals_the_sweep_that_trained_them(tmp_path):
    # the acceptance: SAEs trained in-process by the sweep and saved, then given back with
    # --saes, give the same sweep (every field) and κ, with nothing trained the second time
    base = ["causal-dim", "sweep", M, "--protocol", "smoke", "--layer", LAYER, "--seed", SEED]
    r = _run(*base, "--out", tmp_path / "trained", "-q")
    assert r.exit_code == 0, r.output
    trained = json.loads((tmp_path / "trained" / "causal_sweep.json").read_text())
    widths = trained["sweep"]["widths"]
    specs = [x for w in widths for x in ("--saes", tmp_path / "trained" / "saes" / str(w))]
    r = _run(*base, *specs, "--out", tmp_path / "loaded", "-q")
    assert r.exit_code == 0, r.output
    loaded = json.loads((tmp_path / "loaded" / "causal_sweep.json").read_text())
    assert "training" not in loaded and not (tmp_path / "loaded" / "saes").exists()
    assert loaded["pretrained"]["foreign"] == []
    # published SAEs have no training FVU, so the gate cannot say why it fails for them:
    # everything else is the same
    assert loaded["sweep"]["train_fvu"] is None and loaded["sweep"]["fvu_gap"] is None
    cause = trained["sweep"]["sweep_cause"]
    assert loaded["sweep"]["sweep_cause"] == (cause and "undiagnosed")
    assert _without_diagnosis(loaded["sweep"]) == _without_diagnosis(trained["sweep"])
    assert loaded["kappa"] == trained["kappa"]
    # a sweep with something to compare: features fire at every width and some are causal
    # (N_causal may be 0 at a wider width: ε is the base width's 98th percentile)
    assert min(loaded["sweep"]["n_repr"]) > 0 and loaded["sweep"]["n_causal"][0] > 0


def _without_diagnosis(sweep):
    """A sweep document without what the training FVU adds: the train FVU, its gap to the
    held-out FVU and the diagnosis in the gate's words."""
    drop = {"train_fvu", "fvu_gap", "sweep_cause", "sweep_reason", "kappa_hat_reason"}
    out = {k: v for k, v in sweep.items() if k not in drop}
    out["base_width_sensitivity"] = {
        b: {k: v for k, v in r.items() if k != "kappa_hat_reason"}
        for b, r in sweep["base_width_sensitivity"].items()
    }
    return out


def test_foreign_saes_are_refused_unless_allowed(saved, tmp_path):
    root, _ = saved
    base = ["causal-dim", "sweep", M, "--protocol", "smoke", "--seed", SEED, "--layer", LAYER]
    specs = [x for w in WIDTHS for x in ("--saes", root / "other" / str(w))]
    r = _run(*base, *specs, "--out", tmp_path / "refused", "-q")
    assert r.exit_code == 2 and "someone/else" in r.output and "--allow-foreign" in r.output
    assert not (tmp_path / "refused" / "causal_sweep.json").exists()
    # the right model at the wrong site
    wrong = [x for w in WIDTHS for x in ("--saes", root / str(w))]
    r = _run(*base[:-1], LAYER + 1, *wrong, "--out", tmp_path / "site", "-q")
    assert r.exit_code == 2 and "site" in r.output
    r = _run(*base, *specs, "--allow-foreign", "--out", tmp_path / "allowed", "-q")
    assert r.exit_code == 0, r.output
    doc = json.loads((tmp_path / "allowed" / "causal_sweep.json").read_text())
    assert len(doc["pretrained"]["foreign"]) == len(WIDTHS)


def test_a_sweep_needs_two_widths_of_one_site(saved, tmp_path):
    root, _ = saved
    base = ["causal-dim", "sweep", M, "--protocol", "smoke", "--seed", SEED, "--layer", LAYER]
    base.append("-q")
    r = _run(*base, "--saes", root / "256", "--out", tmp_path / "one")
    assert r.exit_code == 2 and "at least two" in r.output
    r = _run(*base, "--saes", root / "256", "--saes", root / "256", "--out", tmp_path / "same")
    assert r.exit_code == 2 and "one SAE per width" in r.output
    r = _run(*base, "--saes", root / "256", "--widths", "256,512", "--out", tmp_path / "both")
    assert r.exit_code == 2 and "exclude each other" in r.output


SCRIPT = textwrap.dedent(
    """
    import json, sys
    from structlens.cli.main import main
    try:
        main(sys.argv[1:])
    finally:
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "transformers"})
        print("HEAVY=" + json.dumps(heavy))
    """
)


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("no-such-release/x", "known releases"),
        ("gemma-scope-2b-pt-rez/layer_20", "gpt2-small-res-jb"),
        # a known release, an SAE it does not have
        ("gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_7", "neither a folder nor"),
    ],
)
def test_bad_saes_fail_before_torch(tmp_path, spec, needle):
    argv = ["causal-dim", "sweep", M, "--saes", spec, "--saes", spec, "--out", str(tmp_path)]
    r = subprocess.run([sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and needle in err[0], r.stderr
    heavy = json.loads(r.stdout.split("HEAVY=")[-1])
    assert heavy == [], heavy
