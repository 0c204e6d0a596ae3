"""Text corpora for capture: the bundled calibration corpus, user files and HF datasets.

A corpus is a list of :class:`Document` (an id and a text).  :func:`load_texts` reads one
from the bundled corpus (public-domain Jane Austen, see ``corpus/SOURCE.md``), a ``.txt`` or
``.jsonl`` file, a directory of ``.txt`` files, or a Hugging Face dataset;
:func:`chunk_documents` tokenizes documents into fixed-size prompts with stable ids, and
:func:`corpus_fingerprint` / :func:`prompts_fingerprint` give content hashes that a capture
cache can put in its key.  Everything here is deterministic: the same source gives the same
documents, ids and prompts in the same order.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from structlens.errors import UserError

BUNDLED_DIR = Path(__file__).with_name("corpus")
# Bundled documents are groups of consecutive paragraphs of at least this many characters
# (about 450 SmolLM2 tokens): long enough for 128-512 token prompts, short enough that a
# train/test split by document still has hundreds of units.
BUNDLED_DOC_CHARS = 2000
_CHAPTER_BREAK = "* * *"
_BLANK_LINES = re.compile(r"\n[ \t\r\f\v]*\n")


#: How to do without a Hugging Face dataset, for the messages that say it cannot be had.
LOCAL_DATA_HINT = (
    "pass a local .txt or .jsonl file or a directory of .txt files instead "
    "(`structlens capture --data PATH`; load_texts(PATH) in Python), or use the bundled "
    "corpus (`--data corpus`; source=None)"
)


class DatasetUnavailableError(UserError, RuntimeError):
    """A Hugging Face dataset that cannot be loaded here: offline, unknown to the hub, or a
    ``datasets`` failure; a ``RuntimeError`` too, as it was before it was a user error."""


class DatasetsMissingError(UserError, ImportError):
    """An ``hf:`` corpus source without the optional ``datasets`` package installed."""


@dataclass(frozen=True)
class Document:
    """One text with a stable identifier.

    Attributes
    ----------
    id : str
        Unique within its corpus and stable across runs (derived from the file name and the
        position in the file, never from a random draw).
    text : str
        The text, stripped of leading and trailing whitespace; never empty.
    """

    id: str
    text: str


@dataclass(frozen=True)
class Prompt:
    """A tokenized chunk of a document, ready to feed to a model.

    Attributes
    ----------
    id : str
        ``"{document id}#{chunk index}"``, chunk indices counting from 0 in reading order.
    token_ids : list[int]
        Token ids, including a leading BOS token when :func:`chunk_documents` was asked for one.
    """

    id: str
    token_ids: list[int]


def load_texts(source: str | Path | None = None, *, limit: int | None = None) -> list[Document]:
    """Load a corpus as a list of documents.

    Parameters
    ----------
    source : str, Path or None
        - ``None``: the bundled corpus (about 556 KB of public-domain English prose, the opening
          chapters of Jane Austen's six novels).  Each file is split into chapters, and each
          chapter into groups of consecutive paragraphs of at least ``BUNDLED_DOC_CHARS``
          characters; ids are ``"{file stem}/{chapter:02d}/{group:03d}"``.
        - a ``.txt`` file: documents are separated by one or more blank lines; ids are
          ``"{file stem}:{index}"``.
        - a ``.jsonl`` file: one JSON object per line with a string field ``text`` and an
          optional ``id`` (default ``"{file stem}:{line index}"``); blank lines are skipped.
        - a directory: every ``*.txt`` file below it (sorted by relative path) is one
          document whose id is its relative path.
        - ``"hf:NAME[:CONFIG][:SPLIT]"``: a Hugging Face dataset through the optional
          ``datasets`` package (split defaults to ``train``); its ``text`` column is used and
          ids are ``"hf:NAME:SPLIT:{row}"``.  Rows with empty text are skipped.
    limit : int or None
        Keep only the first ``limit`` documents (in the order above).

    Returns
    -------
    list of Document
        Non-empty documents with unique ids, in a deterministic order.

    Raises
    ------
    FileNotFoundError
        If a file or directory source does not exist.
    ValueError
        If the source yields no documents, has duplicate ids, a malformed JSONL line, an
        unsupported file extension, or ``limit`` is not positive.
    DatasetsMissingError
        If an ``hf:`` source is requested and ``datasets`` is not installed (an
        ``ImportError``).
    DatasetUnavailableError
        If the Hugging Face dataset cannot be loaded (for example offline; a
        ``RuntimeError``).
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive integer or None, got {limit}.")
    if source is None:
        docs = _load_bundled()
        where = f"the bundled corpus in {BUNDLED_DIR}"
    elif isinstance(source, str) and source.startswith("hf:"):
        docs = _load_hf(source, limit)
        where = source
    else:
        path = Path(source)
        where = str(path)
        if not path.exists():
            raise FileNotFoundError(
                f"Corpus source {path} does not exist. Pass an existing .txt or .jsonl file, a "
                "directory of .txt files, 'hf:NAME[:CONFIG][:SPLIT]', or None for the bundled "
                "corpus."
            )
        if path.is_dir():
            docs = _load_dir(path)
        elif path.suffix == ".txt":
            docs = _split_blank_lines(_read_utf8(path), path.stem)
        elif path.suffix == ".jsonl":
            docs = _load_jsonl(path)
        else:
            raise ValueError(
                f"Unsupported corpus file {path}: expected a .txt or .jsonl file (or a "
                "directory of .txt files)."
            )
    if limit is not None:
        docs = docs[:limit]
    if not docs:
        raise ValueError(f"No non-empty documents found in {where}.")
    _check_unique_ids(docs, where)
    return docs


def _split_blank_lines(text: str, stem: str) -> list[Document]:
    parts = [part.strip() for part in _BLANK_LINES.split(text)]
    return [Document(f"{stem}:{i}", part) for i, part in enumerate(x for x in parts if x)]


def _load_bundled() -> list[Document]:
    files = sorted(BUNDLED_DIR.glob("*.txt"))
    if not files:
        raise FileNotFoundError(
            f"The bundled corpus is missing from {BUNDLED_DIR}; reinstall structlens."
        )
    docs: list[Document] = []
    for file in files:
        chapters = file.read_text(encoding="utf-8").split(f"\n{_CHAPTER_BREAK}\n")
        for c, chapter in enumerate(chapters):
            paragraphs = [p.strip() for p in _BLANK_LINES.split(chapter) if p.strip()]
            for g, group in enumerate(_group_paragraphs(paragraphs, BUNDLED_DOC_CHARS)):
                docs.append(Document(f"{file.stem}/{c:02d}/{g:03d}", "\n\n".join(group)))
    return docs


def _group_paragraphs(paragraphs: list[str], min_chars: int) -> list[list[str]]:
    """Greedy groups of consecutive paragraphs with at least ``min_chars`` characters each.

    A short remainder at the end joins the previous group, so only a chapter shorter than
    ``min_chars`` yields a group below the minimum.
    """
    groups: list[list[str]] = []
    current: list[str] = []
    size = 0
    for p in paragraphs:
        current.append(p)
        size += len(p)
        if size >= min_chars:
            groups.append(current)
            current, size = [], 0
    if current:
        if groups:
            groups[-1].extend(current)
        else:
            groups.append(current)
    return groups


def _read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} is not UTF-8 text (byte {e.start}: {e.reason}); convert it, e.g. with "
            f"`iconv -f latin1 -t utf-8`."
        ) from e


