"""Bad options fail before the model: every command group rejects a bad option value with one
line ``error: ...`` and exit 2 without importing torch, transformers or SciPy (each costs
seconds to import on a small machine), and ``--help`` imports none of them.  The registries'
names that ``structlens.cli.checks`` and the protocols copy (to check without importing them)
stay equal to the registries."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

M = "tiny-llama"

# runs structlens ARGV in a fresh interpreter; prints the heavy modules imported, as JSON
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from structlens.cli.main import main
    try:
        main(sys.argv[1:])
    finally:
        heavy = sorted(
            m for m in sys.modules if m.split(".")[0] in {"torch", "transformers", "scipy"}
        )
        print("HEAVY=" + json.dumps(heavy))
    """
)

# (id, argv, needle in the error line): one bad option per command at least
BAD = [
    ("capture", ["capture", M, "--sites", "hook_embed", "--max-prompts", "-3"], "max_prompts"),
    ("capture-batch", ["capture", M, "--sites", "hook_embed", "--batch-size", "0"], "batch_size"),
    ("capture-data", ["capture", M, "--sites", "x", "--data", "task:nope"], "nope"),
    ("capture-executor", ["capture", M, "--sites", "x", "--executor", "nope"], "nope"),
    ("tasks-eval", ["tasks", "eval", "--model", M, "-n", "0"], "n must be"),
    ("tasks-eval-task", ["tasks", "eval", "--model", M, "--task", "iio"], "ioi"),
    ("sae-train", ["sae", "train", M, "--width", "0"], "--widths"),
    ("sae-train-arch", ["sae", "train", M, "--arch", "nope"], "nope"),
    ("sae-sweep", ["sae", "sweep", M, "--widths", "64,0"], "--widths"),
    ("sae-eval", ["sae", "eval", M, "--sae", "{missing}"], "does-not-exist"),
    ("koopman-fit", ["koopman", "fit", M, "--dictionary", "nope"], "nope"),
    ("koopman-convergence", ["koopman", "convergence", M, "--n-blocks", "2"], "--n-blocks"),
    ("koopman-invariance", ["koopman", "invariance", M, "--size", "0"], "size"),
    ("koopman-modes", ["koopman", "modes", M, "--k", "0"], "k must"),
    ("koopman-reduce", ["koopman", "reduce", M, "--order", "0"], "--order"),
    ("ndm-train", ["ndm", "train", M, "--steps", "0"], "steps"),
    ("ndm-evaluate", ["ndm", "evaluate", M, "--train", "{missing}"], "does-not-exist"),
    ("ndm-browse", ["ndm", "browse", M, "--train", "{missing}", "--prompt", "hi"], "ndm_train"),
    ("causal-jacobian", ["causal-dim", "jacobian", M, "--output", "nope"], "nope"),
    ("causal-sweep", ["causal-dim", "sweep", M, "--widths", "0"], "--widths"),
    ("causal-ablate", ["causal-dim", "ablate", M, "--sae", "{missing}"], "does-not-exist"),
    ("equiv-compare", ["equiv", "compare", M, M, "--map", "nope"], "--map"),
    ("equiv-similarity", ["equiv", "similarity", M, M, "--metric", "nope"], "nope"),
    ("analyze", ["analyze", M, "--profile", "nope"], "--profile"),
    ("replicate", ["replicate", "koopman", "--threads", "0"], "--threads"),
    ("report", ["report", "{missing}"], "analysis.json"),
    ("sites", ["sites", M, "--dtype", "float8"], "float8"),
    ("models", ["models", "--out", "{file}/out"], "Not a directory"),
    ("demo", ["demo", "--model", M, "-n", "0"], "n must"),
    ("calibrate", ["calibrate", "--profile", "nope"], "--profile"),
]


def _structlens(*argv: str, cwd) -> tuple[int, str, list[str]]:
    """Exit status, output (stdout + stderr, without the HEAVY line) and heavy modules."""
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT, *argv], capture_output=True, text=True, cwd=cwd, timeout=120
    )
    lines = (r.stdout + r.stderr).splitlines()
    heavy = [json.loads(ln.removeprefix("HEAVY=")) for ln in lines if ln.startswith("HEAVY=")]
    assert len(heavy) == 1, r.stdout + r.stderr
    return r.returncode, "\n".join(ln for ln in lines if not ln.startswith("HEAVY=")), heavy[0]


