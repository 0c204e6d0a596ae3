"""The equivalence stage holds fit rows at the model's precision and reduces each validation
batch before the next; these are the known answers it must keep: the float64 layer maps and
similarities of the same rows, and the KL of every patch's held logits."""

import numpy as np
import pytest
import torch

from structlens.equivalence import (
    fit_layer_map,
    head_similarity_matrix,
    kl_from_logits,
    layer_similarity_matrix,
)
from structlens.equivalence.collect import _pad, collect_rows, forward
from structlens.equivalence.congruity import ROW_BLOCK, LogitReference
from structlens.equivalence.patching import validate
from structlens.equivalence.probes import corpus_probe, task_probe
from structlens.interventions import hooked
from structlens.models import load_model


def _rows(rng, n, d):
    # anisotropic and off-centre, like a residual stream, rounded to float32 as captured
    x = rng.standard_normal((n, d)) * np.exp(-np.arange(d) / 10.0) + 2.0
    return x.astype(np.float32)


def test_layer_map_of_float32_rows_is_the_float64_map_and_recovers_a_rotation():
    rng = np.random.default_rng(0)
    d = 24
    x = _rows(rng, 4 * d, d)
    q = np.linalg.qr(rng.standard_normal((d, d)))[0]
    y = (x.astype(np.float64) @ q).astype(np.float32)
    held = fit_layer_map(x.astype(np.float64), y.astype(np.float64), relation="copy")
    streamed = fit_layer_map(x, y, relation="copy")
    np.testing.assert_array_equal(streamed.weight, held.weight)
    np.testing.assert_array_equal(streamed.bias, held.bias)
    # the planted rotation, up to the float32 rounding of y
    np.testing.assert_allclose(streamed.weight, q, atol=1e-5)


def _debiased_hsic(k, l):
    """Song et al.'s unbiased HSIC from n x n Gram matrices (an independent computation)."""
    n = k.shape[0]
    k, l = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    ones = np.ones(n)
    return (
        np.trace(k @ l)
        + (ones @ k @ ones) * (ones @ l @ ones) / ((n - 1) * (n - 2))
        - 2.0 / (n - 2) * (ones @ k @ l @ ones)
    ) / (n * (n - 3))


def _cka_by_grams(x, y):
    x = x.astype(np.float64) - x.astype(np.float64).mean(0)
    y = y.astype(np.float64) - y.astype(np.float64).mean(0)
    k, l = x @ x.T, y @ y.T
    return _debiased_hsic(k, l) / np.sqrt(_debiased_hsic(k, k) * _debiased_hsic(l, l))


