"""The causal-dimensionality protocol: bad values fail at construction with one line, a
protocol round-trips through its JSON (and the CLI reads it), and its prompt sets follow the
split rule (SAE training, evaluation and CE chunks disjoint; Jacobian windows chunk-major,
held-out chunks first)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from structlens.causal_dim.protocol import PROFILES, CausalProtocol
from structlens.cli import causal as ccli
from structlens.errors import InputError


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"jacobian_output": "probs"}, "jacobian_output must be 'log_probs' or 'raw'"),
        ({"jacobian_positions": "all"}, "jacobian_positions must be"),
        ({"kappa_unit": "token"}, "kappa_unit must be 'chunk' or 'vector'"),
        ({"kappa_max_vectors": 1}, "kappa_max_vectors must be an integer >= 2"),
        ({"kappa_start": 64, "kappa_max_vectors": 32}, "must not exceed kappa_max_vectors"),
        ({"kappa_tolerance": 1.0}, "kappa_tolerance must exceed 1"),
        ({"sweep_widths": (512,)}, "at least two ascending"),
        ({"sweep_widths": (512, 256)}, "at least two ascending"),
        ({"sweep_widths": ("a", "b")}, "sweep_widths must be a list of integers"),
        ({"percentile": 100.0}, "percentile must lie in"),
        ({"jacobian_tokens": 200}, "must not exceed chunk_tokens"),
        ({"sae_train_tokens": 10}, "sae_train_tokens must be null or at least"),
        ({"seed": True}, "seed must be int"),
        ({"sae_train_extra": -1}, "sae_train_extra must be null or >= 0"),
        ({"sae_generated_prompts": -1}, "sae_generated_prompts must be an integer >= 0"),
        ({"sae_generated_prefix": 128}, "sae_generated_prefix .* must be below chunk_tokens"),
        ({"fvu_rise_tol": 0.0}, "fvu_rise_tol must lie in"),
        ({"depth_fvu_tol": 1.0}, "depth_fvu_tol must lie in"),
        ({"depth_k_ladder": (8, 4)}, "depth_k_ladder must be ascending distinct"),
        ({"depth_k_ladder": (0, 4)}, "depth_k_ladder must be ascending distinct"),
        ({"depth_k_trials": 0}, "depth_k_trials must be an integer >= 1"),
    ],
)
def test_bad_values_fail_at_construction(changes, message):
    with pytest.raises(InputError, match=message) as err:
        PROFILES["paper"].replace(**changes)
    assert "\n" not in str(err.value)


def test_json_round_trip_key_and_profiles():
    for name, p in PROFILES.items():
        assert CausalProtocol(**json.loads(json.dumps(p.to_json()))) == p, name
    paper = PROFILES["paper"]
    assert paper.key() != paper.replace(kappa_unit="vector").key()
    assert paper.key() == CausalProtocol().key()
    # every profile keeps the paper's rules; only sizes differ
    for p in PROFILES.values():
        assert (p.kappa_unit, p.jacobian_output, p.jacobian_positions) == (
            "chunk", "log_probs", "same"
        )  # fmt: skip
        assert (p.kappa_tolerance, p.percentile, p.min_base_width_ratio) == (1.05, 98.0, 4.0)
    for f in CausalProtocol.__dataclass_fields__.values():
        assert f.metadata["help"], f.name


def test_the_cli_refuses_a_protocol_file_with_unknown_fields(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(PROFILES["smoke"].to_json() | {"kappa_vectors": 3}))
    r = CliRunner().invoke(
        ccli.app, ["jacobian", "tiny-llama", "--protocol", str(path), "--out", str(tmp_path)]
    )
    assert r.exit_code == 2 and "kappa_vectors" in r.output


def test_prompt_sets_follow_the_split_rule():
    from structlens.causal_dim.stages import prompt_sets
    from structlens.data.corpus import chunk_documents, load_texts
    from structlens.models import load_model

    tok = load_model("tiny-llama").tokenizer
    p = PROFILES["smoke"].replace(kappa_max_vectors=2000)
    sets = prompt_sets(p, tok)
    full = [
        list(c.token_ids)
        for c in chunk_documents(load_texts(None), tok, max_tokens=p.chunk_tokens)
        if len(c.token_ids) == p.chunk_tokens
    ]
    held = full[:: p.holdout_every]
    other = [c for i, c in enumerate(full) if i % p.holdout_every]
    train, ev, ce = (list(map(tuple, x)) for x in (sets.sae_train, sets.sae_eval, sets.ce))
    n_tr, n_side = p.sae_train_prompts, p.sae_train_prompts + p.sae_eval_extra
    assert len(train) == n_tr + p.sae_train_extra and len(ce) == p.ce_prompts
    assert len(ev) == p.sae_eval_prompts + p.sae_eval_extra
    assert not set(train) & set(ev) and not set(ce) & set(train + ev)
    assert [list(x) for x in ev[: p.sae_eval_prompts]] == held[: p.sae_eval_prompts]
    # the extra training chunks come after the training-side evaluation chunks
    assert [list(x) for x in ev[p.sae_eval_prompts :]] == other[n_tr:n_side]
    assert [list(x) for x in train] == other[:n_tr] + other[n_side : n_side + p.sae_train_extra]
    assert sets.n_train_extra == p.sae_train_extra
    # windows: chunk-major, held-out chunks first (the first vectors all differ in chunk)
    n_held = len(held)
    first = sets.kappa_chunks[:n_held]
    assert len(set(first)) == n_held and all(c % p.holdout_every == 0 for c in first)
    assert sets.kappa_chunks[n_held] == sets.kappa_chunks[0]  # the next window of chunk 0
    step = p.jacobian_tokens + p.jacobian_gap
    assert sets.kappa_windows[n_held] == full[0][step : step + p.jacobian_tokens]
    assert all(len(w) == p.jacobian_tokens for w in sets.kappa_windows)
    assert len(sets.kappa_windows) == 2000
    assert sets.holdout_stride == p.holdout_every  # enough chunks: the protocol's stride
    with pytest.raises(InputError, match="held-out"):
        prompt_sets(PROFILES["smoke"].replace(sae_eval_prompts=10_000), tok)
    # one more held-out chunk than every holdout_every-th gives: the longest stride that
    # holds out enough (a large-vocabulary tokenizer's fewer chunks), the sets still disjoint
    need = len(held) + 1 - p.ce_prompts
    denser = prompt_sets(p.replace(sae_eval_prompts=need), tok)
    stride = denser.holdout_stride
    assert stride < p.holdout_every and -(-len(full) // stride) >= len(held) + 1
    assert -(-len(full) // (stride + 1)) < len(held) + 1
    assert [list(x) for x in denser.sae_eval[:need]] == full[::stride][:need]
    assert not {tuple(c) for c in denser.sae_train} & {tuple(c) for c in denser.sae_eval}


def test_width_ratios_give_every_model_width_the_same_sweep():
    from structlens.analyze.config import PROFILES as ANALYZE

    cpu = ANALYZE["cpu"].causal_dim
    assert cpu.for_model(576).sweep_widths == (2304, 4608, 9216)  # SmolLM2: as before
    gemma = cpu.for_model(640)  # Gemma 3 270M: its own 4·d base, so the sweep runs
    assert gemma.sweep_widths == (2560, 5120, 10240)
    gemma.check_widths(640)
    with pytest.raises(InputError, match="below 4·d"):
        cpu.replace(sweep_width_ratios=None, sweep_widths=(2304, 4608)).check_widths(640)
    assert PROFILES["paper"].for_model(640) is PROFILES["paper"]  # absolute widths stay
    with pytest.raises(InputError, match="sweep_width_ratios"):
        PROFILES["paper"].replace(sweep_width_ratios=(8.0, 4.0))


def test_matched_layer_keeps_relative_depth():
    """SmolLM2's κ layers (of 30) land on Gemma 3 270M's (of 18) at the same relative depth,
    the first and last layers on the first and last, and a layer outside the model fails."""
    from structlens.causal_dim.stages import matched_layer

    assert [matched_layer(l, 30, 18) for l in (5, 15, 25)] == [3, 9, 15]
    assert (matched_layer(0, 30, 18), matched_layer(29, 30, 18)) == (0, 17)
    assert [matched_layer(l, 18, 30) for l in (3, 9, 15)] == [5, 15, 25]
    assert matched_layer(1, 3, 3) == 1 and matched_layer(2, 3, 2) == 1
    for bad in ((30, 30, 18), (-1, 30, 18), (0, 0, 18), (0, 30, 0)):
        with pytest.raises(InputError, match="layer"):
            matched_layer(*bad)


def test_a_cross_family_model_must_be_another_model():
    from structlens.causal_dim.protocol import REPLICATION_PROFILES

    cpu = REPLICATION_PROFILES["cpu"]
    assert cpu.cross_family == "gemma3-270m" and REPLICATION_PROFILES["gpu"].cross_family
    assert REPLICATION_PROFILES["smoke"].cross_family != REPLICATION_PROFILES["smoke"].model
    with pytest.raises(InputError, match="another model"):
        cpu.replace(cross_family=cpu.model)
