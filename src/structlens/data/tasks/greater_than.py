"""Greater-than, after Hanna et al. (2023), adapted to tokenizers that split numbers into digits.

The original task: "The war lasted from the year 1732 to the year 17" → GPT-2 should put its
probability on two-digit year tokens YY > 32.  Its metric is the probability difference
``PD = Σ_{y > YY} p(y) − Σ_{y ≤ YY} p(y)`` over the 100 two-digit tokens, and its corruption
replaces the start year by ``XX01`` (the "01-dataset"), after which every year is larger.

Two tokenizer modes, chosen automatically:

``two_digit`` (GPT-2 style: "1732" → "17", "32")
    Exactly the original: the prompt ends after the century ("... to the year 17"), one
    metric position (END), PD over the 100 tokens "00"…"99".

``digits`` (SmolLM2, Llama-3 and most recent tokenizers: "1732" → "1", "7", "3", "2")
    The end year is predicted one digit at a time, so "larger than 1732" depends on two
    predictions.  With ``t`` and ``u`` the tens and units digits of the start year, the
    clean prompt ends with the end year's century *and the tie digit* ``t``:
    "... from the year 1732 to the year 173".  By causality one forward pass gives

    - at position ``TENS`` (the last century digit, "7"): ``p₁(d)``, the tens digit of the
      end year, unaffected by the appended "3";
    - at ``END`` (the appended tie digit, "3"): ``p₂(e) = p(units = e | tens = t)``.

    The metric is the same probability difference, over the two-digit continuations:

    ``PD = Σ_{d>t} p₁(d) − Σ_{d<t} p₁(d) + p₁(t) · (Σ_{e>u} p₂(e) − Σ_{e≤u} p₂(e))``

    which equals ``P(year > start) − P(year ≤ start)`` under the model's own two-step
    distribution; probabilities are softmaxes over the full vocabulary, so mass on
    non-digit tokens counts on neither side (as in the original).  ``metric_positions`` is
    ``("TENS", "END")`` and the metric takes logits of shape ``[n, 2, vocab]``.

In both modes a prompt is *correct* when ``PD > 0`` (more mass on larger years than on
smaller-or-equal ones), start years ``YY`` are drawn from 02…98 and centuries from 11…17 as in
the paper, and the only corruption is ``"01"`` (same token length as the clean prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import numpy as np
import torch

from structlens.data.tasks.base import Encoder, TaskDataset

NOUNS: tuple[str, ...] = (
    "war", "conflict", "drought", "famine", "expedition", "reign", "truce", "occupation",
    "siege", "dynasty", "plague", "rebellion", "embargo", "campaign", "alliance", "dispute",
    "crisis", "revolution", "epidemic", "strike", "voyage", "treaty", "trial", "construction",
    "excavation", "survey", "negotiation", "festival", "blockade", "migration", "exile",
    "feud", "mission", "journey", "partnership", "tournament", "boycott", "pilgrimage",
    "investigation", "restoration",
)  # fmt: skip
CENTURIES: tuple[int, ...] = (11, 12, 13, 14, 15, 16, 17)
TEMPLATE = "The {noun} lasted from the year {start} to the year {end}"
MODES = ("auto", "digits", "two_digit")


@dataclass(frozen=True, kw_only=True)
class GreaterThanTask(TaskDataset):
    """Greater-than prompts; see the module docstring for both tokenizer modes.

    Attributes (beyond :class:`TaskDataset`)
    ----------------------------------------
    mode : str
        ``"digits"`` or ``"two_digit"``.
    year_token_ids : tuple of int
        Token ids of "0"…"9" (digits mode) or "00"…"99" (two-digit mode), in numeric order.
    start_year : list of int
        The clean start year of each prompt (e.g. 1732); the threshold ``YY`` is its last two
        digits.

    Positions: ``END``; ``START_YY`` (two-digit mode) or ``START_TENS``/``START_UNITS`` and
    ``TENS`` (digits mode), all pointing at single year/digit tokens.
    """

    mode: str
    year_token_ids: tuple[int, ...]
    start_year: list[int]

    per_prompt_fields: ClassVar[tuple[str, ...]] = (*TaskDataset.per_prompt_fields, "start_year")
    metric_description: ClassVar[str] = (
        "probability difference P(end year > start year) - P(end year <= start year)"
    )

    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """Probability difference PD in [-1, 1] per prompt (see the module docstring)."""
        idx = self._check_logits(end_logits, index)
        yy = torch.tensor(self.start_year, dtype=torch.long)[idx].to(end_logits.device) % 100
        ids = torch.tensor(self.year_token_ids, dtype=torch.long, device=end_logits.device)
        probs = end_logits.float().softmax(dim=-1)[..., ids]
        if self.mode == "two_digit":
            values = torch.arange(100, device=end_logits.device)
            greater = (values[None, :] > yy[:, None]).to(probs.dtype)
            return (probs * (2 * greater - 1)).sum(-1)
        digits = torch.arange(10, device=end_logits.device)[None, :]
        tens, units = (yy // 10)[:, None], (yy % 10)[:, None]
        p1, p2 = probs[:, 0], probs[:, 1]
        sign1 = (digits > tens).to(probs.dtype) - (digits < tens).to(probs.dtype)
        sign2 = 2 * (digits > units).to(probs.dtype) - 1
        tie = (p1 * (digits == tens).to(probs.dtype)).sum(-1)
        return (p1 * sign1).sum(-1) + tie * (p2 * sign2).sum(-1)


def make_greater_than(
    tokenizer: Any,
    *,
    n: int = 100,
    seed: int = 0,
    prepend_bos: bool | None = None,
    mode: str = "auto",
    nouns: Sequence[str] = NOUNS,
    centuries: Sequence[int] = CENTURIES,
) -> GreaterThanTask:
    """Generate ``n`` greater-than prompts.

    Parameters
    ----------
    tokenizer : fast Hugging Face tokenizer
    n : int
        Number of prompts (at least 1).
    seed : int
        Seed for nouns, centuries and start years.
    prepend_bos : bool or None
        Special tokens before every prompt: None (default) those the tokenizer adds itself
        (Gemma's ``<bos>``, nothing for SmolLM2), True ``bos_token_id``, False none; all
        positions shift by their count (see :class:`~structlens.data.tasks.base.Encoder`).
    mode : {"auto", "digits", "two_digit"}
        ``"auto"`` picks ``two_digit`` when "00"…"99" are single tokens and years split as
        century + two digits, else ``digits`` when "0"…"9" are single tokens.
    nouns : sequence of str
        Event nouns for "The {noun} lasted ...".
    centuries : sequence of int
        Century prefixes XX (10…99).

    Raises
    ------
    ValueError
        If the tokenizer supports neither mode, the requested mode does not fit it, or no
        start year tokenizes as expected.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
    if not nouns or not centuries or any(not 10 <= c <= 99 for c in centuries):
        raise ValueError("Need at least one noun and centuries in 10..99.")
    enc = Encoder(tokenizer, prepend_bos)
    digit_ids = [enc.single_token(str(d)) for d in range(10)]
    pair_ids = [enc.single_token(f"{y:02d}") for y in range(100)]
    valid_pairs = {c: _two_digit_years(enc, c, pair_ids) for c in centuries}
    two_digit_ok = len(set(pair_ids)) == 100 and None not in pair_ids
    two_digit_ok = two_digit_ok and any(valid_pairs[c] for c in centuries)
    digits_ok = None not in digit_ids and len(set(digit_ids)) == 10
    if mode == "auto":
        mode = "two_digit" if two_digit_ok else "digits"
    if mode == "two_digit" and not two_digit_ok:
        raise ValueError(
            "mode='two_digit' needs the tokens '00'..'99' and years that split as century + "
            "two digits (GPT-2 style); this tokenizer does not. Use mode='digits'."
        )
    if mode == "digits" and not digits_ok:
        raise ValueError(
            "This tokenizer has neither single-token digits '0'..'9' nor two-digit year "
            "tokens, so greater-than cannot be posed on it."
        )

    rng = np.random.default_rng(seed)
    cents = [c for c in centuries if mode == "digits" or valid_pairs[c]]
    corrupted: list[list[int]] = []
    corrupted_texts: list[str] = []
    positions: dict[str, list[int]] = {
        p: []
        for p in (
            ("START_YY", "END")
            if mode == "two_digit"
            else ("START_TENS", "START_UNITS", "TENS", "END")
        )
    }
    ids_all, texts, start_years = [], [], []
    for _ in range(n):
        noun = nouns[int(rng.integers(len(nouns)))]
        xx = cents[int(rng.integers(len(cents)))]
        choices = list(range(2, 99)) if mode == "digits" else valid_pairs[xx]
        yy = choices[int(rng.integers(len(choices)))]
        end = f"{xx}" if mode == "two_digit" else f"{xx}{yy // 10}"
        text = TEMPLATE.format(noun=noun, start=f"{xx}{yy:02d}", end=end)
        ctext = TEMPLATE.format(noun=noun, start=f"{xx}01", end=end)
        ids, offsets = enc.encode(text)
        cids, coffsets = enc.encode(ctext)
        if len(cids) != len(ids):
            raise ValueError(f"The '01' corruption of {text!r} changes its token length.")
        s = text.index(" to the year ") - 2  # first character of the start year's YY
        e = len(text) - len(end)  # first character of the end year
        if mode == "two_digit":
            p = enc.token_at(offsets, s, s + 2, what="start year YY")
            _expect(ids, p, pair_ids[yy], text)
            _expect(
                cids, enc.token_at(coffsets, s, s + 2, what="start year YY"), pair_ids[1], ctext
            )
            positions["START_YY"].append(p)
        else:
            spans = {"START_TENS": s, "START_UNITS": s + 1, "TENS": e + 1, "END": e + 2}
            digit_at = {"START_TENS": yy // 10, "START_UNITS": yy % 10, "TENS": xx % 10}
            digit_at["END"] = yy // 10
            for pname, c in spans.items():
                p = enc.token_at(offsets, c, c + 1, what=f"digit {pname}")
                _expect(ids, p, digit_ids[digit_at[pname]], text)
                positions[pname].append(p)
            _expect(cids, positions["START_UNITS"][-1], digit_ids[1], ctext)
        if mode == "two_digit":
            positions["END"].append(len(ids) - 1)
        elif positions["END"][-1] != len(ids) - 1:
            raise ValueError(f"The tie digit is not the last token of {text!r}.")
        ids_all.append(ids)
        texts.append(text)
        start_years.append(xx * 100 + yy)
        corrupted.append(cids)
        corrupted_texts.append(ctext)

    return GreaterThanTask(
        name="greater_than",
        prompt_ids=[f"greater_than-{i:04d}" for i in range(n)],
        texts=texts,
        clean=ids_all,
        corrupted={"01": corrupted},
        corrupted_texts={"01": corrupted_texts},
        positions=positions,
        answers={},
        metric_positions=("END",) if mode == "two_digit" else ("TENS", "END"),
        mode=mode,
        # the *_ok checks above ensured that every id exists
        year_token_ids=tuple(
            int(cast(int, t)) for t in (pair_ids if mode == "two_digit" else digit_ids)
        ),
        start_year=start_years,
        metadata={
            "seed": seed,
            "n": n,
            **enc.metadata(),
            "mode": mode,
            "template": TEMPLATE,
            "nouns": list(nouns),
            "centuries": list(cents),
        },
    )


def _two_digit_years(enc: Encoder, century: int, pair_ids: list[int | None]) -> list[int]:
    """Start years YY in 02..98 whose " XXYY" tokenizes as the century token then "YY"."""
    prefix = enc.tokenizer(f" {century}", add_special_tokens=False)["input_ids"]
    valid = []
    for yy in range(2, 99):
        if pair_ids[yy] is None:
            continue
        ids = enc.tokenizer(f" {century}{yy:02d}", add_special_tokens=False)["input_ids"]
        if list(ids) == [*prefix, pair_ids[yy]]:
            valid.append(yy)
    return valid


def _expect(ids: list[int], pos: int, token: int | None, text: str) -> None:
    if ids[pos] != token:
        raise ValueError(
            f"Unexpected year tokenization in {text!r} at token {pos}; greater-than needs "
            "digits (or two-digit year pieces) as separate tokens."
        )
