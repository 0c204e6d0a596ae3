"""Indirect object identification (IOI), after Wang et al. (2023).

A prompt introduces two people and has one of them (the subject, S) give something to the
other (the indirect object, IO): "When Mary and John went to the store, John gave a drink to"
→ " Mary".  ABBA prompts mention IO first ("Mary and John ... John"), BABA prompts mention S
first ("John and Mary ... John").  Names, places and objects are restricted to words that are
a single token (with their leading space) in the given tokenizer, so every corruption keeps
the clean prompt's length and every named position points at one token.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from structlens.data.tasks.base import Encoder, TaskDataset, single_token_words

# The template family of Wang et al. (2023), written with the two first mentions {N1}, {N2}
# and the second mention of the subject {S2}; each prompt stops before the IO name.
TEMPLATES: tuple[str, ...] = (
    "When {N1} and {N2} went to the {PLACE}, {S2} gave a {OBJECT} to",
    "Then, {N1} and {N2} went to the {PLACE}. {S2} gave a {OBJECT} to",
    "Then, {N1} and {N2} had a lot of fun at the {PLACE}. {S2} gave a {OBJECT} to",
    "Then, {N1} and {N2} were working at the {PLACE}. {S2} decided to give a {OBJECT} to",
    "Then, {N1} and {N2} were thinking about going to the {PLACE}. {S2} wanted to give a "
    "{OBJECT} to",
    "Then, {N1} and {N2} had a long argument, and afterwards {S2} said to",
    "After {N1} and {N2} went to the {PLACE}, {S2} gave a {OBJECT} to",
    "When {N1} and {N2} got a {OBJECT} at the {PLACE}, {S2} decided to give it to",
    "When {N1} and {N2} got a {OBJECT} at the {PLACE}, {S2} decided to give the {OBJECT} to",
    "While {N1} and {N2} were working at the {PLACE}, {S2} gave a {OBJECT} to",
    "While {N1} and {N2} were commuting to the {PLACE}, {S2} gave a {OBJECT} to",
    "After the lunch, {N1} and {N2} went to the {PLACE}. {S2} gave a {OBJECT} to",
    "Afterwards, {N1} and {N2} went to the {PLACE}. {S2} gave a {OBJECT} to",
    "Then, {N1} and {N2} had a long argument. Afterwards {S2} said to",
    "The {PLACE} {N1} and {N2} went to had a {OBJECT}. {S2} gave it to",
    "Friends {N1} and {N2} found a {OBJECT} at the {PLACE}. {S2} gave it to",
)

NAMES: tuple[str, ...] = (
    "Michael", "Christopher", "Jessica", "Matthew", "Ashley", "Jennifer", "Joshua", "Amanda",
    "Daniel", "David", "James", "Robert", "John", "Joseph", "Andrew", "Ryan", "Brandon",
    "Jason", "Justin", "Sarah", "William", "Jonathan", "Stephanie", "Brian", "Nicole",
    "Nicholas", "Anthony", "Heather", "Eric", "Elizabeth", "Adam", "Megan", "Melissa", "Kevin",
    "Steven", "Thomas", "Timothy", "Christina", "Kyle", "Rachel", "Laura", "Lauren", "Amber",
    "Brittany", "Danielle", "Richard", "Kimberly", "Jeffrey", "Amy", "Crystal", "Michelle",
    "Tiffany", "Jeremy", "Benjamin", "Mark", "Emily", "Aaron", "Charles", "Rebecca", "Jacob",
    "Stephen", "Patrick", "Sean", "Erin", "Jamie", "Kelly", "Samantha", "Nathan", "Sara",
    "Dustin", "Paul", "Angela", "Tyler", "Scott", "Katherine", "Andrea", "Gregory", "Erica",
    "Mary", "Travis", "Lisa", "Kenneth", "Bryan", "Lindsey", "Kristen", "Jose", "Alexander",
    "Jesse", "Katie", "Lindsay", "Shannon", "Vanessa", "Courtney", "Christine", "Alicia",
    "Cody", "Allison", "Bradley", "Samuel",
)  # fmt: skip
PLACES: tuple[str, ...] = (
    "store", "garden", "restaurant", "school", "hospital", "office", "house", "station",
)  # fmt: skip
OBJECTS: tuple[str, ...] = (
    "ring", "kiss", "bone", "basketball", "computer", "necklace", "drink", "snack",
)  # fmt: skip

CORRUPTIONS: tuple[str, ...] = ("abc", "position_swap", "s_name_swap")


@dataclass(frozen=True, kw_only=True)
class IOITask(TaskDataset):
    """IOI prompts.  ``answers`` has ``"IO"`` and ``"S"`` (token ids of " IO", " S").

    Positions: ``IO`` and ``S`` (first mentions), ``IO+1``, ``S+1`` (the tokens after them),
    ``S2`` (second mention of the subject) and ``END`` (the last token, " to" or " said to").

    Corruptions (same length as the clean prompt):

    - ``abc``: the three name slots get three new names, all distinct and different from IO
      and S ("When Alice and Bob went to the store, Carol gave a drink to");
    - ``position_swap``: IO and S swap first-mention order (ABBA ↔ BABA), S2 unchanged;
    - ``s_name_swap``: S2 becomes a third name C, so the repeated name is gone.

    ``template_index`` and ``order`` (``"ABBA"``/``"BABA"``) record each prompt's template.

    Metric: ``logit(IO) − logit(S)`` at END (logit difference, in logit units).  A prompt is
    correct when ``logit(IO) > logit(S)``.
    """

    template_index: list[int]
    order: list[str]

    per_prompt_fields: ClassVar[tuple[str, ...]] = (
        *TaskDataset.per_prompt_fields,
        "template_index",
        "order",
    )
    metric_description: ClassVar[str] = "logit(IO) - logit(S) at END"

    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        return self._logit_difference(end_logits, index, "IO", "S")


def make_ioi(
    tokenizer: Any,
    *,
    n: int = 100,
    seed: int = 0,
    prepend_bos: bool | None = None,
    names: Sequence[str] = NAMES,
    places: Sequence[str] = PLACES,
    objects: Sequence[str] = OBJECTS,
    templates: Sequence[str] = TEMPLATES,
) -> IOITask:
    """Generate ``n`` IOI prompts, alternating ABBA (even index) and BABA (odd index).

    Parameters
    ----------
    tokenizer : fast Hugging Face tokenizer
    n : int
        Number of prompts (at least 1).
    seed : int
        Seed of the template/name/place/object draws; same seed and tokenizer, same dataset.
    prepend_bos : bool or None
        Special tokens before every prompt: None (default) those the tokenizer adds itself
        (Gemma's ``<bos>``, nothing for SmolLM2), True ``bos_token_id``, False none; all
        positions shift by their count (see :class:`~structlens.data.tasks.base.Encoder`).
    names, places, objects, templates : sequences of str
        Word lists and templates (``{N1}``, ``{N2}``, ``{S2}``, ``{PLACE}``, ``{OBJECT}``).
        Only words that are one token with a leading space are used; at least 5 names and
        1 place and object must survive.

    Raises
    ------
    ValueError
        If ``n < 1``, too few words are single tokens, or the tokenizer merges a name with its
        neighbours so that a corruption would change the prompt length.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    if not templates:
        raise ValueError("Need at least one IOI template.")
    enc = Encoder(tokenizer, prepend_bos)
    # IO, S and three fresh names for the ABC corruption must all differ.
    name_pool = single_token_words(enc, names, what="names", minimum=5)
    place_pool = single_token_words(enc, places, what="places", minimum=1)
    object_pool = single_token_words(enc, objects, what="objects", minimum=1)
    rng = np.random.default_rng(seed)

    out: dict[str, Any] = {
        "ids": [],
        "texts": [],
        "clean": [],
        "corrupted": {c: [] for c in CORRUPTIONS},
        "corrupted_texts": {c: [] for c in CORRUPTIONS},
        "positions": {p: [] for p in ("IO", "IO+1", "S", "S+1", "S2", "END")},
        "answers": {"IO": [], "S": []},
        "templates": [],
        "order": [],
    }
    for i in range(n):
        t = int(rng.integers(len(templates)))
        picks = rng.choice(len(name_pool), size=5, replace=False)
        io, s, a, b, c = (name_pool[int(j)][0] for j in picks)
        place = place_pool[int(rng.integers(len(place_pool)))][0]
        obj = object_pool[int(rng.integers(len(object_pool)))][0]
        abba = i % 2 == 0
        render = functools.partial(_render, templates[t], place, obj)
        n1, n2 = (io, s) if abba else (s, io)
        text, spans = render(n1, n2, s)
        ids, offsets = enc.encode(text)
        slot_pos = {k: enc.token_at(offsets, *spans[k], what=f"name {k}") for k in spans}
        for k, name in (("N1", n1), ("N2", n2), ("S2", s)):
            if ids[slot_pos[k]] != enc.single_token(" " + name):
                raise ValueError(
                    f"In {text!r} the tokenizer merges {name!r} with a neighbour; IOI needs "
                    "each name to be its own token."
                )
        io_pos, s_pos = slot_pos["N1"], slot_pos["N2"]
        if not abba:
            io_pos, s_pos = s_pos, io_pos
        variants = {
            "abc": render(a, b, c)[0],
            "position_swap": render(n2, n1, s)[0],
            "s_name_swap": render(n1, n2, c)[0],
        }
        for cname, ctext in variants.items():
            cids = enc.ids(ctext)
            if len(cids) != len(ids):
                raise ValueError(
                    f"Corruption {cname!r} changes the token length ({len(cids)} vs {len(ids)}) "
                    f"of {text!r}; this tokenizer merges names with their neighbours."
                )
            out["corrupted"][cname].append(cids)
            out["corrupted_texts"][cname].append(ctext)
        out["ids"].append(f"ioi-{i:04d}")
        out["texts"].append(text)
        out["clean"].append(ids)
        for pname, p in (
            ("IO", io_pos),
            ("IO+1", io_pos + 1),
            ("S", s_pos),
            ("S+1", s_pos + 1),
            ("S2", slot_pos["S2"]),
            ("END", len(ids) - 1),
        ):
            out["positions"][pname].append(p)
        out["answers"]["IO"].append(enc.single_token(" " + io))
        out["answers"]["S"].append(enc.single_token(" " + s))
        out["templates"].append(t)
        out["order"].append("ABBA" if abba else "BABA")

    return IOITask(
        name="ioi",
        prompt_ids=out["ids"],
        texts=out["texts"],
        clean=out["clean"],
        corrupted=out["corrupted"],
        corrupted_texts=out["corrupted_texts"],
        positions=out["positions"],
        answers=out["answers"],
        template_index=out["templates"],
        order=out["order"],
        metadata={
            "seed": seed,
            "n": n,
            **enc.metadata(),
            "templates": list(templates),
            "names": [w for w, _ in name_pool],
            "places": [w for w, _ in place_pool],
            "objects": [w for w, _ in object_pool],
        },
    )


def _render(
    template: str, place: str, obj: str, n1: str, n2: str, s2: str
) -> tuple[str, dict[str, tuple[int, int]]]:
    return _fill(template, {"N1": n1, "N2": n2, "S2": s2, "PLACE": place, "OBJECT": obj})


def _fill(template: str, values: dict[str, str]) -> tuple[str, dict[str, tuple[int, int]]]:
    """Substitute ``{KEY}`` slots left to right; return the text and the character span of
    each name slot (``N1``, ``N2``, ``S2``)."""
    text = ""
    spans: dict[str, tuple[int, int]] = {}
    rest = template
    while "{" in rest:
        before, _, tail = rest.partition("{")
        key, _, rest = tail.partition("}")
        text += before
        if key in ("N1", "N2", "S2"):
            spans[key] = (len(text), len(text) + len(values[key]))
        text += values[key]
    return text + rest, spans
