"""Factual recall and knowledge conflict (parametric answer versus a contradicting context).

Facts are (relation, subject, answer) triples from a small curated list: capitals of
countries, cities of landmarks and official languages.  Answers are scored by their *first*
token with a leading space (most are single tokens in common tokenizers).

- ``factual_recall``: "The capital of France is" → " Paris"; corruption ``subject_swap``
  replaces the subject by another subject of the same relation with the same token length and
  a different answer.  Metric: ``logit(answer) − logit(alt)`` at END, where ``alt`` is the
  answer for the swapped subject.
- ``knowledge_conflict``: "In a different world, the capital of France is Rome. The capital of
  France is" — the context answer (" Rome") contradicts the parametric one (" Paris").
  Metric: ``logit(context) − logit(parametric)`` at END; a prompt counts as correct when the
  context answer wins.  Corruptions (same length): ``other_answer`` (the context states a
  third answer, " Madrid") and ``true_answer`` (the context states the parametric answer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from structlens.data.tasks.base import Encoder, TaskDataset

# Relation name -> query with {s} for the subject, lower-case so it can follow a comma.
RELATIONS: dict[str, str] = {
    "capital": "the capital of {s} is",
    "landmark": "{s} is located in the city of",
    "language": "the official language of {s} is",
}

FACTS: tuple[tuple[str, str, str], ...] = (
    ("capital", "France", "Paris"), ("capital", "Germany", "Berlin"),
    ("capital", "Italy", "Rome"), ("capital", "Spain", "Madrid"),
    ("capital", "Japan", "Tokyo"), ("capital", "China", "Beijing"),
    ("capital", "Russia", "Moscow"), ("capital", "England", "London"),
    ("capital", "Egypt", "Cairo"), ("capital", "Greece", "Athens"),
    ("capital", "Ireland", "Dublin"), ("capital", "Portugal", "Lisbon"),
    ("capital", "Austria", "Vienna"), ("capital", "Poland", "Warsaw"),
    ("capital", "Hungary", "Budapest"), ("capital", "Sweden", "Stockholm"),
    ("capital", "Norway", "Oslo"), ("capital", "Finland", "Helsinki"),
    ("capital", "Denmark", "Copenhagen"), ("capital", "Belgium", "Brussels"),
    ("capital", "the Netherlands", "Amsterdam"), ("capital", "Turkey", "Ankara"),
    ("capital", "Iran", "Tehran"), ("capital", "Iraq", "Baghdad"),
    ("capital", "Thailand", "Bangkok"), ("capital", "Kenya", "Nairobi"),
    ("capital", "Peru", "Lima"), ("capital", "Chile", "Santiago"),
    ("capital", "Cuba", "Havana"), ("capital", "Canada", "Ottawa"),
    ("capital", "Australia", "Canberra"), ("capital", "South Korea", "Seoul"),
    ("capital", "Indonesia", "Jakarta"), ("capital", "the Philippines", "Manila"),
    ("capital", "Vietnam", "Hanoi"), ("capital", "the Czech Republic", "Prague"),
    ("capital", "Scotland", "Edinburgh"), ("capital", "Wales", "Cardiff"),
    ("capital", "Venezuela", "Caracas"), ("capital", "Morocco", "Rabat"),
    ("capital", "Syria", "Damascus"), ("capital", "Lebanon", "Beirut"),
    ("capital", "Saudi Arabia", "Riyadh"), ("capital", "Afghanistan", "Kabul"),
    ("capital", "Romania", "Bucharest"), ("capital", "Bulgaria", "Sofia"),
    ("capital", "Serbia", "Belgrade"), ("capital", "Iceland", "Reykjavik"),
    ("landmark", "the Eiffel Tower", "Paris"), ("landmark", "the Colosseum", "Rome"),
    ("landmark", "Big Ben", "London"), ("landmark", "the Kremlin", "Moscow"),
    ("landmark", "the Brandenburg Gate", "Berlin"),
    ("landmark", "the Sagrada Familia", "Barcelona"),
    ("landmark", "the Acropolis", "Athens"), ("landmark", "the Forbidden City", "Beijing"),
    ("landmark", "the Space Needle", "Seattle"), ("landmark", "Hagia Sophia", "Istanbul"),
    ("landmark", "the Louvre", "Paris"), ("landmark", "the Sydney Opera House", "Sydney"),
    ("landmark", "the Prado Museum", "Madrid"), ("landmark", "the CN Tower", "Toronto"),
    ("landmark", "the Burj Khalifa", "Dubai"), ("landmark", "the Charles Bridge", "Prague"),
    ("landmark", "the Alhambra", "Granada"), ("landmark", "the Taj Mahal", "Agra"),
    ("language", "Brazil", "Portuguese"), ("language", "Mexico", "Spanish"),
    ("language", "France", "French"), ("language", "Germany", "German"),
    ("language", "Italy", "Italian"), ("language", "Japan", "Japanese"),
    ("language", "Russia", "Russian"), ("language", "Greece", "Greek"),
    ("language", "Poland", "Polish"), ("language", "Sweden", "Swedish"),
    ("language", "Turkey", "Turkish"), ("language", "the Netherlands", "Dutch"),
    ("language", "Egypt", "Arabic"), ("language", "Finland", "Finnish"),
    ("language", "Hungary", "Hungarian"), ("language", "Israel", "Hebrew"),
    ("language", "Thailand", "Thai"), ("language", "Vietnam", "Vietnamese"),
    ("language", "Denmark", "Danish"), ("language", "Norway", "Norwegian"),
    ("language", "Iran", "Persian"), ("language", "South Korea", "Korean"),
)  # fmt: skip

CONTEXT_PREFIX = "In a different world, "


@dataclass(frozen=True, kw_only=True)
class FactualRecallTask(TaskDataset):
    """Factual recall prompts.  ``answers``: ``"answer"`` (first token of the true answer) and
    ``"alt"`` (first token of the answer for the ``subject_swap`` subject).

    Positions: ``SUBJECT_LAST`` (last token of the subject) and ``END``.
    Metric: ``logit(answer) − logit(alt)`` at END; correct when it is positive.
    """

    relation: list[str]
    subject: list[str]

    per_prompt_fields: ClassVar[tuple[str, ...]] = (
        *TaskDataset.per_prompt_fields,
        "relation",
        "subject",
    )
    metric_description: ClassVar[str] = "logit(answer) - logit(alt) at END"

    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        return _logit_diff(self, end_logits, index, "answer", "alt")


@dataclass(frozen=True, kw_only=True)
class KnowledgeConflictTask(TaskDataset):
    """Knowledge-conflict prompts (context contradicting the model's parametric knowledge).

    ``answers``: ``"context"`` (the counterfactual stated in the context), ``"parametric"``
    (the true answer) and ``"other"`` (the third answer used by ``other_answer``), first
    tokens.  Positions: ``CONTEXT_ANSWER`` (first token of the counterfactual in the
    context), ``SUBJECT_LAST`` (last subject token of the final query) and ``END``.
    ``parametric`` / ``parametric_texts`` hold the query without the context
    ("The capital of France is"), whose END is its last token.

    Metric: ``logit(context) − logit(parametric)`` at END; correct (the context wins) when it
    is positive.  :meth:`outcome` says which answer is the top-1 token.
    """

    relation: list[str]
    subject: list[str]
    parametric: list[list[int]]
    parametric_texts: list[str]

    per_prompt_fields: ClassVar[tuple[str, ...]] = (
        *TaskDataset.per_prompt_fields,
        "relation",
        "subject",
        "parametric",
        "parametric_texts",
    )
    metric_description: ClassVar[str] = "logit(context answer) - logit(parametric answer) at END"

    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        return _logit_diff(self, end_logits, index, "context", "parametric")

    def outcome(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> list[str]:
        """Per prompt, ``"context"``, ``"parametric"`` or ``"other"``: which answer is the
        top-1 token of ``end_logits``."""
        idx = self._check_logits(end_logits, index)
        top = end_logits.argmax(dim=-1).cpu()
        ctx = torch.tensor(self.answers["context"])[idx]
        par = torch.tensor(self.answers["parametric"])[idx]
        return [
            "context" if t == c else "parametric" if t == p else "other"
            for t, c, p in zip(top.tolist(), ctx.tolist(), par.tolist(), strict=True)
        ]


def _logit_diff(
    task: TaskDataset,
    logits: torch.Tensor,
    index: Sequence[int] | None,
    good: str,
    bad: str,
) -> torch.Tensor:
    idx = task._check_logits(logits, index)
    rows = torch.arange(logits.shape[0], device=logits.device)
    return (
        logits[rows, task._answer(good, idx, logits.device)]
        - logits[rows, task._answer(bad, idx, logits.device)]
    )


def _query(relation: str, subject: str) -> str:
    q = RELATIONS[relation].format(s=subject)
    return q[0].upper() + q[1:]


def _context_prompt(relation: str, subject: str, stated: str) -> str:
    context = RELATIONS[relation].format(s=subject)
    return f"{CONTEXT_PREFIX}{context} {stated}. {_query(relation, subject)}"


def _usable_facts(
    enc: Encoder, facts: Sequence[tuple[str, str, str]]
) -> list[tuple[str, str, str, int, int]]:
    """Facts whose relation is known and whose answer tokenizes without unknown tokens, as
    ``(relation, subject, answer, first token, token count)``."""
    out = []
    for rel, subj, ans in facts:
        if rel not in RELATIONS:
            raise ValueError(f"Unknown relation {rel!r}; known: {sorted(RELATIONS)}.")
        ft = enc.first_token(" " + ans)
        if ft is not None:
            out.append((rel, subj, ans, *ft))
    return out


def _span_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> list[int]:
    return [i for i, (s, e) in enumerate(offsets) if s < end and e > start and e > s]


def make_knowledge_conflict(
    tokenizer: Any,
    *,
    n: int = 100,
    seed: int = 0,
    prepend_bos: bool | None = None,
    facts: Sequence[tuple[str, str, str]] = FACTS,
) -> KnowledgeConflictTask:
    """Generate ``n`` knowledge-conflict prompts, cycling through the facts in a seeded order.

    For each prompt the counterfactual answer and the ``other_answer`` replacement are drawn
    from the answers of the same relation that have the true answer's token count and
    first tokens distinct from each other, so both corruptions keep the clean length.

    Raises
    ------
    ValueError
        If ``n < 1`` or no fact has two same-length alternative answers in this tokenizer.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}.")
    enc = Encoder(tokenizer, prepend_bos)
    usable = _usable_facts(enc, facts)
    answers_by_rel: dict[str, dict[str, tuple[int, int]]] = {}
    for rel, _, ans, first, count in usable:
        answers_by_rel.setdefault(rel, {})[ans] = (first, count)

    def alternatives(rel: str, ans: str) -> list[str]:
        """Answers of the same relation with the same token count, one per first token
        (the alphabetically first), excluding the true answer's first token."""
        first, count = answers_by_rel[rel][ans]
        by_first: dict[int, str] = {}
        for a, (f, c) in sorted(answers_by_rel[rel].items()):
            if c == count and f != first:
                by_first.setdefault(f, a)
        return sorted(by_first.values())

    pool = [f for f in usable if len(alternatives(f[0], f[2])) >= 2]
    if not pool:
        raise ValueError(
            "No fact has two alternative answers of the same token length in this tokenizer; "
            "pass a longer list of facts."
        )
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(pool))
    rows: dict[str, Any] = {
        k: [] for k in ("texts", "clean", "par", "par_texts", "rel", "subj", "other", "true", "pos")
    }
    answers: dict[str, list[int]] = {"context": [], "parametric": [], "other": []}
    for i in range(n):
        rel, subj, ans, first, _ = pool[int(order[i % len(pool)])]
        alts = alternatives(rel, ans)
        cf, other = (alts[int(j)] for j in rng.choice(len(alts), size=2, replace=False))
        query = _query(rel, subj)
        text = _context_prompt(rel, subj, cf)
        ids, offsets = enc.encode(text)
        variants = {
            "other_answer": _context_prompt(rel, subj, other),
            "true_answer": _context_prompt(rel, subj, ans),
        }
        vids = {k: enc.ids(v) for k, v in variants.items()}
        if any(len(v) != len(ids) for v in vids.values()):
            raise ValueError(f"A corruption of {text!r} changes its token length.")
        a_start = len(CONTEXT_PREFIX) + len(RELATIONS[rel].format(s=subj)) + 1
        q_start = len(text) - len(query)
        s_start = q_start + query.lower().index(subj.lower())
        ctx_tokens = _span_tokens(offsets, a_start, a_start + len(cf))
        subj_tokens = _span_tokens(offsets, s_start, s_start + len(subj))
        rows["texts"].append(text)
        rows["clean"].append(ids)
        rows["par_texts"].append(query)
        rows["par"].append(enc.ids(query))
        rows["rel"].append(rel)
        rows["subj"].append(subj)
        rows["other"].append((variants["other_answer"], vids["other_answer"]))
        rows["true"].append((variants["true_answer"], vids["true_answer"]))
        rows["pos"].append((ctx_tokens[0], subj_tokens[-1], len(ids) - 1))
        answers["context"].append(answers_by_rel[rel][cf][0])
        answers["parametric"].append(first)
        answers["other"].append(answers_by_rel[rel][other][0])

    return KnowledgeConflictTask(
        name="knowledge_conflict",
        prompt_ids=[f"knowledge_conflict-{i:04d}" for i in range(n)],
        texts=rows["texts"],
        clean=rows["clean"],
        corrupted={
            "other_answer": [v for _, v in rows["other"]],
            "true_answer": [v for _, v in rows["true"]],
        },
        corrupted_texts={
            "other_answer": [t for t, _ in rows["other"]],
            "true_answer": [t for t, _ in rows["true"]],
        },
        positions={
            "CONTEXT_ANSWER": [p[0] for p in rows["pos"]],
            "SUBJECT_LAST": [p[1] for p in rows["pos"]],
            "END": [p[2] for p in rows["pos"]],
        },
        answers=answers,
        relation=rows["rel"],
        subject=rows["subj"],
        parametric=rows["par"],
        parametric_texts=rows["par_texts"],
        metadata={
            "seed": seed,
            "n": n,
            **enc.metadata(),
            "context_prefix": CONTEXT_PREFIX,
            "relations": dict(RELATIONS),
            "n_facts": len(pool),
        },
    )


