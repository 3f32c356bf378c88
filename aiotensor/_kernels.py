"""What every backend does around a kernel: normalize its outputs into owned, read-only buffers.

This runs where the kernel runs (a pool thread locally, a worker process on Dask), so
that shape, dtype and size are known without moving data back to the caller.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from ._types import NDArray

__all__ = ["BadOutputError", "BufferInfo", "KernelResult", "finalize", "run_kernel"]

#: dtype kinds a tensor may hold: bool, signed and unsigned ints, floats, complex.
NUMERIC_KINDS = frozenset("biufc")


class BadOutputError(TypeError):
    """A kernel returned something that cannot be a tensor (mapped to InvalidArgumentError)."""


class BufferInfo(NamedTuple):
    """A buffer a backend produced, with the metadata a handle needs."""

    handle: Any
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    nbytes: int


class KernelResult(NamedTuple):
    """The buffers one kernel produced; ``multi`` if it returned a tuple or list."""

    buffers: list[BufferInfo]
    multi: bool


def finalize(value: Any) -> NDArray:
    """Turn a kernel output into a buffer the registry can own.

    The buffer must own its memory (a view would keep another, maybe much larger,
    buffer alive behind the registry's back, and an input returned as-is would be
    owned twice) and is made read-only so no holder can change a tensor.
    """
    if type(value) is np.ndarray:
        arr = value
    elif isinstance(value, np.ma.MaskedArray):
        # Its data under the mask is arbitrary: keeping it would show (or compute on)
        # values the kernel meant to hide, and a MaskedArray buffer breaks later ops.
        raise BadOutputError("kernel returned a MaskedArray; return a plain ndarray (e.g. .filled(value))")
    elif isinstance(value, np.ndarray):
        # A subclass (matrix, memmap, ...) would change how later kernels treat the
        # buffer (np.matrix.sum has no keepdims), or keep a file mapped: a plain copy.
        arr = value.view(np.ndarray).copy()
    elif isinstance(value, np.generic | int | float | complex | bool):
        arr = np.asarray(value)
    else:
        raise BadOutputError(f"kernel returned {type(value).__name__}; expected an ndarray or a tuple of ndarrays")
    if arr.dtype.kind not in NUMERIC_KINDS:
        raise BadOutputError(f"kernel returned dtype {arr.dtype}; tensors hold bool, integer, float or complex data")
    if not (arr.flags.owndata and arr.flags.writeable):
        arr = arr.copy()
    arr.flags.writeable = False
    return arr


def info(arr: NDArray) -> BufferInfo:
    """The :class:`BufferInfo` of a local array."""
    return BufferInfo(arr, arr.shape, arr.dtype, arr.nbytes)


def run_kernel(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> KernelResult:
    """Call ``fn`` and normalize what it returns (on the thread or worker that runs it)."""
    out = fn(*args, **kwargs)
    if isinstance(out, tuple | list):
        if not out:
            raise BadOutputError("kernel returned an empty sequence; expected at least one ndarray")
        return KernelResult([info(finalize(o)) for o in out], True)
    return KernelResult([info(finalize(out))], False)
