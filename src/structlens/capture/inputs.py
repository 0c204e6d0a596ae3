"""What a capture reads, from the spellings a user types: sites by name or glob pattern
(:func:`expand_sites`) and prompts by data source (:func:`load_prompts`)."""

from __future__ import annotations

import fnmatch
from typing import Any

from structlens.errors import InputError

__all__ = ["expand_sites", "load_prompts"]


def expand_sites(model: Any, spec: str) -> list[str]:
    """The sites of ``model`` that ``spec`` names, in order and without repeats.

    Parameters
    ----------
    model
        A loaded model (:func:`structlens.models.load_model`).
    spec
        Comma-separated site names or glob patterns, e.g. ``'blocks.*.hook_resid_pre'``.

    Returns
    -------
    list[str]
        The canonical site names.

    Raises
    ------
    InputError
        A pattern matches no site, a name is not a site of ``model``
        (:class:`~structlens.sites.SiteError`), or ``spec`` names nothing.
    """
    names = model.site_names()
    chosen: list[str] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if any(ch in part for ch in "*?["):
            hits = [n for n in names if fnmatch.fnmatchcase(n, part)]
            if not hits:
                raise InputError(f"pattern {part!r} matches no site of {model.name}")
            chosen += hits
        else:
            chosen.append(model.site(part).name)
    if not chosen:
        raise InputError("name at least one site, e.g. --sites 'blocks.*.hook_resid_pre'")
    return list(dict.fromkeys(chosen))


def load_prompts(
    model: Any, data: str, *, max_prompts: int | None, prompt_tokens: int, seed: int
) -> tuple[list[Any], dict[str, list[int]] | None, str]:
    """The prompts a capture runs over.

    Parameters
    ----------
    model
        A loaded model; its tokenizer makes the prompts.
    data
        ``'corpus'`` (the bundled corpus), a ``.txt``/``.jsonl`` file or a directory,
        ``'hf:NAME[:CONFIG][:SPLIT]'`` (chunked into windows of ``prompt_tokens`` tokens), or
        ``'task:NAME'`` (the clean prompts of a circuit task, with its named positions).
    max_prompts
        At most this many prompts (None: all).
    prompt_tokens
        Tokens per corpus window.
    seed
        Seed of a task's prompt sampling.

    Returns
    -------
    tuple
        (prompts, the task's named positions or None, the data label).

    Raises
    ------
    ValueError
        An unknown task or bad sizes (from :func:`~structlens.data.tasks.make_task` or
        :func:`~structlens.data.corpus.load_texts`).
    FileNotFoundError
        ``data`` names a path that does not exist.
    """
    if data.startswith("task:"):
        from structlens.data.tasks import make_task

        task = make_task(data.removeprefix("task:"), model.tokenizer, n=max_prompts, seed=seed)
        prompts: list[Any] = list(zip(task.prompt_ids, task.clean))
        return prompts, dict(task.positions), data
    from structlens.data.corpus import chunk_documents, load_texts

    docs = load_texts(None if data == "corpus" else data)
    prompts = chunk_documents(
        docs, model.tokenizer, max_tokens=prompt_tokens, max_prompts=max_prompts
    )
    return prompts, None, data
