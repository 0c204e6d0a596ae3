import itertools

import pytest
import torch

from structlens.data.tasks import (
    GreaterThanTask,
    available_tasks,
    evaluate_task,
    make_task,
    pad_batch,
    wilson_interval,
)


def tok_text(tok, ids):
    return tok.convert_ids_to_tokens(ids)


@pytest.fixture(scope="module")
def ioi(word_tok):
    return make_task("ioi", word_tok, n=24, seed=3)


def test_registry_and_unknown_names(word_tok):
    assert available_tasks() == ["ioi", "greater_than", "knowledge_conflict", "factual_recall"]
    with pytest.raises(ValueError, match="Did you mean 'ioi'"):
        make_task("iio", word_tok)
    with pytest.raises(ValueError, match="Invalid options"):
        make_task("ioi", word_tok, colour="red")
    with pytest.raises(ValueError, match="n must be"):
        make_task("ioi", word_tok, n=0)


def test_ioi_structure(ioi, word_tok):
    assert len(ioi) == 24 and len(set(ioi.prompt_ids)) == 24
    for i, ids in enumerate(ioi.clean):
        pos = {k: v[i] for k, v in ioi.positions.items()}
        io, s = ioi.answers["IO"][i], ioi.answers["S"][i]
        assert io != s
        assert ids[pos["IO"]] == io and ids[pos["S"]] == s and ids[pos["S2"]] == s
        assert pos["IO+1"] == pos["IO"] + 1 and pos["S+1"] == pos["S"] + 1
        assert pos["END"] == len(ids) - 1 and tok_text(word_tok, [ids[-1]]) == ["to"]
        assert pos["S2"] > max(pos["IO"], pos["S"])
        assert (pos["IO"] < pos["S"]) == (ioi.order[i] == "ABBA") == (i % 2 == 0)
        assert ids == word_tok(ioi.texts[i], add_special_tokens=False)["input_ids"]


def test_ioi_corruptions_keep_length_and_change_only_names(ioi, word_tok):
    name_ids = {word_tok.convert_tokens_to_ids(n) for n in ioi.metadata["names"]}
    for i, ids in enumerate(ioi.clean):
        pos = {k: v[i] for k, v in ioi.positions.items()}
        io, s = ioi.answers["IO"][i], ioi.answers["S"][i]
        for cname, seqs in ioi.corrupted.items():
            c = seqs[i]
            assert len(c) == len(ids)
            assert (
                c == word_tok(ioi.corrupted_texts[cname][i], add_special_tokens=False)["input_ids"]
            )
            diff = {j for j in range(len(ids)) if c[j] != ids[j]}
            if cname == "position_swap":
                assert diff == {pos["IO"], pos["S"]}
                assert c[pos["IO"]] == s and c[pos["S"]] == io
            elif cname == "s_name_swap":
                assert diff == {pos["S2"]}
                assert c[pos["S2"]] in name_ids - {io, s}
            else:
                slots = {pos["IO"], pos["S"], pos["S2"]}
                assert diff == slots
                new = [c[j] for j in slots]
                assert len(set(new)) == 3 and not set(new) & {io, s} and set(new) <= name_ids


def test_ioi_determinism_and_fingerprint(word_tok, ioi):
    again = make_task("ioi", word_tok, n=24, seed=3)
    assert again == ioi and again.fingerprint() == ioi.fingerprint()
    other = make_task("ioi", word_tok, n=24, seed=4)
    assert other.texts != ioi.texts and other.fingerprint() != ioi.fingerprint()
    # Prompt i does not depend on how many prompts follow it.
    assert make_task("ioi", word_tok, n=5, seed=3).texts == ioi.texts[:5]


def test_ioi_too_few_single_token_names(word_tok):
    with pytest.raises(ValueError, match="Only 3 of 4 names"):
        make_task("ioi", word_tok, names=["Mary", "John", "Paul", "Zorblax"])
    with pytest.raises(ValueError, match="places"):
        make_task("ioi", word_tok, places=["Zorblaxia"])


