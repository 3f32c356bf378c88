"""Recycled temporaries: the ops of batched kernels write into buffers of dead intermediates.

A batch stacks many requests' rows, so its intermediates are large (a (512, 512) float32
hidden layer is 1 MiB). glibc's malloc serves such sizes with fresh pages and gives
them back to the system when they are freed (``mmap``, or trimming the top of a heap),
so every run page-faults on all of them again: measured here, that doubled the run
time of a (512, 64) -> 512 -> 10 MLP (0.9 ms to 2 ms). So, as numpy elides temporaries
in ``a + b + c``, the kernels of batched functions keep the buffers of their dead
intermediates, per thread, and hand them to later ops as ``out=``:

* only element-wise numpy ufuncs with one output (``add``, ``multiply``, ``exp``, ...),
  ``matmul`` and ``relu``, called on arrays of at least one dimension (no Python or
  0-d scalars, whose value may pick the result dtype under numpy 1.x) and no keywords;
* only for outputs of at least 64 KiB (smaller ones come from malloc's bins at no cost);
* a buffer is kept only if nothing else refers to it when its value dies (no view of
  it, not a result), so no live array ever changes;
* the output's shape and dtype are learned from a first call with the same argument
  shapes and dtypes (the same ufunc gives the same result type for them).

Kept buffers are memory no session counts: at most :data:`CAP` bytes per thread that
runs batched kernels (the pool's workers, and the event loop's thread for inline runs).
Values made from them are counted in the run's budget like any other intermediate.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ._function import FusedOps, FusedValue
from ._opdef import OPS, OpDef
from ._program import Budget

if TYPE_CHECKING:
    from ._types import NDArray

__all__ = ["CAP", "MIN_BYTES", "RecyclingOps", "take"]

#: Bytes of dead intermediates kept per thread at most.
CAP = 32 * 1024 * 1024
#: Outputs smaller than this are never recycled.
MIN_BYTES = 64 * 1024

_RELU = OPS["relu"]
_ndarray = np.ndarray
_ufunc = np.ufunc
_getrefcount = sys.getrefcount


class _Kept(threading.local):
    def __init__(self) -> None:
        self.free: dict[tuple[Any, ...], list[NDArray]] = {}
        self.nbytes = 0


_kept = _Kept()
_specs: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # (op, argument shapes and dtypes) -> (shape, dtype)
_wanted: set[tuple[Any, ...]] = set()  # the (shape, dtype) of outputs recycled buffers may serve
_SPECS_MAX = 4096
_PER_SPEC = 8  # buffers kept per (shape, dtype) at most


def take(shape: tuple[int, ...], dtype: np.dtype[Any]) -> NDArray | None:
    """A kept buffer of this shape and dtype (writeable, garbage inside), or None; marks the pair as wanted."""
    spec = (shape, dtype)
    free = _kept.free.get(spec)
    if not free:
        if len(_wanted) >= _SPECS_MAX:
            _wanted.clear()
        _wanted.add(spec)
        return None
    buf = free.pop()
    _kept.nbytes -= buf.nbytes
    buf.flags.writeable = True
    return buf


class RecyclingOps(FusedOps):
    """The ``ops`` of a batched kernel: fused ops that recycle dead intermediates, noting BLAS use."""

    __slots__ = ("blas",)

    def __init__(self, engine: Any, budget: Budget) -> None:  # an Engine
        super().__init__(engine, budget)
        self.blas = False

    def _run(self, d: OpDef, *args: Any, **kwargs: Any) -> Any:
        if d.blas:
            self.blas = True
        return super()._run(d, *args, **kwargs)

    def _call(self, d: OpDef, args: tuple[Any, ...], kw: dict[str, Any]) -> Any:
        kernel = d.kernel_for(np)
        relu = d is _RELU
        if kw or self._engine._xp is not np or not (relu or (type(kernel) is _ufunc and kernel.nout == 1)):
            return kernel(*args, **kw)
        key: tuple[Any, ...] = (d.name,)
        for a in args:
            if type(a) is not _ndarray or not a.ndim:
                return kernel(*args)
            key += (a.shape, a.dtype)
        spec = _specs.get(key)
        if spec is not None:
            buf = take(*spec)
            if buf is None:
                return kernel(*args)
            if relu:
                x = args[0]
                return np.maximum(x, x.dtype.type(0), out=buf)
            return kernel(*args, out=buf)
        out = kernel(*args)
        if type(out) is _ndarray and out.nbytes >= MIN_BYTES:
            if len(_specs) >= _SPECS_MAX:
                _specs.clear()
            _specs[key] = (out.shape, out.dtype)
            _wanted.add((out.shape, out.dtype))
        return out

    def _dead(self, arr: NDArray) -> None:
        super()._dead(arr)
        nbytes = arr.nbytes
        # Kept only if this call's own references are all that hold it (no view, not a result).
        if nbytes < MIN_BYTES or _kept.nbytes + nbytes > CAP or _getrefcount(arr) > _ALONE:
            return
        spec = (arr.shape, arr.dtype)
        if spec in _wanted:
            free = _kept.free.setdefault(spec, [])
            if len(free) < _PER_SPEC:
                free.append(arr)
                _kept.nbytes += nbytes


def _alone() -> int:
    # The reference count _dead sees for an array held by nothing but the dying value,
    # measured through the same call path (it differs between Python versions).
    seen: list[int] = []

    class Probe(FusedOps):
        __slots__ = ()

        def _dead(self, arr: NDArray) -> None:
            seen.append(_getrefcount(arr))

    FusedValue(np.empty(1), Probe(cast(Any, None), Budget("probe")), True)  # dropped at once
    return seen[0]


_ALONE = _alone()
