"""The common shape of a circuit task dataset, and the tokenization helpers tasks share.

A :class:`TaskDataset` holds, for every prompt, the clean token ids, one or more corrupted
versions of *exactly the same length* (so activations can be patched position by position),
named token positions (always including ``"END"``, the last token), the answer tokens, and a
differentiable per-prompt metric computed from the logits at the task's metric positions.
Concrete tasks subclass it and define the metric.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from structlens.results import content_key

T = TypeVar("T", bound="TaskDataset")


@dataclass(frozen=True, kw_only=True)
class TaskDataset(abc.ABC):
    """Prompts, same-length corruptions, named positions, answers and a metric for one task.

    Conventions: prompt ``i`` is row ``i`` of every per-prompt field; token positions are
    0-based indices into the clean token ids; a corrupted prompt has the same length as the
    clean prompt it corrupts, so ``positions`` index both.  Metrics are computed from logits
    (not log-probabilities) unless a subclass says otherwise, and are larger when the model
    does the task better.

    Attributes
    ----------
    name : str
        Task name in the registry (``"ioi"``, ``"greater_than"``, ...).
    prompt_ids : list of str
        Stable, unique ids (``"{task}-{index:04d}"``): the same generator arguments and
        tokenizer give the same ids for the same prompts.
    texts : list of str
        The clean prompt texts.
    clean : list of list of int
        Clean token ids per prompt, starting with the special tokens the tokenizer puts
        before a text (Gemma's ``<bos>``; none for SmolLM2) unless ``prepend_bos`` chose
        otherwise (see :class:`Encoder`); ``metadata["prepend_bos"]`` says whether there are
        any.
    corrupted : dict of str to list of list of int
        Corruption name to token ids per prompt, each the length of the clean prompt.
    corrupted_texts : dict of str to list of str
        Corruption name to the corrupted texts.
    positions : dict of str to list of int
        Position name to a token index per prompt; always has ``"END"`` (the last token).
    answers : dict of str to list of int
        Answer name to one token id per prompt (for example ``"IO"`` and ``"S"``).
    metric_positions : tuple of str
        The positions whose logits :meth:`metric` reads, in order.  ``("END",)`` for most
        tasks; a metric over several positions takes logits of shape ``[n, k, vocab]``.
    metadata : dict
        JSON-serialisable generation settings (seed, templates, tokenizer mode, ...).
    """

    name: str
    prompt_ids: list[str]
    texts: list[str]
    clean: list[list[int]]
    corrupted: dict[str, list[list[int]]]
    corrupted_texts: dict[str, list[str]]
    positions: dict[str, list[int]]
    answers: dict[str, list[int]]
    metric_positions: tuple[str, ...] = ("END",)
    metadata: dict[str, Any] = field(default_factory=dict)

    # Fields indexed by prompt (lists, or dicts of lists); subclasses extend this tuple.
    per_prompt_fields: ClassVar[tuple[str, ...]] = (
        "prompt_ids",
        "texts",
        "clean",
        "corrupted",
        "corrupted_texts",
        "positions",
        "answers",
    )
    metric_description: ClassVar[str] = ""

    def __post_init__(self) -> None:
        n = len(self.prompt_ids)
        if n == 0:
            raise ValueError(f"Task {self.name!r} has no prompts.")
        if len(set(self.prompt_ids)) != n:
            raise ValueError(f"Task {self.name!r} has duplicate prompt ids.")
        for fname in self.per_prompt_fields:
            value = getattr(self, fname)
            items = value.items() if isinstance(value, dict) else [(fname, value)]
            for key, rows in items:
                if len(rows) != n:
                    raise ValueError(
                        f"Task {self.name!r}: {fname}[{key!r}] has {len(rows)} rows for "
                        f"{n} prompts."
                    )
        lengths = [len(ids) for ids in self.clean]
        for cname, seqs in self.corrupted.items():
            for i, (seq, length) in enumerate(zip(seqs, lengths, strict=True)):
                if len(seq) != length:
                    raise ValueError(
                        f"Task {self.name!r}: corruption {cname!r} of prompt "
                        f"{self.prompt_ids[i]!r} has {len(seq)} tokens, the clean prompt "
                        f"{length}; corruptions must keep the clean length."
                    )
        if set(self.corrupted_texts) != set(self.corrupted):
            raise ValueError(f"Task {self.name!r}: corrupted and corrupted_texts keys differ.")
        if "END" not in self.positions:
            raise ValueError(f"Task {self.name!r} has no 'END' position.")
        if any(p != length - 1 for p, length in zip(self.positions["END"], lengths, strict=True)):
            raise ValueError(f"Task {self.name!r}: 'END' must be the last token of each prompt.")
        for pname, pos in self.positions.items():
            for p, length in zip(pos, lengths, strict=True):
                if not 0 <= p < length:
                    raise ValueError(
                        f"Task {self.name!r}: position {pname!r}={p} outside a prompt of "
                        f"{length} tokens."
                    )
        missing = [p for p in self.metric_positions if p not in self.positions]
        if not self.metric_positions or missing:
            raise ValueError(
                f"Task {self.name!r}: metric positions {self.metric_positions} must be a "
                f"non-empty subset of the named positions {sorted(self.positions)}."
            )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    @property
    def lengths(self) -> list[int]:
        """Token count of each prompt (clean and corrupted alike)."""
        return [len(ids) for ids in self.clean]

    def tokens(self, corruption: str | None = None) -> list[list[int]]:
        """Token ids per prompt: the clean prompts, or those of the named corruption."""
        if corruption is None:
            return self.clean
        if corruption not in self.corrupted:
            raise ValueError(
                f"Task {self.name!r} has no corruption {corruption!r}; "
                f"choose one of {sorted(self.corrupted)}."
            )
        return self.corrupted[corruption]

    def metric_position_index(self, index: Sequence[int] | None = None) -> torch.Tensor:
        """Token indices of the metric positions, shape ``[len(index), len(metric_positions)]``."""
        idx = self._index(index)
        table = torch.tensor([self.positions[p] for p in self.metric_positions], dtype=torch.long)
        return table.T[idx]

    def gather_logits(
        self,
        logits: torch.Tensor,
        index: Sequence[int] | None = None,
        *,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Pick the logits the metric reads out of full-sequence logits.

        Parameters
        ----------
        logits : Tensor, shape ``[b, seq, vocab]``
            Logits of prompts ``index`` (all prompts if None), padded to a common length.
        index : sequence of int or None
            Which prompts the ``b`` rows are.
        attention_mask : Tensor ``[b, seq]`` or None
            The batch's mask.  None means right padding (or none), where task positions are
            batch columns; with a mask, left padding is allowed too: each position is moved
            past its row's leading padding (see :func:`padded_positions`).

        Returns
        -------
        Tensor
            ``[b, vocab]`` when the task has one metric position, else
            ``[b, len(metric_positions), vocab]``; ready for :meth:`metric`.
        """
        if logits.ndim != 3:
            raise ValueError(f"Expected logits of shape [batch, seq, vocab], got {logits.shape}.")
        pos = self.metric_position_index(index).to(logits.device)
        if pos.shape[0] != logits.shape[0]:
            raise ValueError(
                f"logits has {logits.shape[0]} rows but index selects {pos.shape[0]} prompts."
            )
        if attention_mask is not None:
            if attention_mask.shape != logits.shape[:2]:
                raise ValueError(
                    f"attention_mask has shape {tuple(attention_mask.shape)}, the logits "
                    f"{tuple(logits.shape[:2])} batch and sequence axes."
                )
            pos = padded_positions(pos, attention_mask.to(logits.device))
        rows = torch.arange(logits.shape[0], device=logits.device)[:, None]
        out = logits[rows, pos]
        return out[:, 0] if out.shape[1] == 1 else out

    @abc.abstractmethod
    def metric(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """Per-prompt task metric, shape ``[m]``, differentiable in ``end_logits``.

        Parameters
        ----------
        end_logits : Tensor
            Logits at the metric positions of prompts ``index``: ``[m, vocab]`` for one
            metric position (usually END), ``[m, len(metric_positions), vocab]`` otherwise
            (see :meth:`gather_logits`).  The logits may come from a clean, corrupted or
            patched run; the metric always refers to the clean prompt's answers.
        index : sequence of int or None
            Which prompts the ``m`` rows are (all prompts, in order, if None).
        """

    def correct(self, end_logits: torch.Tensor, index: Sequence[int] | None = None) -> torch.Tensor:
        """Boolean per prompt: does the model do the task?  Default: ``metric > 0``."""
        return self.metric(end_logits, index) > 0

    def subset(self: T, index: Sequence[int]) -> T:
        """The dataset restricted to prompts ``index`` (in that order); ids are kept."""
        idx = [int(i) for i in index]
        n = len(self)
        if not idx:
            raise ValueError("subset() needs at least one prompt index.")
        if any(not -n <= i < n for i in idx):
            raise ValueError(f"subset() indices must lie in [-{n}, {n}).")
        changes: dict[str, Any] = {}
        for fname in self.per_prompt_fields:
            value = getattr(self, fname)
            if isinstance(value, dict):
                changes[fname] = {k: [rows[i] for i in idx] for k, rows in value.items()}
            else:
                changes[fname] = [value[i] for i in idx]
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """All fields as JSON-serialisable Python objects (plus the class name)."""
        d = dataclasses.asdict(self)
        d["metric_positions"] = list(self.metric_positions)
        d["class"] = type(self).__name__
        return d

    def fingerprint(self) -> str:
        """SHA-256 hex digest of every field (token ids, positions, answers, metadata).

        Equal fingerprints mean identical datasets; a capture cache can put it in its key.
        """
        return content_key(self.to_dict())

    def _index(self, index: Sequence[int] | torch.Tensor | None) -> torch.Tensor:
        if index is None:
            return torch.arange(len(self))
        idx = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if idx.numel() and (idx.min() < -len(self) or idx.max() >= len(self)):
            raise ValueError(f"Prompt indices must lie in [-{len(self)}, {len(self)}).")
        return idx

    def _check_logits(self, logits: torch.Tensor, index: Sequence[int] | None) -> torch.Tensor:
        """Validate metric input; return the prompt indices it covers.

        Accepts ``[m, vocab]`` (one metric position) or ``[m, k, vocab]`` with
        ``k = len(metric_positions)``; ``m`` must match ``index``.
        """
        idx = self._index(index)
        k = len(self.metric_positions)
        ok = (logits.ndim == 2 and k == 1) or (logits.ndim == 3 and logits.shape[1] == k)
        if not ok:
            want = "[n, vocab]" if k == 1 else f"[n, {k}, vocab]"
            raise ValueError(
                f"Task {self.name!r} reads logits at {self.metric_positions}: expected shape "
                f"{want}, got {tuple(logits.shape)}. Use gather_logits() on full logits."
            )
        if logits.shape[0] != idx.numel():
            raise ValueError(
                f"logits has {logits.shape[0]} rows but {idx.numel()} prompts are indexed "
                f"(the task has {len(self)}); pass index= for a batch."
            )
        if not torch.is_floating_point(logits):
            raise ValueError(f"logits must be floating point, got {logits.dtype}.")
        return idx

    def _answer(self, key: str, idx: torch.Tensor, device: torch.device) -> torch.Tensor:
        return torch.tensor(self.answers[key], dtype=torch.long)[idx].to(device)

    def _logit_difference(
        self, end_logits: torch.Tensor, index: Sequence[int] | None, good: str, bad: str
    ) -> torch.Tensor:
        """``logit(answers[good]) − logit(answers[bad])`` per prompt at END."""
        idx = self._check_logits(end_logits, index)
        rows = torch.arange(end_logits.shape[0], device=end_logits.device)
        pos = self._answer(good, idx, end_logits.device)
        neg = self._answer(bad, idx, end_logits.device)
        return end_logits[rows, pos] - end_logits[rows, neg]


PADDING_SIDES = ("right", "left")


def pad_batch(
    sequences: Sequence[Sequence[int]], pad_id: int = 0, padding_side: str = "right"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token id sequences into ``(input_ids, attention_mask)``, both ``[b, max_len]``.

    The mask is 1 on real tokens and 0 on padding.  With ``padding_side="right"`` (the default)
    each prompt's tokens keep their positions (0..len-1), so task positions index the batch
    directly; with ``"left"`` (what many tokenizers, Gemma's among them, do by default) prompt
    ``i``'s tokens end at the last column and its positions shift by ``max_len - len_i``:
    :meth:`TaskDataset.gather_logits` undoes that shift given the mask.  With causal attention
    the logits at real positions do not depend on right padding; left padding also moves the
    absolute positions, which changes nothing for rotary models but does for learned position
    embeddings unless the forward pass derives position ids from the mask.
    """
    if padding_side not in PADDING_SIDES:
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}.")
    if not sequences:
        raise ValueError("pad_batch() needs at least one sequence.")
    width = max(len(s) for s in sequences)
    if width == 0:
        raise ValueError("pad_batch() got only empty sequences.")
    ids = torch.full((len(sequences), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, s in enumerate(sequences):
        cols = slice(0, len(s)) if padding_side == "right" else slice(width - len(s), width)
        ids[i, cols] = torch.as_tensor(list(s), dtype=torch.long)
        mask[i, cols] = 1
    return ids, mask


def padded_positions(positions: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Columns of a padded batch holding the prompt-relative token ``positions``.

    ``positions`` is ``[b, k]`` (indices into each unpadded prompt), ``attention_mask`` the
    batch's ``[b, seq]`` mask; the real tokens of each row are taken to be one contiguous run
    (left or right padding).  Returns ``positions`` plus each row's leading padding.

    Raises ValueError if a row's real tokens are not contiguous or a position falls outside.
    """
    mask = attention_mask.to(torch.long)
    lengths = mask.sum(dim=1)
    # the first real column: the number of zeros before the first one
    lead = torch.argmax(mask, dim=1)
    cols = torch.arange(mask.shape[1], device=mask.device)[None, :]
    run = (cols >= lead[:, None]) & (cols < (lead + lengths)[:, None])
    if not torch.equal(run.to(torch.long), mask):
        raise ValueError("attention_mask rows must hold one contiguous run of real tokens.")
    pos = positions.to(mask.device)
    if bool((pos >= lengths[:, None]).any()) or bool((pos < 0).any()):
        raise ValueError("A task position lies outside its prompt's real tokens in the batch.")
    return pos + lead[:, None]


def special_prefix(tokenizer: Any) -> list[int]:
    """The special token ids ``tokenizer`` puts before a text with its default settings.

    Found by encoding a probe text with and without ``add_special_tokens``: the ids before the
    plain encoding are the prefix (``[bos_token_id]`` for Gemma, ``[]`` for SmolLM2).

    Raises ValueError if the tokenizer changes the text's own tokens when adding special ones,
    so that no prefix describes what it does.
    """
    probe = "When Mary and John went to the store"
    plain = [int(t) for t in tokenizer(probe, add_special_tokens=False)["input_ids"]]
    full = [int(t) for t in tokenizer(probe)["input_ids"]]
    for start in range(len(full) - len(plain) + 1):
        if full[start : start + len(plain)] == plain:
            return full[:start]
    raise ValueError(
        "The tokenizer's special tokens change the tokens of the text itself; pass "
        "prepend_bos=True or False to choose the prompt prefix explicitly."
    )


class Encoder:
    """Tokenizes prompt texts and maps character spans to token indices.

    Wraps a Hugging Face *fast* tokenizer (it needs offset mappings).  Every prompt starts with
    the same :attr:`prefix` of special tokens, chosen by ``prepend_bos``:

    - ``None`` (the default): whatever the tokenizer itself puts before a text when called with
      its defaults (``add_special_tokens=True``): ``<bos>`` for Gemma and Llama-2, nothing for
      SmolLM2 and GPT-2.  The prompt ids are then exactly ``tokenizer(text)["input_ids"]``, so
      a task sees the input the model was trained on.  Tokens the tokenizer appends *after* a
      text (an EOS) are left out: the metrics read the prediction after the last text token.
    - ``True``: ``bos_token_id`` alone, whether or not the tokenizer adds it.
    - ``False``: no special tokens at all.

    Answer tokens (:meth:`single_token`, :meth:`first_token`) are always encoded without
    special tokens.
    """

    def __init__(self, tokenizer: Any, prepend_bos: bool | None = None) -> None:
        self.tokenizer = tokenizer
        self.prefix: list[int] = []
        if prepend_bos is None:
            self.prefix = special_prefix(tokenizer)
        elif prepend_bos:
            bos = getattr(tokenizer, "bos_token_id", None)
            if bos is None:
                raise ValueError("prepend_bos=True but the tokenizer has no bos_token_id.")
            self.prefix = [int(bos)]
        self.unk = getattr(tokenizer, "unk_token_id", None)

    @property
    def has_prefix(self) -> bool:
        """Whether prompts start with special tokens (every position is shifted by their count)."""
        return bool(self.prefix)

    def metadata(self) -> dict[str, Any]:
        """What a task records about its special tokens: ``prepend_bos`` (whether prompts start
        with special tokens) and, when they do, ``prefix_ids``."""
        out: dict[str, Any] = {"prepend_bos": self.has_prefix}
        if self.prefix:
            out["prefix_ids"] = list(self.prefix)
        return out

    def encode(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Token ids and character offsets (BOS gets the empty span ``(0, 0)``)."""
        try:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError as e:
            raise ValueError(
                "Task datasets need a fast tokenizer (with offset mappings); load it with "
                "AutoTokenizer.from_pretrained(..., use_fast=True)."
            ) from e
        ids = [int(t) for t in enc["input_ids"]]
        offsets = [(int(s), int(e)) for s, e in enc["offset_mapping"]]
        return self.prefix + ids, [(0, 0)] * len(self.prefix) + offsets

    def ids(self, text: str) -> list[int]:
        return self.encode(text)[0]

    def token_at(
        self, offsets: list[tuple[int, int]], start: int, end: int, *, what: str = "span"
    ) -> int:
        """Index of the single token overlapping characters ``[start, end)``.

        Raises ValueError if the span is split over several tokens or covered by none.
        """
        hits = [i for i, (s, e) in enumerate(offsets) if s < end and e > start and e > s]
        if len(hits) != 1:
            raise ValueError(
                f"The {what} at characters [{start}, {end}) covers {len(hits)} tokens; "
                "expected exactly one."
            )
        return hits[0]

    def single_token(self, text: str) -> int | None:
        """The token id of ``text`` if the tokenizer encodes it as one known token, else None."""
        enc = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(enc) != 1 or (self.unk is not None and int(enc[0]) == self.unk):
            return None
        return int(enc[0])

    def first_token(self, text: str) -> tuple[int, int] | None:
        """``(first token id, token count)`` of ``text``, or None if it contains an unknown."""
        enc = [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]
        if not enc or (self.unk is not None and self.unk in enc):
            return None
        return enc[0], len(enc)


def single_token_words(
    encoder: Encoder, words: Sequence[str], *, what: str, minimum: int
) -> list[tuple[str, int]]:
    """Words that are one known token with a leading space, deduplicated by token id.

    Raises ValueError naming the tokenizer's problem if fewer than ``minimum`` remain.
    """
    out: list[tuple[str, int]] = []
    seen: set[int] = set()
    for w in words:
        tid = encoder.single_token(" " + w)
        if tid is not None and tid not in seen:
            out.append((w, tid))
            seen.add(tid)
    if len(out) < minimum:
        raise ValueError(
            f"Only {len(out)} of {len(words)} {what} are single tokens (with a leading space) "
            f"in this tokenizer; need at least {minimum}. Pass a longer list of {what}."
        )
    return out