@pytest.mark.parametrize("argv,needle", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_bad_option_fails_before_importing_torch(tmp_path, argv, needle):
    (tmp_path / "file").write_text("")
    paths = {"{missing}": str(tmp_path / "does-not-exist"), "{file}": str(tmp_path / "file")}
    for key, path in paths.items():
        argv = [a.replace(key, path) for a in argv]
    if argv[0] not in ("replicate", "report", "models"):
        argv += ["--out", str(tmp_path / "out")]
    if argv[0] not in ("replicate", "report", "calibrate"):
        argv += ["-q"]
    code, text, heavy = _structlens(*argv, cwd=tmp_path)
    assert code == 2, text
    assert "Traceback" not in text, text
    errors = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and len(text.splitlines()) == 1, text
    assert needle in errors[0], errors[0]
    assert heavy == [], f"{' '.join(argv)} imported {heavy[:5]}"


GROUPS = ["tasks", "ndm", "equiv", "koopman", "sae", "causal-dim"]
COMMANDS = [
    ["capture"], ["sites"], ["models"], ["demo"], ["analyze"], ["report"], ["replicate"],
    ["calibrate"],
    ["tasks", "eval"], ["sae", "train"], ["sae", "sweep"], ["sae", "eval"], ["koopman", "fit"],
    ["koopman", "convergence"], ["koopman", "invariance"], ["koopman", "modes"],
    ["koopman", "reduce"], ["ndm", "train"], ["ndm", "evaluate"], ["ndm", "browse"],
    ["causal-dim", "jacobian"], ["causal-dim", "sweep"], ["causal-dim", "ablate"],
    ["equiv", "compare"], ["equiv", "similarity"],
]  # fmt: skip


@pytest.mark.parametrize(
    "argv", [[], *([g] for g in GROUPS), *COMMANDS], ids=lambda a: " ".join(a) or "structlens"
)
def test_help_does_not_import_torch(tmp_path, argv):
    code, text, heavy = _structlens(*argv, "--help", cwd=tmp_path)
    assert code == 0, text
    assert "Usage" in text
    assert heavy == []


def test_copied_names_match_the_registries():
    from structlens.analyze.config import PROFILES
    from structlens.cli import checks
    from structlens.data.tasks import MAX_PROMPTS, available_tasks
    from structlens.equivalence.matching import METRICS
    from structlens.equivalence.probes import MIN_PROMPTS
    from structlens.equivalence.protocol import METRIC_NAMES, MIN_PROBE_PROMPTS, PROBE_TASKS
    from structlens.execution import EXECUTORS
    from structlens.koopman.pipeline import DICTIONARIES
    from structlens.koopman.protocol import DICTIONARY_NAMES
    from structlens.models.loading import resolve_dtype
    from structlens.sae import SAE_ARCHITECTURES

    assert list(PROBE_TASKS) == available_tasks()
    assert checks.MAX_TASK_PROMPTS == MAX_PROMPTS
    assert list(DICTIONARY_NAMES) == list(DICTIONARIES)
    assert list(checks.SAE_ARCHITECTURE_NAMES) == list(SAE_ARCHITECTURES)
    assert list(METRIC_NAMES) == ["linear_cka", "linear_cka_debiased", *METRICS]
    assert list(checks.PROFILE_NAMES) == list(PROFILES)
    assert MIN_PROBE_PROMPTS == MIN_PROMPTS
    assert set(EXECUTORS) == {"local", "ray"}  # analyze's --executor check names these two
    for name in checks.DTYPES:
        resolve_dtype(name)
    with pytest.raises(ValueError, match=", ".join(checks.DTYPES) + "$"):
        resolve_dtype("float8")


def test_checks_say_what_the_configs_say():
    """The same bad value gives the same message from the early check and from the config."""
    from structlens.cli.checks import check_task
    from structlens.data.tasks import make_task
    from structlens.errors import InputError
    from structlens.koopman.experiment import KoopmanExperimentConfig
    from structlens.sae.experiment import SAEExperimentConfig

    def message(fn):
        with pytest.raises(ValueError) as info:
            fn()
        return str(info.value)

    assert message(lambda: check_task("iio")) == message(lambda: make_task("iio", None))
    assert isinstance(_raised(lambda: check_task("iio")), InputError)
    assert message(lambda: SAEExperimentConfig(widths=(0,))) == (
        "widths must be positive integers; got [0]."
    )
    assert message(lambda: SAEExperimentConfig(k=0)) == "d_sae and k must be positive."
    assert message(lambda: KoopmanExperimentConfig(dictionaries=("nope",))) == (
        "unknown dictionary 'nope'; choose from identity, pca, rff, rff-features, relu, "
        "spectral, sae."
    )
    assert message(lambda: KoopmanExperimentConfig(analysis="modes", k=40, size=32)) == (
        "k must be in [1, size=32]; got 40."
    )


def _raised(fn):
    try:
        fn()
    except Exception as err:  # noqa: BLE001  (the class is under test)
        return err
    raise AssertionError("no exception")
