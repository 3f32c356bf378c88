"""Large element-wise ops split in row chunks across the pool's workers, into one output.

The local backend wraps the kernel of an element-wise op (an op whose ``OpDef.ufunc``
is set: one ufunc over its data arguments; no keyword argument but the ``out=`` of a
buffer the session recycles) in :class:`Split` when one of its inputs is large. On
the worker, :class:`Split` learns the output's shape and dtype
(``_ufuncs.ufunc_result``) and, from :data:`MIN_BYTES` of output on, runs
:func:`~aiotensor._backends._chunked.chunked_ufunc` with the pool's ``spawn``; below it, the
one ufunc call it always was. The result is element for element numpy's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._kernels import as_numeric
from .._types import NDArray
from .._ufuncs import ufunc_result
from ._chunked import CHUNK_MIN_BYTES, Spawn, chunked_ufunc, should_chunk

__all__ = ["Split", "large_enough"]

_ndarray = np.ndarray

#: Output bytes from which an op is split (read at each call, so that tests can lower it).
MIN_BYTES = CHUNK_MIN_BYTES


def large_enough(args: tuple[Any, ...]) -> bool:
    """Whether an element-wise op on ``args`` may be worth splitting (cheap: on the loop thread).

    An input of ``MIN_BYTES / 8`` may give an output worth splitting: a float64
    comparison's bool output has 1/8 of its input's bytes (outputs larger than every
    input, by broadcasting, are not looked for).
    """
    least = MIN_BYTES >> 3
    return any(type(a) is _ndarray and a.nbytes >= least for a in args)


class Split:
    """An element-wise op's kernel (a ``Step``), split across workers when its output is large."""

    __slots__ = ("spawn", "step", "ufunc", "workers")

    def __init__(self, step: Callable[..., Any], ufunc: Any, spawn: Spawn, workers: int) -> None:
        self.step = step
        self.ufunc = ufunc
        self.spawn = spawn
        self.workers = workers

    def __call__(self, *args: Any, out: NDArray | None = None) -> Any:
        checked: int = getattr(self.step, "checked", 0)
        if checked:  # what the Step checks: its data arguments are numbers or numeric arrays
            args = (*[as_numeric(a) for a in args[:checked]], *args[checked:])
        ufunc, workers = self.ufunc, self.workers
        if out is not None:  # a recycled buffer of the result's shape and dtype (the engine checked)
            if should_chunk(out.nbytes, out.shape, workers, MIN_BYTES):
                return chunked_ufunc(ufunc, *args, spawn=self.spawn, workers=workers, out=out)
            return ufunc(*args, out=out)
        spec = ufunc_result(ufunc, args)
        if spec is not None:
            shape, dtype = spec
            if should_chunk(math.prod(shape) * dtype.itemsize, shape, workers, MIN_BYTES):
                out = np.empty(shape, dtype)
                return chunked_ufunc(ufunc, *args, spawn=self.spawn, workers=workers, out=out)
        return ufunc(*args)

    @property
    def __name__(self) -> str:  # how backends name the task
        return str(getattr(self.step, "__name__", "split"))
