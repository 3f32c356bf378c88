"""What runs on a Dask worker: the kernel wrapper that reports metadata without moving data.

A task's result stays in worker memory; only its shape, dtype and size travel back,
as a small structured event (``Worker.log_event``) the client receives on the same
ordered streams that announce the task's completion. This module is imported on the
workers, so it stays small and imports nothing from the client side.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from distributed import get_worker

from .._kernels import run_kernel

__all__ = ["Meta", "describe", "run_remote"]

#: What a task reports: ``(multi, [(shape, dtype.str, nbytes), ...])``, msgpack-friendly.
Meta = tuple[bool, list[tuple[list[int], str, int]]]


def _freeze(value: Any) -> None:
    # An input copied from another worker arrives writable; a kernel must not be able
    # to change that replica, which other tasks on this worker read too.
    if isinstance(value, np.ndarray):
        value.flags.writeable = False
    elif type(value) in (list, tuple):
        for v in value:
            _freeze(v)


def describe(value: Any) -> Meta:
    """The metadata of a task result (a tuple of ndarrays for a multi-output kernel)."""
    arrays = list(value) if isinstance(value, tuple) else [value]
    return isinstance(value, tuple), [(list(a.shape), a.dtype.str, a.nbytes) for a in arrays]


def run_remote(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], topic: str, token: str) -> Any:
    """Run a kernel on a worker, report its metadata under ``topic`` and keep its buffers here.

    Returns one ndarray, or a tuple of them for a multi-output kernel; the client then
    makes one future per output.
    """
    _freeze(args)
    _freeze(list(kwargs.values()))
    result = run_kernel(fn, args, kwargs)
    arrays = [b.handle for b in result.buffers]
    value = tuple(arrays) if result.multi else arrays[0]
    try:
        worker = get_worker()
    except ValueError:  # not on a worker (a client-side test): the client falls back to describe()
        return value
    # The event leaves on the worker's stream before the task's completion does, so the
    # client usually knows the metadata by the time it learns the task finished.
    worker.log_event(topic, [token, *describe(value)])
    return value
