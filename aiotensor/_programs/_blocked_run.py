"""The kernel of a run of element-wise ops: one pass per op in place, or cache-sized blocks.

:class:`BlockedRun` evaluates the ops of a run (``_blocked`` finds runs in a compiled
expression and makes each one step with this kernel). From :data:`BLOCK_FROM_ITEMS`
elements it walks the output in blocks of rows of about :data:`BLOCK_ITEMS` elements:
each op writes its block into a small cache-line-aligned scratch block (a chain then
runs in place there, in cache), buffers reused from op to op and from block to block,
and the last op writes into the result's block. Below it, a run that can compute in place
in its result alone is one block: each op once, over whole arrays. How the blocks of
inputs of given shapes and dtypes compute is their ``Layout`` (``_blocked_layout``).
Large runs on the pool share their blocks with the other workers and write into a
buffer the session's cache recycled (``_blocked_split``: ``SPLIT_MIN_BYTES``, and
``SPLIT_IDLE_MIN_BYTES`` in taller blocks while a core is free, ``with_pool``, the
backend's hook, ``result_buffer``). A run of correctly rounded float ops on one
dtype may instead be one compiled loop (``_blocked_jit``, with numba: the same values,
a non-finite one sending the run back here). A run may end with a ``sum``,
``mean``, ``max`` or ``min`` over its last axis: each block's rows are reduced into
the result's rows.

**Same values.** Every op is the same ufunc on operands of the same dtypes as the
op-by-op run (each buffer has the dtype the op-by-op intermediate would have:
:meth:`BlockedRun._dtypes` runs the ops once on 0-d probes, so NEP 50's rules for
Python scalars apply as they do op by op), on the same elements, so each element of
the result is bit for bit the op-by-op one. Inputs broadcast as numpy does: one whose
leading axis is the output's is sliced by rows, any other (a row vector, a scalar)
is read whole by every block; ops that read only whole inputs run once, not per block.

**Same errors and warnings.** Floating-point flags are recorded while blocks run
(``np.errstate(call=...)`` for each kind the caller does not ignore). When one is
raised, or anything fails, the blocked result is dropped and the run is evaluated
again op by op, which gives numpy's own warnings, ``errstate`` behaviour and errors
(naming the failing op, as the op-by-op program does). A one-block run calls each
ufunc once on whole arrays, so its warnings are numpy's as they come. Runs under
:data:`MIN_ITEMS` and shapes that do not block (0-d, empty) are evaluated op by op.

**Memory.** A run allocates its result and scratch blocks only (block-sized, at most
one per value alive at once, per participant), never a full-size intermediate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._errors import AioTensorError
from .._kernels import NUMERIC_KINDS, PARK_MAX_BYTES, PARKED, kernel_error, parked
from .._opdef import OpDef
from . import _blocked_split
from ._blocked_layout import Layout

__all__ = [
    "BLOCK_FROM_ITEMS",
    "BLOCK_ITEMS",
    "MIN_ITEMS",
    "BlockedRun",
    "settings",
]

#: Output elements per block (256 KiB of float32: a block and the input rows it reads
#: stay in the 1 MiB L2). Measured on the 10-op float32 chain at 2048x2048, ratio to
#: numpy's chain (``python -m benchmarks.bench_blocked --calibrate``): 4096 items 0.98x,
#: 16384 0.69x, 32768 0.43x, 65536 0.35x, 131072 0.33x (see docs/performance.md); with
#: calls interleaved (first quartile), 16384 to 131072 all within 0.30-0.34x.
BLOCK_ITEMS = 65536
#: Output elements from which a run is one step (below: the op-by-op program).
MIN_ITEMS = 1 << 16
#: Output elements from which a run is cut in blocks; below, a run that can compute in
#: place in its result alone is one block, each op once over the whole arrays. Measured
#: (``--calibrate``: variants interleaved call by call, first quartile, machine shared,
#: load 4-6), ratio to numpy's chain, blocks of 65,536 against one pass per op: 512x512
#: 0.71 / 0.73, 1024x1024 0.70 / 0.73, 2048x2048 0.30 / 0.33, 4096x4096 0.22 / 0.23;
#: again 0.68 / 0.71, 0.62 / 0.64, 0.34 / 0.62, 0.25 / 0.25; awaited at 1024x1024, blocks read
#: 0.81-0.90x against 0.86-0.92x in three A/B runs. A block's ops stay in L2.
BLOCK_FROM_ITEMS = 1 << 20

_ndarray = np.ndarray
_generic = np.generic


def settings() -> dict[str, int]:
    """The measured constants, for ``aiotensor info`` (and the misaligned chunks kept out of malloc now)."""
    return {
        "block_items": BLOCK_ITEMS,
        "min_items": MIN_ITEMS,
        "block_from_items": BLOCK_FROM_ITEMS,
        "split_min_bytes": _blocked_split.SPLIT_MIN_BYTES,
        "split_idle_min_bytes": _blocked_split.SPLIT_IDLE_MIN_BYTES,
        "split_block_items": _blocked_split.SPLIT_BLOCK_ITEMS,
        "split_wait_us": round(_blocked_split.START_WAIT_S * 1e6),
        "parked_bytes": parked(),
        "parked_max_bytes": PARKED * PARK_MAX_BYTES,
    }


class BlockedRun:
    """The kernel of a run: ``ops`` (op, argument indices) over ``nin`` inputs and ``consts``.

    Argument index ``i`` names input ``i`` (``i < nin``), constant ``i - nin``, or the
    result of op ``i - nin - len(consts)``. The last op is the run's result.
    """

    __slots__ = ("_last", "_memo", "consts", "nin", "ops", "reduce", "ufuncs")

    def __init__(
        self,
        ops: tuple[tuple[OpDef, tuple[int, ...]], ...],
        nin: int,
        consts: tuple[Any, ...],
        reduce: tuple[OpDef, dict[str, Any]] | None = None,
    ) -> None:
        self.ops = ops
        self.nin = nin
        self.consts = consts
        #: A reduction (``sum``, ``mean``, ``max``, ``min``: op, its keyword args) of the last
        #: op's value, which the run then returns; blocked over its last axis only.
        self.reduce = reduce
        self.ufuncs: list[Any] = [d.kernel_for(np) for d, _ in ops]
        self._memo: dict[Any, Layout | None] = {}  # by the inputs' shapes and dtypes
        #: The last layout found for one input array: (shape, dtype, layout), or None.
        self._last: tuple[tuple[int, ...], Any, Layout] | None = None

    def __reduce__(self) -> tuple[type[BlockedRun], tuple[Any, ...]]:
        return BlockedRun, (self.ops, self.nin, self.consts, self.reduce)

    # -- op by op: small runs, and the reference for errors and warnings -----------------
    def op_by_op(self, inputs: tuple[Any, ...]) -> Any:
        """The run as the op-by-op program computes it (numpy's values, warnings and errors)."""
        vals = [*inputs, *self.consts]
        for (d, args), ufunc in zip(self.ops, self.ufuncs, strict=True):
            a = [vals[i] for i in args]
            try:
                vals.append(ufunc(*a))
            except Exception as exc:
                error = kernel_error(d.name, tuple(a), exc, False)
                raise error from error.__cause__
        if self.reduce is None:
            return vals[-1]
        d, kwargs = self.reduce
        try:
            return d.kernel_for(np)(vals[-1], **kwargs)
        except Exception as exc:
            error = kernel_error(d.name, (vals[-1],), exc, False)
            raise error from error.__cause__

    def _dtypes(self, inputs: tuple[Any, ...]) -> list[np.dtype[Any]] | None:
        # Each op's output dtype, from a run on 0-d probes (numpy 2 types a 0-d array as
        # its dtype, like any array); None when that run fails (op by op raises then).
        vals: list[Any] = [np.zeros((), x.dtype) if type(x) is _ndarray else x for x in inputs]
        vals += self.consts
        found: list[np.dtype[Any]] = []
        try:
            with np.errstate(all="ignore"):
                for (_, args), ufunc in zip(self.ops, self.ufuncs, strict=True):
                    out = ufunc(*[vals[i] for i in args])
                    vals.append(out)
                    found.append(out.dtype)
        except Exception:
            return None
        return found

    # -- blocked -------------------------------------------------------------------------
    def __call__(self, xp: Any, *inputs: Any, again: Callable[[], tuple[Any, ...]] | None = None) -> Any:
        # ``again``: the inputs anew, for the op-by-op fallback, when the result's buffer
        # is one of them (``_blocked_center``: the blocked attempt may have written over it).
        last = self._last
        x = inputs[0] if len(inputs) == 1 else None
        if last is not None and type(x) is _ndarray and x.dtype is last[1] and x.shape == last[0]:
            # A formula of one tensor evaluated again on the same shape (a loop): its layout
            # without building and hashing the memo's key (~0.2 µs of a 256x256 chain's await).
            layout: Layout | None = last[2]
        else:
            try:
                if x is not None:  # (a formula of one tensor: the same key, without the generator)
                    key: Any = ((x.shape, x.dtype, type(x) is _ndarray),)
                else:
                    key = tuple((x.shape, x.dtype, type(x) is _ndarray) for x in inputs)
            except AttributeError:  # not arrays: op by op says what numpy makes of them
                return self.op_by_op(inputs)
            layout = self._memo.get(key, _UNSEEN)
            if layout is _UNSEEN:
                layout = self._layout(inputs)
                if len(self._memo) >= 64:
                    self._memo.clear()
                self._memo[key] = layout
            if layout is not None and x is not None and type(x) is _ndarray:
                self._last = (x.shape, x.dtype, layout)
        if layout is None:
            return self.op_by_op(inputs)
        flagged: list[str] = []
        try:
            out = layout.run(inputs, flagged)
        except AioTensorError:  # an op of a one-block run failed: its error, as op by op
            raise
        except Exception:  # op by op raises numpy's own error, naming its op
            return self.op_by_op(inputs if again is None else again())
        if flagged:  # numpy's warnings (or errors), as the caller's errstate says
            return self.op_by_op(inputs if again is None else again())
        return out

    def _layout(self, inputs: tuple[Any, ...]) -> Layout | None:
        shapes: list[tuple[int, ...]] = []
        for x in inputs:
            if (type(x) is not _ndarray and not isinstance(x, _generic)) or x.dtype.kind not in NUMERIC_KINDS:
                return None
            shapes.append(x.shape)
        try:
            oshape = np.broadcast_shapes(*shapes)
        except ValueError:
            return None
        size = math.prod(oshape)
        if not oshape or size < MIN_ITEMS:
            return None
        rows = oshape[0]
        dtypes = self._dtypes(inputs)
        if dtypes is None:
            return None
        sliced = [len(s) == len(oshape) and s[0] == rows for s in shapes]
        h = min(rows, max(1, BLOCK_ITEMS // (size // rows)))
        dtypes = [*[x.dtype for x in inputs], *dtypes]  # (every array value's dtype, the inputs' first)
        if self.reduce is not None:  # blocks (no full-size value), if numpy reduces each row alone
            return Layout(self, shapes, sliced, oshape, h, dtypes) if _rowwise(self.reduce, oshape, dtypes) else None
        if size < BLOCK_FROM_ITEMS:
            whole = Layout(self, shapes, sliced, oshape, rows, dtypes)
            if not whole.scratch:  # in place in the result alone (else: blocks, so scratch stays small)
                return whole
        return Layout(self, shapes, sliced, oshape, h, dtypes)


#: A layout not made yet (``None`` in the memo: the run goes op by op on those inputs).
_UNSEEN: Any = object()


def _rowwise(reduce: tuple[OpDef, dict[str, Any]], oshape: tuple[int, ...], dtypes: list[np.dtype[Any]]) -> bool:
    # Over the last axis of two or more: numpy reduces each row on its own (pairwise
    # sums along the contiguous row), so rows of a block give the same values. Sums and
    # means of float32 and float64 only: numpy accumulates other dtypes in another one.
    d, kwargs = reduce
    axis = kwargs.get("axis")
    axis = axis[0] if type(axis) is tuple else axis
    if len(oshape) < 2 or axis not in (-1, len(oshape) - 1):
        return False
    return dtypes[-1].kind in "biuf" if d.name in ("max", "min") else dtypes[-1] in _FLOATS


_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})