def test_similarities_of_float32_rows_equal_float64_and_the_gram_computation():
    rng = np.random.default_rng(1)
    n, d, heads = 60, 12, 3
    a = [_rows(rng, n, d) for _ in range(3)]
    b = [_rows(rng, n, d) for _ in range(2)] + [a[1]]
    s32 = layer_similarity_matrix(a, b, "linear_cka_debiased")
    s64 = layer_similarity_matrix(
        [m.astype(np.float64) for m in a], [m.astype(np.float64) for m in b], "linear_cka_debiased"
    )
    np.testing.assert_array_equal(s32, s64)
    want = np.array([[_cka_by_grams(x, y) for y in b] for x in a])
    np.testing.assert_allclose(s32, want, rtol=1e-10, atol=1e-12)
    assert s32[1, 2] == pytest.approx(1.0, abs=1e-12)
    za = [m.reshape(n, heads, d // heads) for m in a]
    zb = [m.reshape(n, heads, d // heads) for m in b]
    h32 = head_similarity_matrix(za, zb, "linear_cka_debiased")
    h64 = head_similarity_matrix(
        [z.astype(np.float64) for z in za],
        [z.astype(np.float64) for z in zb],
        "linear_cka_debiased",
    )
    np.testing.assert_array_equal(h32, h64)
    np.testing.assert_allclose(
        h32[2, 1, 0, 2], _cka_by_grams(za[2][:, 1], zb[0][:, 2]), rtol=1e-10, atol=1e-12
    )


def test_kl_of_row_batches_average_to_the_kl_of_all_rows(rng):
    ref, patched = rng.normal(size=(30, 50)) * 3, rng.normal(size=(30, 50)) * 3
    held = kl_from_logits(ref, patched)
    parts = [LogitReference(ref[i : i + 7]).kl(patched[i : i + 7]) for i in range(0, 30, 7)]
    assert float(np.mean(np.concatenate(parts))) == pytest.approx(held, rel=1e-14)
    want = torch.nn.functional.kl_div(
        torch.log_softmax(torch.tensor(patched), -1),
        torch.log_softmax(torch.tensor(ref), -1),
        reduction="batchmean",
        log_target=True,
    )
    assert held == pytest.approx(float(want), abs=1e-12)


def _kl_float64(ref: np.ndarray, patched: np.ndarray) -> np.ndarray:
    """The divergence by float64 log-softmax arithmetic (independent of the module)."""
    a, b = ref.astype(np.float64), patched.astype(np.float64)
    la = a - a.max(1, keepdims=True)
    la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b - b.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    return np.sum(np.exp(la) * (la - lb), axis=1)


@pytest.mark.parametrize("noise", [1.0, 1e-2, 1e-4])
def test_float32_logits_keep_the_float64_kl_to_its_relative_precision(rng, noise):
    """float32 rows over several row blocks and a wide vocabulary: the float64 answer up to
    the float32 error of the terms, about 1e-7 * sqrt(2 KL), large divergence or small."""
    n = 2 * ROW_BLOCK + 5
    ref = (3 * rng.normal(size=(n, 4096))).astype(np.float32)
    patched = (ref + noise * rng.normal(size=ref.shape)).astype(np.float32)
    got = LogitReference(ref).kl(patched)
    want = _kl_float64(ref, patched)
    assert got.dtype == np.float64 and got.shape == (n,)
    assert want.min() > 0  # every row moved
    np.testing.assert_array_less(np.abs(got - want), 1e-6 * np.sqrt(2 * want))
    assert np.all(LogitReference(ref).kl(ref) == 0.0)


def test_a_patch_that_overflows_exp_is_computed_stably(rng):
    ref = (3 * rng.normal(size=(4, 64))).astype(np.float32)
    patched = ref.copy()
    patched[1, 5] += 200.0  # exp(200) overflows float32 and the expm1 form
    got = LogitReference(ref).kl(patched)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, _kl_float64(ref, patched), rtol=1e-5, atol=1e-12)


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny-llama", seed=1)


def test_collected_rows_keep_the_model_precision(tiny):
    probe = corpus_probe(tiny, tiny, n=12, max_chars=60)
    resid, z = collect_rows(tiny, probe.tokens_a[:4], 1, False, 2)
    assert {r.dtype for r in [*resid, *z]} == {np.dtype(np.float32)}
    n = sum(len(t) - 1 for t in probe.tokens_a[:4])
    assert resid[0].shape == (n, tiny.d_model) and z[0].shape[0] == n
    sent, _ = collect_rows(tiny, probe.tokens_a[:4], 1, True, 2)
    assert sent[0].dtype == np.float64 and sent[0].shape == (4, tiny.d_model)


def test_streamed_validation_equals_the_held_logits(tiny):
    """KL and top-1 of a patch over batches of 2 equal those of the logits of every held-out
    prompt held at once and compared in one call (padding moves only float round-off)."""
    probe = corpus_probe(tiny, tiny, n=12, max_chars=60)
    heldout = [0, 2, 3, 5, 7]
    site = "blocks.1.attn.hook_z"

    def ablate(act, src):
        out = act.clone()
        out[:, 1:, 0] = 0.0
        return out

    writers = [(site, lambda act, src: act), (site, ablate)]
    streamed = validate(tiny, tiny, probe.tokens_b, heldout, None, 1, writers, [site], 2)
    assert streamed[0]["kl"] == pytest.approx(0.0, abs=1e-12) and streamed[0]["top1"] == 1.0
    ids, mask = _pad([probe.tokens_b[i] for i in heldout], tiny)
    keep = mask.bool().clone()
    keep[:, :1] = False
    with torch.no_grad():
        ref = tiny.forward(ids, mask)[keep].double()
        with hooked(tiny, writes={site: lambda act: ablate(act, None)}):
            out = tiny.forward(ids, mask)[keep].double()
    assert streamed[1]["kl"] > 1e-4
    assert streamed[1]["kl"] == pytest.approx(kl_from_logits(ref.numpy(), out.numpy()), rel=1e-4)
    top1 = float((out.argmax(-1) == ref.argmax(-1)).double().mean())
    assert streamed[1]["top1"] == pytest.approx(top1, abs=1.5 / len(ref))


@pytest.fixture(scope="module")
def smol():
    return load_model("tiny-smol", seed=1)  # SmolLM2's tokenizer: IOI names are one token


def test_outputs_at_positions_are_the_full_outputs_there(smol):
    probe = task_probe(smol, smol, "ioi", n=12)
    toks = probe.tokens_b[:5]
    positions = probe.task_b.metric_position_index(list(range(5))).tolist()
    with torch.no_grad():
        full, mask = forward(smol, toks)
        at, mask_at = forward(smol, toks, positions=positions)
    assert at.shape == (5, len(positions[0]), full.shape[-1])
    want = probe.task_b.gather_logits(full, list(range(5)))
    torch.testing.assert_close(at[:, 0], want, rtol=1e-5, atol=1e-5)
    assert torch.equal(mask, mask_at)


def test_task_validation_scores_the_metric_positions_of_the_full_logits(smol):
    """KL, top-1 and metric ratio of a patch on a task probe, each prompt's logits computed
    only at its metric positions, equal those read off the full logits."""
    probe = task_probe(smol, smol, "ioi", n=12)
    task, heldout, site = probe.task_b, [1, 4, 6, 9, 10], "blocks.1.attn.hook_z"

    def ablate(act, src):
        out = act.clone()
        out[:, 1:, 0] = 0.0
        return out

    (got,) = validate(smol, smol, probe.tokens_b, heldout, task, 1, [(site, ablate)], [], 2)
    ids, mask = _pad([probe.tokens_b[i] for i in heldout], smol)
    with torch.no_grad():
        ref = task.gather_logits(smol.forward(ids, mask), heldout)
        with hooked(smol, writes={site: lambda act: ablate(act, None)}):
            out = task.gather_logits(smol.forward(ids, mask), heldout)
    assert got["kl"] > 1e-4
    assert got["kl"] == pytest.approx(kl_from_logits(ref.numpy(), out.numpy()), rel=1e-4)
    assert got["top1"] == float((out.argmax(-1) == ref.argmax(-1)).double().mean())
    ratio = float(task.metric(out, heldout).mean() / task.metric(ref, heldout).mean())
    assert got["metric_ratio"] == pytest.approx(ratio, rel=1e-4)


def test_row_blocks_in_parallel_lanes_give_the_same_kl(rng, monkeypatch):
    from structlens.equivalence import congruity

    ref = (3 * rng.normal(size=(5 * ROW_BLOCK + 3, 300))).astype(np.float32)
    patched = (ref + rng.normal(size=ref.shape)).astype(np.float32)
    monkeypatch.setattr(congruity, "lane_budget", lambda: 1)
    one = LogitReference(ref).kl(patched)
    monkeypatch.setattr(congruity, "lane_budget", lambda: 3)
    np.testing.assert_array_equal(LogitReference(ref).kl(patched), one)
