"""The sanity check's two copies: rotated + head-permuted, and head-permuted with the basis
kept.  Both compute the model's function (known answer: equivalent); they differ by the
rotation only, so an estimator whose statistics move between them depends on the basis.
Variance-weighted R² must not move; the reference's uniform R² may, and does on the tiny
model's clean-run encoding of the copy."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from structlens.equivalence import stages as es
from structlens.equivalence.protocol import PROFILES
from structlens.equivalence.scenarios import basis_change, rotate_and_permute
from structlens.interventions import run_with_cache
from structlens.models import load_model

PROTOCOL = PROFILES["smoke"]


@pytest.fixture(scope="module")
def tiny() -> object:
    return load_model("tiny-llama-deep")


@pytest.fixture(scope="module")
def recorded(tiny) -> tuple[es.SanityCheck, list[tuple]]:
    """The sanity stage at the smoke protocol, and every ``measure`` call it made:
    ``(protocol, model B's name, the records)``."""
    seen: list[tuple] = []

    def recorder(protocol, a, b, probe):
        seen.append((protocol, b.name, es.measure(protocol, a, b, probe)))
        return seen[-1][2]

    return es.sanity(PROTOCOL, tiny, measure=recorder), seen


@pytest.fixture(scope="module")
def check(recorded) -> es.SanityCheck:
    return recorded[0]


def test_unrotated_copy_keeps_the_basis_and_permutes_the_same_heads(tiny) -> None:
    plain, plain_map, eye = rotate_and_permute(tiny, seed=3, rotate=False)
    rot, rot_map, r = rotate_and_permute(tiny, seed=3)
    assert (basis_change(plain.name), basis_change(rot.name)) == ("basis kept", "rotated")
    assert plain_map == rot_map  # the same permutation: the copies differ by R only
    assert any(m != list(range(tiny.n_heads)) for m in plain_map)
    assert torch.equal(eye, torch.eye(tiny.d_model, dtype=eye.dtype))
    assert not torch.allclose(r, torch.eye(tiny.d_model, dtype=r.dtype))
    assert plain.name.endswith("+perm3") and plain.fingerprint() != tiny.fingerprint()
    ids, mask = tiny.tokenize(["Emma was handsome, clever, and rich.", "It is a truth"])
    sites = ["blocks.1.attn.hook_z", "blocks.2.hook_resid_post"]
    la, ca = run_with_cache(tiny, ids, mask, sites)
    lb, cb = run_with_cache(plain, ids, mask, sites)
    assert torch.allclose(la, lb, atol=1e-4)
    for h in range(tiny.n_heads):
        assert torch.allclose(ca[sites[0]][:, :, h], cb[sites[0]][:, :, plain_map[1][h]], atol=1e-5)
    assert torch.allclose(ca[sites[1]], cb[sites[1]], atol=1e-4)  # the residual basis is kept


def test_sanity_reports_congruity_of_both_copies_under_both_r2(check) -> None:
    rotated, plain = check.comparison.congruity, check.unrotated
    assert rotated is not None and plain is not None
    assert check.unrotated_max_abs_logit_diff is not None
    assert check.unrotated_max_abs_logit_diff < 1e-3  # the same function
    for c in (rotated, plain):
        assert [e.multioutput for e in c.estimates] == ["uniform_average", "variance_weighted"]
        assert c.uniform.decision == c.decision  # the decision is the uniform estimate's
        # the point test has no null: an exact copy must not be called different
        assert c.variance_weighted is not None
        assert c.variance_weighted.decision == "unidentified"
    # variance-weighted R² does not see the rotation: the clean-run encodings agree between
    # the copies up to the models' float32 round-off, in both directions...
    w_rot, w_plain = rotated.variance_weighted, plain.variance_weighted
    assert w_rot is not None and w_plain is not None
    for key in ("base_r2_ab", "base_r2_ba"):
        assert getattr(w_rot, key) == pytest.approx(getattr(w_plain, key), abs=1e-4)
    # ...uniform R² of A's run encoding the copy's (whose basis differs) moves by far more,
    # while encoding A's own run from either copy (the target's basis is A's) does not
    assert abs(rotated.base_r2_ab - plain.base_r2_ab) > 0.1
    assert rotated.base_r2_ba == pytest.approx(plain.base_r2_ba, abs=1e-4)


def test_unrotated_copy_runs_only_congruity_through_measure(recorded, tiny) -> None:
    """The unrotated copy goes through the driver's ``measure`` (so caches keep it) under a
    protocol without patching whose CONGRUITY settings are the protocol's."""
    _, seen = recorded
    (p_rot, rot, raw), (p_plain, plain, _) = seen
    # the sanity stage runs its copies as copies (Procrustes layer maps)
    copy = PROTOCOL.replace(relation="copy")
    assert p_rot == copy and rot.endswith("+rot3") and plain.endswith("+perm3")
    assert p_plain == es.congruity_only(copy)
    assert not p_plain.validate and p_plain.null == "none"
    assert not p_plain.validate_head_groups and not p_plain.validate_layers
    congruity_fields = ("congruity", "congruity_top_k", "congruity_max_layers", "point_n",
                        "straps", "seed", "batch_size", "probe", "probe_prompts")  # fmt: skip
    assert all(getattr(p_plain, f) == getattr(PROTOCOL, f) for f in congruity_fields)
    # without CONGRUITY there is nothing basis-dependent to run on the unrotated copy
    calls: list[str] = []

    def replay(protocol, a, b, probe):
        calls.append(b.name)
        return raw

    off = es.sanity(PROTOCOL.replace(congruity=False), tiny, measure=replay)
    assert len(calls) == 1 and off.unrotated is None and off.unrotated_max_abs_logit_diff is None


def test_a_comparison_recorded_before_the_weighted_estimate_still_summarizes(recorded) -> None:
    """Drivers cache the model runs; a record without the variance-weighted statistics (an
    older cache) gives the uniform scores and decision alone, with the clean-run R² NaN."""
    _, seen = recorded
    protocol, _, raw = seen[1]
    new = es.summarize(protocol, raw).congruity
    legacy = {k: v for k, v in raw.congruity.items() if not k.startswith(("base_r2", "variance"))}
    old = es.summarize(protocol, dataclasses.replace(raw, congruity=legacy)).congruity
    assert new is not None and old is not None and new.variance_weighted is not None
    assert old.variance_weighted is None and old.estimates == (old.uniform,)
    assert math.isnan(old.base_r2_ab) and math.isnan(old.base_r2_ba)
    assert old.decision == new.decision and old.decision_rate_ba == new.decision_rate_ba