def make_factual_recall(
    tokenizer: Any,
    *,
    n: int | None = None,
    seed: int = 0,
    prepend_bos: bool | None = None,
    facts: Sequence[tuple[str, str, str]] = FACTS,
) -> FactualRecallTask:
    """Generate one factual-recall prompt per usable fact (``n=None``) or the first ``n`` of
    them in a seeded order; each fact appears at most once.

    A fact is usable when another subject of the same relation has the same token length
    and a different answer first token (for the same-length ``subject_swap`` corruption).

    Raises
    ------
    ValueError
        If ``n`` is below 1 or above the number of usable facts.
    """
    enc = Encoder(tokenizer, prepend_bos)
    usable = _usable_facts(enc, facts)
    query_len = {(rel, subj): len(enc.ids(_query(rel, subj))) for rel, subj, *_ in usable}
    rng = np.random.default_rng(seed)

    def swaps(fact: tuple[str, str, str, int, int]) -> list[tuple[str, str, str, int, int]]:
        rel, subj, _, first, _ = fact
        return [
            g
            for g in usable
            if g[0] == rel and g[3] != first and query_len[(rel, g[1])] == query_len[(rel, subj)]
        ]

    pool = [f for f in usable if swaps(f)]
    if n is None:
        n = len(pool)
    if not 1 <= n <= len(pool):
        raise ValueError(
            f"n must be between 1 and the {len(pool)} usable facts for this tokenizer, got {n}."
        )
    chosen = [pool[int(j)] for j in rng.permutation(len(pool))[:n]]
    texts, clean, ctexts, cids, subj_last, alt = [], [], [], [], [], []
    for fact in chosen:
        rel, subj = fact[0], fact[1]
        cands = swaps(fact)
        swap = cands[int(rng.integers(len(cands)))]
        text, ctext = _query(rel, subj), _query(rel, swap[1])
        ids, offsets = enc.encode(text)
        c = enc.ids(ctext)
        if len(c) != len(ids):
            raise ValueError(f"The subject swap of {text!r} changes its token length.")
        s = text.lower().index(subj.lower())
        subj_last.append(_span_tokens(offsets, s, s + len(subj))[-1])
        texts.append(text)
        clean.append(ids)
        ctexts.append(ctext)
        cids.append(c)
        alt.append(swap[3])
    return FactualRecallTask(
        name="factual_recall",
        prompt_ids=[f"factual_recall-{i:04d}" for i in range(n)],
        texts=texts,
        clean=clean,
        corrupted={"subject_swap": cids},
        corrupted_texts={"subject_swap": ctexts},
        positions={"SUBJECT_LAST": subj_last, "END": [len(x) - 1 for x in clean]},
        answers={"answer": [f[3] for f in chosen], "alt": alt},
        relation=[f[0] for f in chosen],
        subject=[f[1] for f in chosen],
        metadata={"seed": seed, "n": n, **enc.metadata(), "relations": dict(RELATIONS)},
    )
