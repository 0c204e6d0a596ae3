"""The registry of published SAE releases (structlens.sae.registry): names resolve to hub
folders, well-formed entries, files found in a local directory or the Hugging Face cache
without network, and a clear error where they are in neither and there is no network."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from structlens.errors import ForeignResultError, InputError
from structlens.provenance import ForeignResultWarning
from structlens.sae import FORMATS, load_pretrained, pretrained_releases, resolve
from structlens.sae.formats import _gemma_sites, _sparsify_sites
from structlens.sae.registry import (
    LOCAL_DIR_ENV,
    PretrainedUnavailableError,
    locate,
    read_pretrained,
)
from structlens.sites import parse_site

G2 = "gemma-scope-2-270m-pt-res/layer_12_width_16k_l0_medium"
D, M = 8, 16


@pytest.fixture(autouse=True)
def _no_network(monkeypatch, tmp_path):
    """No test here may reach the hub: an empty cache, offline, no local directory."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.delenv(LOCAL_DIR_ENV, raising=False)


def _gemma2(folder):
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    p = {"w_enc": rng.standard_normal((D, M)), "b_enc": rng.standard_normal(M),
         "w_dec": rng.standard_normal((M, D)), "b_dec": rng.standard_normal(D),
         "threshold": np.abs(rng.standard_normal(M))}  # fmt: skip
    save_file({k: v.astype(np.float32) for k, v in p.items()}, str(folder / "params.safetensors"))


class _Model:
    def __init__(self, name):
        self.name = name

    def fingerprint(self):
        return "0" * 64


def test_names_resolve_to_hub_folders():
    e = resolve("gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_71")
    assert (e.repo, e.path) == ("google/gemma-scope-2b-pt-res", "layer_20/width_16k/average_l0_71")
    assert (e.model, e.hook, e.format) == (
        "google/gemma-2-2b",
        "blocks.20.hook_resid_post",
        "gemma-scope",
    )
    e = resolve("gpt2-small-res-jb/blocks.8.hook_resid_pre")
    assert (e.repo, e.path, e.hook) == (
        "jbloom/GPT2-Small-SAEs-Reformatted",
        "blocks.8.hook_resid_pre",
        "blocks.8.hook_resid_pre",
    )
    with pytest.raises(InputError, match="gemma-scope-2b-pt-res"):
        resolve("gemma-scope-2b-pt-rez/layer_20/width_16k/average_l0_71")
    with pytest.raises(InputError, match="average_l0_71"):
        resolve("gemma-scope-2b-pt-res/layer_20/width_16k/average_l0_7")


def test_every_entry_is_well_formed():
    releases = pretrained_releases()
    assert {"gpt2-small-res-jb", "gemma-scope-2b-pt-res", "gemma-scope-2-270m-pt-res"} <= set(
        releases
    )
    assert {r["format"] for r in releases.values()} == set(FORMATS)
    for release, r in releases.items():
        assert re.fullmatch(r"[\w.-]+/[\w.-]+", r["repo"]) and r["model"], release
        for sae_id in r["saes"]:
            e = resolve(f"{release}/{sae_id}")
            parse_site(e.hook, n_layers=64)  # a valid site name
            layer = int(re.search(r"blocks\.(\d+)", e.hook).group(1))
            # the site agrees with what the path says, read by the layout's own rule
            if e.format == "gemma-scope-2":
                assert _gemma_sites(Path(e.path), {})["hook_name"] == e.hook
            elif e.format == "sparsify":
                assert _sparsify_sites(e.path, False)["hook_name"] == e.hook
            else:
                assert str(layer) in e.path, (release, sae_id)


@pytest.mark.parametrize("layout", ["release", "repo"])
def test_local_directory(tmp_path, monkeypatch, layout):
    root = tmp_path / "saes"
    e = resolve(G2)
    _gemma2(root / e.release / e.sae_id if layout == "release" else root / e.repo / e.path)
    monkeypatch.setenv(LOCAL_DIR_ENV, str(root))
    d = read_pretrained(G2)
    assert d.format == "gemma-scope-2" and d.module.d_sae == M
    assert d.metadata["model_name"] == "google/gemma-3-270m"
    assert d.metadata["hook_name"] == "blocks.12.hook_resid_post"
    assert d.metadata["registry"] == G2
    # the registry's model and site are the provenance
    gemma = _Model("google/gemma-3-270m")
    assert load_pretrained(G2, model=gemma, site="blocks.13.hook_resid_pre").d_in == D
    with pytest.raises(ForeignResultError, match="gpt2"):
        load_pretrained(G2, model=_Model("gpt2"), site="blocks.13.hook_resid_pre")
    with pytest.raises(ForeignResultError, match="site"):
        load_pretrained(G2, model=gemma, site="blocks.3.hook_resid_pre")
    with pytest.warns(ForeignResultWarning):
        load_pretrained(G2, model=_Model("gpt2"), allow_foreign=True)


def test_hugging_face_cache_without_network(tmp_path, monkeypatch):
    e = resolve(G2)
    cache = tmp_path / "hub"
    repo = cache / f"models--{e.repo.replace('/', '--')}"
    commit = "a" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    _gemma2(repo / "snapshots" / commit / e.path)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    folder = locate(e)
    assert folder == repo / "snapshots" / commit / e.path
    assert read_pretrained(G2).metadata["repo"] == e.repo


def test_offline_without_files_says_where_to_put_them():
    with pytest.raises(PretrainedUnavailableError) as info:
        load_pretrained(G2)
    msg = str(info.value)
    assert "\n" not in msg and "offline" in msg
    assert LOCAL_DIR_ENV in msg and "huggingface-cli download google/gemma-scope-2-270m-pt" in msg
    assert "resid_post/layer_12_width_16k_l0_medium" in msg


def test_failed_download_is_a_clear_error(monkeypatch):
    import huggingface_hub

    calls = []

    def refuse(repo, *, allow_patterns, cache_dir, local_files_only):
        calls.append((repo, allow_patterns, local_files_only))
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
        raise ConnectionError("no route to huggingface.co")

    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", refuse)
    with pytest.raises(PretrainedUnavailableError, match="download failed.*ConnectionError"):
        locate(resolve(G2))
    # only the SAE's own folder is asked for
    assert calls == [
        ("google/gemma-scope-2-270m-pt", ["resid_post/layer_12_width_16k_l0_medium/*"], True),
        ("google/gemma-scope-2-270m-pt", ["resid_post/layer_12_width_16k_l0_medium/*"], False),
    ]
    with pytest.raises(PretrainedUnavailableError, match="downloads are off"):
        locate(resolve(G2), download=False)


def test_a_path_that_is_no_release_names_the_releases(tmp_path):
    with pytest.raises(InputError, match="neither a directory nor a published release"):
        read_pretrained(str(tmp_path / "nowhere"))
