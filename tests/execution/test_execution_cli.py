"""``--executor`` / ``--address`` on the commands that capture or sweep."""

import json
import sys

import pytest
import typer
from typer.testing import CliRunner

from structlens.cli import capture as capture_cli
from structlens.cli import causal as causal_cli
from structlens.cli import sae as sae_cli
from structlens.execution import get_executor

runner = CliRunner()


def _capture_app() -> typer.Typer:
    app = typer.Typer()
    capture_cli.register(app)
    app.command("noop")(lambda: None)  # two commands, so "capture" stays a sub-command
    return app


def _capture(out, *extra):
    args = ["capture", "tiny-llama", "--sites", "blocks.1.hook_resid_post,hook_embed"]
    args += ["--max-prompts", "6", "--prompt-tokens", "16", "--shard-mb", "0.005"]
    return runner.invoke(_capture_app(), [*args, "--out", str(out), "-q", *extra])


def test_cli_capture_hands_a_ray_executor_to_capture(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    import structlens.capture as capture_pkg
    from structlens.execution.ray import RayExecutor

    real, seen = capture_pkg.capture, []

    def recording(*args, executor=None, **kw):
        seen.append(executor)
        # the executor's own run is covered by test_ray_capture; here: the CLI's wiring
        return real(*args, executor="local", **kw)

    monkeypatch.setattr(capture_pkg, "capture", recording)
    r = _capture(tmp_path, "--executor", "ray", "--address", "10.0.0.1:6379")
    assert r.exit_code == 0, r.output
    (ex,) = seen
    assert isinstance(ex, RayExecutor) and ex.address == "10.0.0.1:6379"
    assert ex.num_gpus_per_task == 0.0  # --device cpu: capture actors reserve no GPU
    doc = json.loads((tmp_path / "capture.json").read_text())
    assert doc["executor"] == "ray" and doc["n_tokens"] == 6 * 16


@pytest.mark.parametrize(
    ("app", "args"),
    [
        (None, ["capture", "tiny-llama", "--sites", "hook_embed"]),
        (sae_cli.app, ["sweep", "tiny-llama", "--out", "x"]),
        (causal_cli.app, ["sweep", "tiny-llama", "--out", "x"]),
    ],
)
def test_cli_rejects_unknown_executor_and_stray_address(app, args, tmp_path):
    app = app or _capture_app()
    r = runner.invoke(app, [*args, "--out", str(tmp_path), "--executor", "dask"])
    assert r.exit_code == 2 and "--executor must be one of local, ray" in r.output
    r = runner.invoke(app, [*args, "--out", str(tmp_path), "--address", "auto"])
    assert r.exit_code == 2 and "add --executor ray" in r.output


def test_without_ray_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what an environment without Ray sees
    with pytest.raises(ImportError, match=r'pip install "structlens\[ray\]"'):
        get_executor("ray")
    assert get_executor().name == "local"  # the default never needs Ray
    r = _capture_app()
    out = runner.invoke(r, ["capture", "tiny-llama", "--sites", "hook_embed", "--executor", "ray"])
    assert out.exit_code == 2 and "structlens[ray]" in out.output


def test_get_executor_validates():
    with pytest.raises(ValueError, match="choose one of"):
        get_executor("spark")
    with pytest.raises(ValueError, match="takes no options"):
        get_executor("local", address="auto")


def test_cli_koopman_convergence_grid_on_ray_equals_local(ray_cluster, tmp_path):
    from structlens.cli import koopman as kcli

    args = ["convergence", "tiny-llama", "--n-corpus", "24", "--prompt-tokens", "32"]
    args += ["--n-task", "0", "--layers", "1,2", "--dictionary", "pca", "--size", "4"]
    args += ["--n-blocks", "8", "--n-repeats", "3", "--control-rank", "4", "-q"]
    docs = {}
    for name in ("local", "ray"):
        # the same --out: the Ray run's capture is a cache hit, so only the grid runs on Ray
        # (distributed capture has its own tests)
        r = runner.invoke(kcli.app, [*args, "--out", str(tmp_path), "--executor", name])
        assert r.exit_code == 0, r.output
        docs[name] = json.loads((tmp_path / "convergence.json").read_text())["results"]
    # one grid point per layer, each identical whichever executor ran it
    assert {(k, d) for k in docs["local"] for d in docs["local"][k]} == {
        ("1", "pca4"),
        ("2", "pca4"),
    }
    assert docs["ray"] == docs["local"]
