"""BLAS threads and pool workers, coordinated so that they never oversubscribe the cores.

numpy's BLAS (OpenBLAS in the wheels) runs each matrix product on all cores. Two pool
workers running products at once would then run ``2 x cores`` threads on ``cores``
cores, and OpenBLAS threads busy-wait: throughput drops below running the products
one after another. So products sent to the pool pass through a gate that admits
``cores // blas_threads`` of them at a time (one, by default: each product gets every
core, the other workers stay free for other kernels).

The setting: :func:`set_blas_threads`. ``set_blas_threads(1)`` makes each product
single-threaded (through threadpoolctl) and opens the gate to one product per core:
better throughput for many concurrent small products, worse latency for one big one.
threadpoolctl is optional (the ``bench`` extra); without it the BLAS thread count is
unknown, assumed to be every core, and ``set_blas_threads`` raises. The gate is sized at
first use and by ``set_blas_threads`` only (asking threadpoolctl per product would cost
milliseconds): BLAS limits set around aiotensor leave it sized for the old count.
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

from .._errors import InvalidArgumentError

__all__ = ["BLAS_OPS", "Gated", "blas_threads", "gate_slots", "set_blas_threads"]

#: Ops whose kernels call BLAS and go through the gate when they run on the pool.
BLAS_OPS = frozenset({"matmul", "tensordot", "einsum"})

_CORES = os.cpu_count() or 1
_lock = threading.Lock()
_gate: threading.Semaphore | None = None  # created on first use, sized by _slots
_slots = 0
_limiter: Any = None  # the threadpoolctl limiter of set_blas_threads, kept alive


def _threadpoolctl() -> Any:
    # An optional dependency without type stubs: imported by name, typed as Any.
    try:
        return importlib.import_module("threadpoolctl")
    except ImportError:
        return None


def blas_threads() -> int | None:
    """Threads numpy's BLAS uses per product (the largest over its libraries), or None if unknown."""
    threadpoolctl = _threadpoolctl()
    if threadpoolctl is None:
        return None
    counts = [int(lib["num_threads"]) for lib in threadpoolctl.threadpool_info() if lib.get("user_api") == "blas"]
    return max(counts) if counts else None


def _size_gate(threads: int | None) -> None:
    global _gate, _slots
    _slots = max(1, _CORES // (threads or _CORES))
    _gate = threading.Semaphore(_slots)


def gate_slots() -> int:
    """How many BLAS products may run on the pool at once."""
    with _lock:
        if _gate is None:
            _size_gate(blas_threads())
        return _slots


def set_blas_threads(threads: int | None) -> None:
    """Set the threads each BLAS product uses, process-wide, and size the gate to match.

    ``None`` restores the BLAS library's own default. Products already running keep
    the gate they entered.

    Raises:
        InvalidArgumentError: ``threads`` is not a positive int or None, or
            threadpoolctl is not installed.
    """
    global _limiter
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads <= 0):
        raise InvalidArgumentError(f"set_blas_threads: threads must be a positive int or None, got {threads!r}")
    threadpoolctl = _threadpoolctl()
    if threadpoolctl is None:
        raise InvalidArgumentError("set_blas_threads needs threadpoolctl: pip install 'aiotensor[bench]'")
    with _lock:
        if _limiter is not None:
            _limiter.restore_original_limits()
            _limiter = None
        if threads is not None:
            _limiter = threadpoolctl.threadpool_limits(limits=threads, user_api="blas")
        _size_gate(blas_threads())


class Gated:
    """A kernel that holds a slot of the BLAS gate while it runs.

    A class rather than a closure so that it pickles (for backends that ship kernels).
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        gate = _gate
        if gate is None:
            gate_slots()
            gate = _gate
            assert gate is not None
        with gate:
            return self.fn(*args, **kwargs)
