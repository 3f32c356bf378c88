"""The kernel of one batch: stack the callers' rows, run ``fn`` with recycled temporaries, split.

:class:`BatchKernel` runs where the kernel runs (a pool thread, or the loop when inline):
it stacks the rows, calls ``fn`` as a fused function does (its ``ops`` are
:class:`RecyclingOps`), checks that every output has one row per input row and splits
them per caller, so the loop thread only registers finished buffers.

Recycled temporaries: the ops of batched kernels write into buffers of dead intermediates.

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
  shapes and dtypes (the same ufunc gives the same result type for them);
* only buffers of a (shape, dtype) that such an op (or the stacking of the rows, which
  concatenates into a kept buffer too) has asked for are kept, at most two per pair;
* a caller alone whose earlier runs of that shape made no output of ``MIN_BYTES`` or
  more has nothing to stack or recycle: its run takes plain fused ops (their hot path).

Kept buffers are memory no session counts: at most :data:`CAP` bytes per thread that
runs batched kernels (the pool's workers, and the event loop's thread for inline runs).
Values made from them are counted in the run's budget like any other intermediate.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import SEQUENCES
from .._opdef import OPS, OpDef
from .._ops._elementwise import relu_into
from .._program import Budget
from ._function import FusedOps, FusedValue, _MadeValue, _result, _wrap_arg, unknown_op

if TYPE_CHECKING:
    from .._engine import Engine
    from .._types import NDArray

__all__ = ["CAP", "MIN_BYTES", "BatchKernel", "RecyclingOps", "take"]

#: Bytes of dead intermediates kept per thread at most (the loop's and each worker's:
#: a web service's resident set after a load grows by up to this much per thread).
CAP = 4 * 1024 * 1024
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
_PER_SPEC = 2  # buffers kept per (shape, dtype) at most: a kernel needs one or two of each


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

    __slots__ = ("big", "blas")

    def __init__(self, engine: Engine, budget: Budget, measure: bool = True) -> None:
        super().__init__(engine, budget, measure)
        self.blas = False
        self.big = False  # an output of MIN_BYTES or more was recycled or learned: recycling pays

    def _run(self, d: OpDef, *args: Any, **kwargs: Any) -> Any:
        if d.blas:
            self.blas = True
        return super()._run(d, *args, **kwargs)

    def _call(self, d: OpDef, kernel: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any] | None) -> Any:
        relu = d is _RELU
        if kw or self._engine._xp is not np or not (relu or (type(kernel) is _ufunc and kernel.nout == 1)):
            return kernel(*args, **kw) if kw else kernel(*args)
        key: tuple[Any, ...] = (d.name,)
        for a in args:
            if type(a) is not _ndarray or not a.ndim:
                return kernel(*args)
            key += (a.shape, a.dtype)
        spec = _specs.get(key)
        if spec is not None:
            self.big = True
            buf = take(*spec)
            if buf is None:
                return kernel(*args)
            if relu:
                return relu_into(args[0], buf)
            return kernel(*args, out=buf)
        out = kernel(*args)
        if type(out) is _ndarray and out.nbytes >= MIN_BYTES:
            if len(_specs) >= _SPECS_MAX:
                _specs.clear()
            _specs[key] = (out.shape, out.dtype)
            _wanted.add((out.shape, out.dtype))
            self.big = True
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

    _MadeValue(np.empty(1), Probe(cast(Any, None), Budget("probe")))  # dropped at once
    return seen[0]


_ALONE = _alone()


class BatchKernel:
    """One batch as one kernel: stack the rows, call ``fn`` as a fused function does, split its outputs.

    Runs where the kernel runs (a pool thread, or the loop when inline); the split copies
    each caller's rows there, so the loop thread only registers finished buffers.
    """

    __slots__ = (
        "big",
        "blas",
        "budget",
        "counts",
        "elapsed",
        "engine",
        "estimate",
        "fn",
        "label",
        "measure",
        "multi",
        "recycle",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        engine: Engine,
        budget: Budget,
        counts: list[int],
        label: str,
        measure: bool = True,
        recycle: bool = True,
    ) -> None:
        self.fn = fn
        self.measure = measure  # sum the cost model over the ops (the first run for these shapes)
        self.engine = engine
        self.budget = budget
        self.counts = counts
        self.label = label
        self.elapsed = math.inf
        self.estimate = math.inf
        self.multi = False
        #: Whether ``fn`` called BLAS, and made outputs worth recycling; ``None``: not
        #: known from this run (it took plain fused ops).
        self.blas: bool | None = True
        self.big: bool | None = True
        # A caller alone whose earlier runs made no output worth recycling takes plain
        # fused ops (their hot path) instead: nothing to stack, nothing to recycle.
        self.recycle = recycle or len(counts) > 1

    def __call__(self, xs: tuple[NDArray, ...], *params: Any) -> Any:
        start = time.perf_counter()
        ops = (
            RecyclingOps(self.engine, self.budget, self.measure)
            if self.recycle
            else FusedOps(self.engine, self.budget, self.measure)
        )
        # The stacked rows are made by this run: counted in its budget like an intermediate.
        if len(xs) == 1:
            x = FusedValue(xs[0], ops)
        else:
            x0 = xs[0]
            stacked = take((sum(self.counts), *x0.shape[1:]), x0.dtype)
            x = ops._made(np.concatenate(xs) if stacked is None else np.concatenate(xs, out=stacked), self.label)
        try:
            out = self.fn(ops, x, *[_wrap_arg(p, ops) for p in params])
        except AttributeError as exc:
            error = unknown_op(exc, ops)
            if error is exc:
                raise
            raise error from None
        del x
        self.multi = multi = isinstance(out, SEQUENCES)
        outs = list(out) if multi else [out]
        rows = sum(self.counts)
        budget = self.budget
        arrays = []
        for i, o in enumerate(outs):
            made = isinstance(o, FusedValue) and o._made
            a = _result(o, budget)
            if type(a) is not np.ndarray or not a.ndim or a.shape[0] != rows:
                shape = getattr(a, "shape", type(a).__name__)
                raise InvalidArgumentError(
                    f"{self.label}: fn must return arrays with one row per input row ({rows} rows along axis 0);"
                    f" output {i} is {shape}"
                )
            if len(xs) > 1 and made:
                budget.escaped -= 1  # split below: the whole output is an intermediate, its pieces the results
            arrays.append(a)
        del out, outs
        if type(ops) is RecyclingOps:
            self.blas, self.big = ops.blas, ops.big
        else:
            self.blas = self.big = None
        if ops._estimate is not None:
            self.estimate = ops._estimate
        if len(xs) == 1:
            pieces: list[NDArray] = arrays
        else:
            pieces = []
            lo = 0
            for n in self.counts:
                pieces.extend(a[lo : lo + n] for a in arrays)  # views: the result normalization copies them
                lo += n
        self.elapsed = (time.perf_counter() - start) * 1e6
        return pieces if multi or len(xs) > 1 else pieces[0]
