"""The model and the executor a command's options name; bad input exits with status 2."""

from __future__ import annotations

from typing import Any

from structlens.cli.output import fail, fail_user_error


def load_model_or_fail(name: str, device: str, dtype: str, seed: int, **placement: Any) -> Any:
    """The model ``name`` (see :func:`structlens.models.load_model`; ``placement``: its
    ``device_map``, ``max_memory`` and ``revision``, replacing ``device`` when a device_map is
    given); exits 2 if it cannot load because of the input (an unknown name, a missing file, a
    bad device, dtype or placement)."""
    from structlens.models import ModelUnavailableError, load_model

    where = None if placement.get("device_map") is not None else device
    try:
        return load_model(name, device=where, dtype=dtype, seed=seed, **placement)
    except (ModelUnavailableError, ValueError, FileNotFoundError) as err:
        fail_user_error(err)


def executor_or_fail(
    name: str, address: str | None = None, *, num_gpus_per_task: float | None = None
) -> Any:
    """The executor called ``name`` with the command's ``--address``; exits 2 on bad input."""
    from structlens.cli.checks import check_executor
    from structlens.errors import InputError
    from structlens.execution import get_executor

    try:
        check_executor(name, address)  # the commands' options ran it already; callers may not
    except InputError as err:
        fail(str(err))
    if name == "local":
        return get_executor("local")
    try:
        return get_executor("ray", address=address, num_gpus_per_task=num_gpus_per_task)
    except ImportError as err:
        fail(str(err))