def _load_dir(path: Path) -> list[Document]:
    docs = []
    for file in sorted(path.rglob("*.txt")):
        text = _read_utf8(file).strip()
        if text:
            docs.append(Document(file.relative_to(path).as_posix(), text))
    return docs


def _load_jsonl(path: Path) -> list[Document]:
    docs = []
    for i, line in enumerate(_read_utf8(path).splitlines()):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}, line {i + 1}: not valid JSON ({e}).") from e
        if not isinstance(row, dict) or not isinstance(row.get("text"), str):
            raise ValueError(
                f"{path}, line {i + 1}: expected a JSON object with a string field 'text'."
            )
        text = row["text"].strip()
        if text:
            docs.append(Document(str(row.get("id", f"{path.stem}:{i}")), text))
    return docs


def _load_hf(source: str, limit: int | None) -> list[Document]:
    parts = source[len("hf:") :].split(":")
    if not parts[0] or len(parts) > 3:
        raise ValueError(f"Malformed dataset source {source!r}: use 'hf:NAME[:CONFIG][:SPLIT]'.")
    name = parts[0]
    config = parts[1] if len(parts) > 1 and parts[1] else None
    split = parts[2] if len(parts) > 2 and parts[2] else "train"
    try:
        import datasets
    except ImportError as e:
        raise DatasetsMissingError(
            f"Loading {source!r} needs the optional 'datasets' package: "
            f"pip install 'structlens[datasets]'; or {LOCAL_DATA_HINT}."
        ) from e
    sliced = split if limit is None else f"{split}[:{limit}]"
    try:
        ds = datasets.load_dataset(name, config, split=sliced)
    except Exception as e:  # datasets raises many types (ConnectionError, FileNotFoundError...)
        raise DatasetUnavailableError(
            f"Could not load Hugging Face dataset {name!r} (config={config!r}, split={split!r}): "
            f"{type(e).__name__}: {e}. If this machine is offline or the hub lacks it, "
            f"{LOCAL_DATA_HINT}."
        ) from e
    if "text" not in ds.column_names:
        raise ValueError(
            f"Dataset {name!r} has no 'text' column (columns: {ds.column_names}); export the "
            "column you want to a .jsonl file with a 'text' field."
        )
    return [
        Document(f"hf:{name}:{split}:{i}", t.strip())
        for i, t in enumerate(ds["text"])
        if isinstance(t, str) and t.strip()
    ]