def test_ioi_prepend_bos_shifts_positions(word_tok, ioi):
    b = make_task("ioi", word_tok, n=24, seed=3, prepend_bos=True)
    assert all(ids[0] == word_tok.bos_token_id for ids in b.clean)
    assert all(c[0] == word_tok.bos_token_id for c in b.corrupted["abc"])
    for k in ioi.positions:
        assert b.positions[k] == [p + 1 for p in ioi.positions[k]]


def test_ioi_metric_is_logit_difference_with_right_gradient(ioi):
    g = torch.Generator().manual_seed(0)
    vocab = 1 + max(max(ids) for ids in ioi.clean)
    logits = torch.randn(len(ioi), vocab, generator=g, requires_grad=True)
    m = ioi.metric(logits)
    raw = logits.detach()
    expect = [
        float(raw[i, ioi.answers["IO"][i]] - raw[i, ioi.answers["S"][i]]) for i in range(len(ioi))
    ]
    assert m.tolist() == pytest.approx(expect)
    m.sum().backward()
    grad = torch.zeros(len(ioi), vocab)
    for i in range(len(ioi)):
        grad[i, ioi.answers["IO"][i]] += 1
        grad[i, ioi.answers["S"][i]] -= 1
    assert torch.equal(logits.grad, grad)
    assert ioi.correct(logits.detach()).tolist() == [e > 0 for e in expect]
    # A batch: rows are prompts 5, 2, 7.
    assert ioi.metric(logits[[5, 2, 7]].detach(), [5, 2, 7]).tolist() == pytest.approx(
        [expect[5], expect[2], expect[7]]
    )
    with pytest.raises(ValueError, match="rows"):
        ioi.metric(logits.detach()[:3])
    with pytest.raises(ValueError, match="shape"):
        ioi.metric(logits.detach()[:, None, None, :])


def test_gather_logits_and_padding(ioi):
    index = [3, 0, 9]
    ids, mask = pad_batch([ioi.clean[i] for i in index], pad_id=1)
    lengths = [len(ioi.clean[i]) for i in index]
    assert ids.shape == (3, max(lengths))
    assert mask.sum(1).tolist() == lengths
    for r, i in enumerate(index):
        assert ids[r, : lengths[r]].tolist() == ioi.clean[i]
        assert (ids[r, lengths[r] :] == 1).all()
    vocab = 1000
    full = torch.randn(3, ids.shape[1], vocab)
    sel = ioi.gather_logits(full, index)
    for r in range(3):
        assert torch.equal(sel[r], full[r, lengths[r] - 1])


def test_subset_keeps_everything_aligned(ioi):
    sub = ioi.subset([4, 1])
    assert sub.prompt_ids == [ioi.prompt_ids[4], ioi.prompt_ids[1]]
    assert sub.clean == [ioi.clean[4], ioi.clean[1]]
    assert sub.corrupted["abc"] == [ioi.corrupted["abc"][4], ioi.corrupted["abc"][1]]
    assert sub.positions["S2"] == [ioi.positions["S2"][4], ioi.positions["S2"][1]]
    assert sub.order == [ioi.order[4], ioi.order[1]]
    logits = torch.randn(len(ioi), 600)
    assert torch.equal(sub.metric(logits[[4, 1]]), ioi.metric(logits)[[4, 1]])
    with pytest.raises(ValueError):
        ioi.subset([])


def test_dataset_validation_rejects_length_changing_corruptions(ioi):
    import dataclasses

    bad = {"abc": [ids + [1] for ids in ioi.clean]}
    with pytest.raises(ValueError, match="keep the clean length"):
        dataclasses.replace(ioi, corrupted=bad, corrupted_texts={"abc": ioi.texts})


def brute_force_pd_digits(p1, p2, p_other, yy):
    """P(year > YY) - P(year <= YY) by enumerating all two-digit endings.

    p1: tens-digit probabilities; p2: units given the tie digit; p_other: units given any other
    tens digit (irrelevant to the answer, which is the point)."""
    total = 0.0
    for d, e in itertools.product(range(10), range(10)):
        pe = p2[e] if d == yy // 10 else p_other[e]
        total += p1[d] * pe * (1 if 10 * d + e > yy else -1)
    return total


