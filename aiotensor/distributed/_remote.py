"""What runs on a Dask worker: the kernel wrapper that reports metadata without moving data.

A task's result stays in worker memory; only its shape, dtype and size travel back,
as a small structured event (``Worker.log_event``) the client receives on the same
ordered streams that announce the task's completion, with the floating-point errors
the kernel hit under the caller's ``np.errstate`` (so numpy's warnings reach the
caller's line as they do locally, see ``_fpwarn``). This module is imported on the
workers, so it stays small and imports nothing from the client side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from distributed import get_worker

from .._kernels import read_only_view, run_kernel

__all__ = ["FpErrors", "Meta", "describe", "run_remote"]

#: What a task reports: ``(multi, [(shape, dtype.str, nbytes), ...])``, msgpack-friendly.
Meta = tuple[bool, list[tuple[list[int], str, int]]]
#: The floating-point errors a kernel hit in ``"call"`` mode: ``[(error, flag), ...]``.
FpErrors = list[tuple[str, int]]


def _viewed(value: Any) -> Any:
    # The one rule of every kernel's inputs (_kernels.read_only_view): an input copied
    # from another worker arrives writable, and neither the kernel nor a result that
    # returns it as it is may change or take over that replica, which other tasks here
    # read too. Views leave the worker's stored data as it is.
    if isinstance(value, np.ndarray):
        return read_only_view(value)
    if type(value) in (list, tuple):
        return type(value)(_viewed(v) for v in value)
    return value


def describe(value: Any) -> Meta:
    """The metadata of a task result (a tuple of ndarrays for a multi-output kernel)."""
    arrays = list(value) if isinstance(value, tuple) else [value]
    return isinstance(value, tuple), [(list(a.shape), a.dtype.str, a.nbytes) for a in arrays]


def run_remote(
    fn: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    topic: str,
    token: str,
    errstate: dict[str, str] | None = None,
) -> Any:
    """Run a kernel on a worker, report its metadata under ``topic`` and keep its buffers here.

    ``errstate`` is the caller's ``np.geterr()`` (``None``: the worker's own): a
    category in ``"raise"`` raises here as it would in the caller's thread, and those
    in ``"call"`` are collected and reported with the metadata, for the caller's
    ``np.geterrcall()`` (the engine's collector, which warns at the user's line).

    Returns one ndarray, or a tuple of them for a multi-output kernel; the client then
    makes one future per output.
    """
    args = _viewed(args)
    kwargs = {k: _viewed(v) for k, v in kwargs.items()}
    errors: FpErrors = []
    if errstate is None:
        result = run_kernel(fn, args, kwargs)
    else:
        with np.errstate(call=lambda err, flag: errors.append((err, flag)), **errstate):  # type: ignore[arg-type]
            result = run_kernel(fn, args, kwargs)
    arrays = [b.handle for b in result.buffers]
    value = tuple(arrays) if result.multi else arrays[0]
    try:
        worker = get_worker()
    except ValueError:  # not on a worker (a client-side test): the client falls back to describe()
        return value
    # The event leaves on the worker's stream before the task's completion does, so the
    # client usually knows the metadata by the time it learns the task finished.
    worker.log_event(topic, [token, *describe(value), errors])
    return value