def _check_unique_ids(docs: Sequence[Document], where: str) -> None:
    seen: set[str] = set()
    for d in docs:
        if d.id in seen:
            raise ValueError(f"Duplicate document id {d.id!r} in {where}; ids must be unique.")
        seen.add(d.id)


def chunk_documents(
    docs: Iterable[Document],
    tokenizer: Any,
    *,
    max_tokens: int,
    min_tokens: int | None = None,
    max_prompts: int | None = None,
    prepend_bos: bool = False,
) -> list[Prompt]:
    """Tokenize documents and cut them into consecutive, non-overlapping prompts.

    Each document is tokenized on its own without special tokens, then cut into windows of
    ``max_tokens`` tokens (``max_tokens - 1`` when a BOS token is prepended, so that every
    prompt has at most ``max_tokens`` tokens).  A final window shorter than ``min_tokens``
    is dropped.  Windows start at token boundaries, not sentence boundaries.

    Parameters
    ----------
    docs : iterable of Document
        Documents, for example from :func:`load_texts`.
    tokenizer : transformers tokenizer
        Any callable Hugging Face tokenizer (``tokenizer(text, add_special_tokens=False)``
        must return a mapping with ``input_ids``).
    max_tokens : int
        Maximum prompt length in tokens (including the BOS token if any); at least 2.
    min_tokens : int or None
        Minimum prompt length in tokens (including BOS), between 1 and ``max_tokens``;
        None means ``min(8, max_tokens)``.
    max_prompts : int or None
        Stop after this many prompts (the first ones in document order).
    prepend_bos : bool
        Put ``tokenizer.bos_token_id`` in front of every prompt.  SmolLM2's tokenizer does
        not add one by itself.

    Returns
    -------
    list of Prompt
        Prompts with ids ``"{document id}#{chunk index}"``, in document order; the result is a
        deterministic function of the documents and the tokenizer.

    Raises
    ------
    ValueError
        On invalid sizes, a tokenizer without a BOS token when ``prepend_bos`` is set, or
        when no document is long enough to give a prompt.
    """
    if max_tokens < 2:
        raise ValueError(f"max_tokens must be at least 2, got {max_tokens}.")
    if min_tokens is None:
        min_tokens = min(8, max_tokens)
    if not 1 <= min_tokens <= max_tokens:
        raise ValueError(f"min_tokens must be in [1, max_tokens={max_tokens}], got {min_tokens}.")
    if max_prompts is not None and max_prompts < 1:
        raise ValueError(f"max_prompts must be a positive integer or None, got {max_prompts}.")
    prefix: list[int] = []
    if prepend_bos:
        bos = getattr(tokenizer, "bos_token_id", None)
        if bos is None:
            raise ValueError(
                "prepend_bos=True but the tokenizer has no bos_token_id; pass prepend_bos=False."
            )
        prefix = [int(bos)]
    body = max_tokens - len(prefix)
    prompts: list[Prompt] = []
    n_docs = 0
    for doc in docs:
        n_docs += 1
        ids = [int(t) for t in tokenizer(doc.text, add_special_tokens=False)["input_ids"]]
        for k, start in enumerate(range(0, len(ids), body)):
            window = prefix + ids[start : start + body]
            if len(window) < min_tokens:
                break
            prompts.append(Prompt(f"{doc.id}#{k}", window))
            if max_prompts is not None and len(prompts) >= max_prompts:
                return prompts
    if not prompts:
        raise ValueError(
            f"No prompts of at least min_tokens={min_tokens} tokens from {n_docs} document(s); "
            "lower min_tokens or pass longer documents."
        )
    return prompts


def corpus_fingerprint(docs: Iterable[Document]) -> str:
    """SHA-256 hex digest of the documents' ids and texts, in order.

    Each id and text is hashed with its UTF-8 byte length in front, so no two different
    document lists collide by concatenation (``["ab"]`` versus ``["a", "b"]``).  Two corpora
    have the same fingerprint exactly when they have the same ids and texts in the same order.
    """
    h = hashlib.sha256(b"structlens-corpus-v1")
    for d in docs:
        for field in (d.id, d.text):
            b = field.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    return h.hexdigest()


def prompts_fingerprint(prompts: Iterable[Prompt]) -> str:
    """SHA-256 hex digest of prompt ids and token ids, in order (length-prefixed like
    :func:`corpus_fingerprint`); it changes when the tokenizer or the chunking changes."""
    h = hashlib.sha256(b"structlens-prompts-v1")
    for p in prompts:
        b = p.id.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
        h.update(len(p.token_ids).to_bytes(8, "little"))
        h.update(np.asarray(p.token_ids, dtype="<i8").tobytes())
    return h.hexdigest()