def test_greater_than_digits_mode(word_tok):
    task = make_task("greater_than", word_tok, n=30, seed=1)
    assert isinstance(task, GreaterThanTask)
    assert task.mode == "digits" and task.metric_positions == ("TENS", "END")
    digit = [word_tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert task.year_token_ids == tuple(digit)
    for i, ids in enumerate(task.clean):
        yy, xx = task.start_year[i] % 100, task.start_year[i] // 100
        assert 2 <= yy <= 98 and 11 <= xx <= 17
        pos = {k: v[i] for k, v in task.positions.items()}
        assert ids[pos["START_TENS"]] == digit[yy // 10]
        assert ids[pos["START_UNITS"]] == digit[yy % 10]
        assert ids[pos["TENS"]] == digit[xx % 10] and pos["TENS"] == pos["END"] - 1
        assert ids[pos["END"]] == digit[yy // 10]  # the tie digit ends the prompt
        c = task.corrupted["01"][i]
        assert len(c) == len(ids)
        diff = {j for j in range(len(ids)) if c[j] != ids[j]}
        assert diff <= {pos["START_TENS"], pos["START_UNITS"]}
        assert c[pos["START_TENS"]] == digit[0] and c[pos["START_UNITS"]] == digit[1]
        assert task.texts[i].endswith(f"to the year {xx}{yy // 10}")


def test_greater_than_digits_metric_matches_enumeration(word_tok):
    task = make_task("greater_than", word_tok, n=12, seed=2)
    g = torch.Generator().manual_seed(1)
    vocab = len(word_tok)
    digit = list(task.year_token_ids)
    logits = torch.full((len(task), 2, vocab), -1e4)
    p1s, p2s = [], []
    for i in range(len(task)):
        p1 = torch.rand(10, generator=g) + 0.01
        p2 = torch.rand(10, generator=g) + 0.01
        p1, p2 = p1 / p1.sum(), p2 / p2.sum()
        logits[i, 0, digit] = p1.log()
        logits[i, 1, digit] = p2.log()
        p1s.append(p1.tolist())
        p2s.append(p2.tolist())
    logits.requires_grad_(True)
    pd = task.metric(logits)
    for i in range(len(task)):
        yy = task.start_year[i] % 100
        expect = brute_force_pd_digits(p1s[i], p2s[i], [0.1] * 10, yy)
        assert pd[i].item() == pytest.approx(expect, abs=1e-5)
    pd.sum().backward()
    assert torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    # Mass outside the digits counts on neither side: halving digit mass halves each term.
    half = logits.detach().clone()
    half[:, 0, digit] += torch.log(torch.tensor(0.5))
    half[:, 0, 0] = torch.log(torch.tensor(0.5))  # the other half on a non-digit token
    expect = [
        0.5 * brute_force_pd_digits(p1s[i], p2s[i], [0.1] * 10, task.start_year[i] % 100)
        for i in range(len(task))
    ]
    assert task.metric(half).tolist() == pytest.approx(expect, abs=1e-5)
    assert task.correct(logits.detach()).tolist() == [v > 0 for v in pd.tolist()]


def test_greater_than_two_digit_mode(pair_tok, word_tok):
    task = make_task("greater_than", pair_tok, n=15, seed=0)
    assert task.mode == "two_digit" and task.metric_positions == ("END",)
    pairs = [pair_tok.convert_tokens_to_ids(f"{y:02d}") for y in range(100)]
    assert task.year_token_ids == tuple(pairs)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(len(task), len(pair_tok), generator=g)
    pd = task.metric(logits)
    for i, ids in enumerate(task.clean):
        yy = task.start_year[i] % 100
        assert ids[task.positions["START_YY"][i]] == pairs[yy]
        assert task.corrupted["01"][i][task.positions["START_YY"][i]] == pairs[1]
        assert pair_tok.convert_ids_to_tokens(ids[-1]) == str(task.start_year[i] // 100)
        p = logits[i].softmax(-1)
        expect = sum(float(p[pairs[y]]) * (1 if y > yy else -1) for y in range(100))
        assert pd[i].item() == pytest.approx(expect, abs=1e-6)
    with pytest.raises(ValueError, match="two_digit"):
        make_task("greater_than", word_tok, mode="two_digit")


def test_knowledge_conflict_structure_and_metric(word_tok):
    task = make_task("knowledge_conflict", word_tok, n=40, seed=0)
    assert set(task.corrupted) == {"other_answer", "true_answer"}
    for i, ids in enumerate(task.clean):
        a = {k: v[i] for k, v in task.answers.items()}
        assert len({a["context"], a["parametric"], a["other"]}) == 3
        ca = task.positions["CONTEXT_ANSWER"][i]
        assert ids[ca] == a["context"]
        assert task.corrupted["other_answer"][i][ca] == a["other"]
        assert task.corrupted["true_answer"][i][ca] == a["parametric"]
        for cname in task.corrupted:
            c = task.corrupted[cname][i]
            assert len(c) == len(ids) and [j for j in range(len(ids)) if c[j] != ids[j]] == [ca]
        subj = word_tok.convert_ids_to_tokens(ids[task.positions["SUBJECT_LAST"][i]])
        assert task.subject[i].endswith(subj)
        assert task.texts[i].endswith(task.parametric_texts[i])
        assert ids[-len(task.parametric[i]) :] == task.parametric[i]
    logits = torch.randn(len(task), len(word_tok))
    m = task.metric(logits)
    for i in range(len(task)):
        expect = logits[i, task.answers["context"][i]] - logits[i, task.answers["parametric"][i]]
        assert m[i].item() == pytest.approx(expect.item())
    logits[0, task.answers["context"][0]] = 100
    logits[1, task.answers["parametric"][1]] = 100
    logits[2, task.answers["other"][2]] = 100
    assert task.outcome(logits[:3], [0, 1, 2]) == ["context", "parametric", "other"]
    assert task == make_task("knowledge_conflict", word_tok, n=40, seed=0)


def test_factual_recall(word_tok):
    task = make_task("factual_recall", word_tok, seed=0)
    n_all = len(task)
    assert n_all >= 60
    assert len(set(task.texts)) == n_all  # one prompt per fact
    for i, ids in enumerate(task.clean):
        c = task.corrupted["subject_swap"][i]
        assert len(c) == len(ids) and c != ids
        assert task.answers["answer"][i] != task.answers["alt"][i]
    with pytest.raises(ValueError, match="usable facts"):
        make_task("factual_recall", word_tok, n=n_all + 1)
    assert make_task("factual_recall", word_tok, n=10, seed=0).texts == task.texts[:10]


def fake_model(vocab, seed=0):
    """A deterministic causal 'model': logits at t depend on tokens 0..t only."""
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(vocab, vocab, generator=g)

    def logits_fn(ids, mask):
        x = emb[ids] * mask[..., None]
        return x.cumsum(dim=1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]

    return logits_fn


def test_evaluate_task_is_padding_invariant_and_consistent(word_tok):
    for name in ("ioi", "greater_than", "knowledge_conflict"):
        task = make_task(name, word_tok, n=13, seed=5)
        fn = fake_model(len(word_tok))
        r = evaluate_task(task, fn, batch_size=7)
        one = evaluate_task(task, fn, batch_size=1)
        assert r["metric"] == pytest.approx(one["metric"], abs=1e-5)
        assert r["correct"] == one["correct"]
        assert r["accuracy"] == sum(r["correct"]) / 13
        lo, hi = r["metric_ci"]
        assert lo < r["metric_mean"] < hi
        assert r["metric_mean"] == pytest.approx(sum(r["metric"]) / 13)
        # Independent computation for prompt 0: a forward pass without padding.
        ids = torch.tensor([task.clean[0]])
        full = fn(ids, torch.ones_like(ids))
        direct = task.metric(task.gather_logits(full, [0]), [0])
        assert r["metric"][0] == pytest.approx(direct.item(), abs=1e-5)
        corrupt = evaluate_task(task, fn, batch_size=7, corruption=next(iter(task.corrupted)))
        assert corrupt["corruption"] == next(iter(task.corrupted))
    with pytest.raises(ValueError, match="no corruption"):
        evaluate_task(task, fn, corruption="nope")


def test_wilson_interval_known_values():
    lo, hi = wilson_interval(5, 10)
    assert (lo, hi) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)
