"""The kernel of one batch: stack the callers' rows, run ``fn`` as a fused function does, split.

:class:`BatchKernel` runs where the kernel runs (a pool thread, or the loop when inline):
it stacks the rows, calls ``fn`` as a fused function does (its ``ops`` are fused ops
that recycle, see below), checks that every output has one row per input row and splits
them per caller, so the loop thread only registers finished buffers.

Recycled temporaries. A batch stacks many requests' rows, so its intermediates are large
(a (512, 512) float32 hidden layer is 1 MiB), and malloc gives such buffers back to the
system when they are freed. So the ops of a batched kernel take their outputs from the
interpreter's one :class:`~aiotensor._programs._recycler.Recycler`, which keeps the buffers of
dead intermediates per thread across batches (the stacking of the rows concatenates into
a kept buffer too):

* only element-wise numpy ufuncs with one output (``add``, ``multiply``, ``exp``, ...),
  ``matmul`` and ``relu``, called on arrays of at least one dimension (no Python or
  0-d scalars, whose value may pick the result dtype under numpy 1.x) and no keywords;
* only for outputs of at least ``MIN_BYTES`` (smaller ones come from malloc's bins at no cost);
* a buffer is kept only if nothing else refers to it when its value dies (no view of
  it, not a result), so no live array ever changes;
* the output's shape and dtype are learned from a first call with the same argument
  shapes and dtypes (the same ufunc gives the same result type for them);
* only buffers of a (shape, dtype) that such an op (or the stacking) has asked for are
  kept, at most two per pair;
* a caller alone whose earlier runs of that shape made no output of ``MIN_BYTES`` or
  more has nothing to stack or recycle: its run takes plain fused ops (their hot path).

Kept buffers are memory no session counts: at most ``CAP`` bytes per thread that
runs batched kernels (the pool's workers, and the event loop's thread for inline runs).
Values made from them are counted in the run's budget like any other intermediate.
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import _kernels
from .._errors import InvalidArgumentError
from .._kernels import SEQUENCES
from .._programs._interpreter import RECYCLER, Budget
from . import _batch_split
from ._batch_split import dtypes_of, in_two, plan
from ._fused_ops import FusedOps, unknown_op
from ._fused_value import FusedValue, _result, _wrap_arg

if TYPE_CHECKING:
    from .._engine._core import Engine
    from .._types import NDArray

__all__ = ["BatchKernel"]


class BatchKernel:
    """One batch as one kernel: stack the rows, call ``fn`` as a fused function does, split its outputs.

    Runs where the kernel runs (a pool thread, or the loop when inline); the split copies
    each caller's rows there, so the loop thread only registers finished buffers: a
    batch of several callers returns its pieces as a :class:`~aiotensor._kernels.KernelResult`
    of owned read-only copies, which the engine takes as they are.
    """

    __slots__ = (
        "aside",
        "big",
        "blas",
        "budget",
        "busy",
        "counts",
        "direct",
        "elapsed",
        "engine",
        "estimate",
        "fn",
        "free",
        "label",
        "loop_ident",
        "measure",
        "multi",
        "parts",
        "recycle",
        "whole_us",
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
        direct: list[bool] | None = None,
        whole_us: float = 0.0,
    ) -> None:
        self.fn = fn
        self.measure = measure  # sum the cost model over the ops (the first run for these shapes)
        self.engine = engine
        self.budget = budget
        self.counts = counts
        self.label = label
        self.elapsed = math.inf
        self.estimate = math.inf
        self.free = math.inf  # what of ``estimate`` runs without the GIL, net of transfers
        self.multi = False
        #: Whether ``fn`` called BLAS, and made outputs worth recycling; ``None``: not
        #: known from this run (it took plain fused ops).
        self.blas: bool | None = True
        self.big: bool | None = True
        # A caller alone whose earlier runs made no output worth recycling takes plain
        # fused ops (their hot path) instead: nothing to stack, nothing to recycle.
        self.recycle = recycle or len(counts) > 1
        # Per caller, whether its rows are set aside for its own session (``aside``: its
        # pieces by caller index) instead of returned, to be registered in the batch's.
        self.direct = direct
        self.aside: dict[int, list[_kernels.BufferInfo]] = {}
        # Splitting (``_batch_split``): the lesser µs of the last two one-part runs of such a
        # batch (0: do not split), the loop's thread (a run there stays one part), and what
        # was decided: the parts it ran in, and whether it was long enough but stayed one
        # part (no worker or core free, BLAS multi-threaded, or no cut on the row multiple).
        self.whole_us = whole_us
        self.loop_ident = _get_ident()
        self.parts = 1
        self.busy = False

    def __call__(self, xs: tuple[NDArray, ...], *params: Any) -> Any:
        start = time.perf_counter()
        whole = self.whole_us
        if whole and whole >= _batch_split.SPLIT_MIN_US and _get_ident() != self.loop_ident:
            # A large batch on a pool worker: in two parts while a core is free (_batch_split).
            how = plan(self.counts, dtypes_of(xs[0], params), self.engine, bool(self.blas))
            if how is None:
                self.busy = True
            else:
                return self._in_two(start, xs, params, *how)
        ops = FusedOps(self.engine, self.budget, self.measure, recycle=self.recycle)
        arrays, multi = self._outputs(ops, xs, self.counts, params, self.budget, len(xs) > 1)
        self.multi = multi
        if self.recycle:
            self.blas, self.big = ops._blas, ops._big
        else:
            self.blas = self.big = None
        if ops._estimate is not None:
            self.estimate = ops._estimate
            self.free = ops.free_us
        if len(xs) == 1:
            self.elapsed = (time.perf_counter() - start) * 1e6
            return arrays if multi else arrays[0]
        split = _split(arrays, self.counts)
        del arrays
        buffers = self._results(split)
        self.elapsed = (time.perf_counter() - start) * 1e6
        return _kernels.KernelResult(buffers, True)

    def _outputs(
        self,
        ops: FusedOps,
        xs: tuple[NDArray, ...],
        counts: list[int],
        params: tuple[Any, ...],
        budget: Budget,
        stack: bool,
    ) -> tuple[list[NDArray], bool]:
        # ``fn`` on the rows ``xs`` (stacked when ``stack``: its outputs are then split
        # per caller): its outputs, checked, and whether it returned several.
        # The stacked rows are made by this run: counted in its budget like an intermediate.
        rows = sum(counts)
        if not stack:
            x = FusedValue(xs[0], ops)
        else:
            x0 = xs[0]
            stacked = RECYCLER.take((rows, *x0.shape[1:]), x0.dtype)
            x = ops._made(np.concatenate(xs) if stacked is None else np.concatenate(xs, out=stacked), self.label)
        try:
            out = self.fn(ops, x, *[_wrap_arg(p, ops) for p in params])
        except AttributeError as exc:
            error = unknown_op(exc, ops)
            if error is exc:
                raise
            raise error from None
        del x
        multi = isinstance(out, SEQUENCES)
        outs = list(out) if multi else [out]
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
            if a.dtype.kind not in _kernels.NUMERIC_KINDS:  # (finalize's check, which split pieces skip)
                raise _kernels.BadOutputError(
                    f"kernel returned dtype {a.dtype}; tensors hold bool, integer, float or complex data"
                )
            if stack and made:
                budget.escaped -= 1  # split below: the whole output is an intermediate, its pieces the results
            arrays.append(a)
        return arrays, multi

    def _part(self, xs: tuple[NDArray, ...], params: tuple[Any, ...], lo: int, hi: int, budget: Budget) -> Any:
        # Callers ``lo:hi`` of a batch run in two parts: stacked, through ``fn``, split per
        # caller, on this thread's recycled buffers.
        counts = self.counts[lo:hi]
        ops = FusedOps(self.engine, budget, False, recycle=True)
        arrays, multi = self._outputs(ops, xs[lo:hi], counts, params, budget, True)
        return _split(arrays, counts), multi, ops._blas, ops._big

    def _in_two(
        self, start: float, xs: tuple[NDArray, ...], params: tuple[Any, ...], cut: int, spawn: Any
    ) -> _kernels.KernelResult:
        # The batch's callers in two parts, ``:cut`` here and ``cut:`` on a spawned worker.
        rows = sum(self.counts)
        first, second = in_two(functools.partial(self._part, xs, params), rows, cut, len(xs), spawn, self.budget)
        if first[1] != second[1] or len(first[0]) != len(second[0]):
            raise InvalidArgumentError(f"{self.label}: fn returned different outputs for parts of one batch")
        self.parts = 2
        self.multi = first[1]
        self.blas, self.big = first[2] or second[2], first[3] or second[3]
        buffers = self._results([a + b for a, b in zip(first[0], second[0], strict=True)])
        self.elapsed = (time.perf_counter() - start) * 1e6
        return _kernels.KernelResult(buffers, True)

    def _results(self, split: list[list[_kernels.BufferInfo]]) -> list[_kernels.BufferInfo]:
        # Per output, each caller's pieces: the buffers the engine registers, caller by
        # caller; those of callers of other sessions set aside (``aside``).
        buffers = split[0] if len(split) == 1 else [b for mine in zip(*split, strict=True) for b in mine]
        direct = self.direct
        if direct is not None:
            # The rows of callers of other sessions: set aside, registered in their own
            # sessions by the batch's task (never in the batch's session).
            k = len(split)
            kept: list[_kernels.BufferInfo] = []
            aside = self.aside
            for i, d in enumerate(direct):
                if d:
                    aside[i] = buffers[i * k : i * k + k]
                else:
                    kept += buffers[i * k : i * k + k]
            buffers = kept
        return buffers


def _split(arrays: list[NDArray], counts: list[int]) -> list[list[_kernels.BufferInfo]]:
    # Each caller's rows of each output, copied into an array of its own (a view would
    # keep the whole batch's output alive behind its session's back, and let one caller
    # reach another's rows through ``.base``), made read-only: what ``normalize`` would
    # make of them, without its per-array checks (done once per output).
    n = counts[0]
    if counts.count(n) == len(counts):  # callers of as many rows each: split in C loops
        return [_equal_pieces(a, len(counts), n) for a in arrays]
    return [_pieces(a, counts) for a in arrays]


_get_ident = threading.get_ident
_new_tuple = tuple.__new__  # BufferInfo(...) without the NamedTuple's __new__ (half the cost)
_copy = np.ndarray.copy
_setflags: Callable[[Any, bool], None] = np.ndarray.setflags  # type: ignore[assignment]  # (write= positional: numpy accepts it)


def _equal_pieces(a: NDArray, k: int, n: int) -> list[_kernels.BufferInfo]:
    # ``a``'s rows as k owned read-only arrays of n rows each: a 3-d view iterated, copied,
    # flagged and described by map (no bytecode per piece: half the cost of a loop).
    pieces = list(map(_copy, a.reshape(k, n, *a.shape[1:])))
    collections.deque(map(_setflags, pieces, itertools.repeat(False)), 0)  # (write=False; a methodcaller: 1.4x)
    p = pieces[0]
    shape, dtype, nbytes = itertools.repeat(p.shape), itertools.repeat(p.dtype), itertools.repeat(p.nbytes)
    return list(map(_new_tuple, itertools.repeat(_kernels.BufferInfo), zip(pieces, shape, dtype, nbytes, strict=False)))


def _pieces(a: NDArray, counts: list[int]) -> list[_kernels.BufferInfo]:
    # ``a``'s rows as owned read-only arrays of ``counts`` rows each.
    buffers = []
    lo = 0
    for n in counts:
        hi = lo + n
        piece = a[lo:hi].copy()
        piece.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
        buffers.append(_new_tuple(_kernels.BufferInfo, (piece, piece.shape, piece.dtype, piece.nbytes)))
        lo = hi
    return buffers
