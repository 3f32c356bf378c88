"""The kernel of a run of element-wise ops: one pass per op in place, or cache-sized blocks.

:class:`BlockedRun` evaluates the ops of a run (``_blocked`` finds runs in a compiled
expression and makes each one step with this kernel). From :data:`BLOCK_FROM_ITEMS`
elements it walks the output in blocks of rows of about :data:`BLOCK_ITEMS` elements:
each op writes its block into a small cache-line-aligned scratch block (a chain then
runs in place there, in cache), buffers reused from op to op and from block to block,
and the last op writes into the result's block. Below it, a run that can compute in place
in its result alone is one block: each op once, over whole arrays. Large runs on the
pool share their blocks with the other workers (:data:`SPLIT_MIN_BYTES`, through
:func:`with_pool`, the backend's hook), and write into a buffer the session's cache
recycled (:func:`result_buffer`). A run may end with a ``sum``, ``mean``, ``max`` or
``min`` over its last axis: each block's rows are reduced into the result's rows.

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

import contextvars
import functools
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from .._backends._chunked import Spawn, _Blocks
from .._errors import AioTensorError
from .._kernels import NUMERIC_KINDS, kernel_error
from .._opdef import OpDef
from ._blocked_var import aligned_empty

__all__ = [
    "BLOCK_FROM_ITEMS",
    "BLOCK_ITEMS",
    "MIN_ITEMS",
    "SPLIT_MIN_BYTES",
    "BlockedRun",
    "result_buffer",
    "settings",
    "with_pool",
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
#: Output bytes from which a blocked run on the pool shares its blocks with the other
#: workers. Measured (``--calibrate --only-split``, split time / one worker, blocks):
#: 1 MiB 1.07-1.15, 4 MiB 0.93-1.12, 16 MiB 0.90-0.99, 32 MiB 0.80-0.91, 64 MiB 0.74-0.81;
#: again under heavier load (4-6, first quartile): 1 MiB 1.19, 4 MiB 1.09, 8 MiB 1.03,
#: 16 MiB 1.04, 32 MiB 1.05. It pays only when the other core is free.
SPLIT_MIN_BYTES = 32 << 20
#: Output bytes per part handed to a participant of a split run.
_PART_BYTES = 4 << 20

_ndarray = np.ndarray
_generic = np.generic
#: The pool a kernel running on a worker may hand blocks to: (spawn, workers); set by :class:`_WithSpawn`.
_POOL: contextvars.ContextVar[tuple[Spawn, int] | None] = contextvars.ContextVar("aiotensor_blocked_pool", default=None)
#: A recycled buffer the run that makes an array of its shape and dtype writes into (then None).
_OUT: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("aiotensor_blocked_out", default=None)


def settings() -> dict[str, int]:
    """The measured constants, for ``aiotensor info``."""
    return {
        "block_items": BLOCK_ITEMS,
        "min_items": MIN_ITEMS,
        "block_from_items": BLOCK_FROM_ITEMS,
        "split_min_bytes": SPLIT_MIN_BYTES,
    }


class BlockedRun:
    """The kernel of a run: ``ops`` (op, argument indices) over ``nin`` inputs and ``consts``.

    Argument index ``i`` names input ``i`` (``i < nin``), constant ``i - nin``, or the
    result of op ``i - nin - len(consts)``. The last op is the run's result.
    """

    __slots__ = ("_memo", "consts", "nin", "ops", "reduce", "ufuncs")

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
        self._memo: dict[Any, _Layout | None] = {}  # by the inputs' shapes and dtypes

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
        try:
            key = tuple((x.shape, x.dtype, type(x) is _ndarray) for x in inputs)
        except AttributeError:  # not arrays: op by op says what numpy makes of them
            return self.op_by_op(inputs)
        if key in self._memo:
            layout = self._memo[key]
        else:
            layout = self._layout(inputs)
            if len(self._memo) >= 64:
                self._memo.clear()
            self._memo[key] = layout
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

    def _layout(self, inputs: tuple[Any, ...]) -> _Layout | None:
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
            return _Layout(self, shapes, sliced, oshape, h, dtypes) if _rowwise(self.reduce, oshape, dtypes) else None
        if size < BLOCK_FROM_ITEMS:
            whole = _Layout(self, shapes, sliced, oshape, rows, dtypes)
            if not whole.scratch:  # in place in the result alone (else: blocks, so scratch stays small)
                return whole
        return _Layout(self, shapes, sliced, oshape, h, dtypes)


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
_REDUCERS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


class _Layout:
    """A run on inputs of given shapes and dtypes: block shapes, scratch buffers, ops hoisted out of the loop."""

    __slots__ = (
        "h",
        "hoisted",
        "loop",
        "oshape",
        "out_dtype",
        "reducer",
        "rshape",
        "run_",
        "scratch",
        "sliced",
        "template",
        "whole",
    )

    def __init__(
        self,
        run: BlockedRun,
        in_shapes: list[tuple[int, ...]],
        sliced: list[bool],
        oshape: tuple[int, ...],
        h: int,
        all_dtypes: list[np.dtype[Any]],
    ) -> None:
        self.run_ = run
        dtypes = all_dtypes[run.nin :]  # the ops' values' dtypes
        self.oshape = oshape
        self.h = h
        self.sliced = [i for i, s in enumerate(sliced) if s]
        nconst = len(run.consts)
        nbase = run.nin + nconst
        n = len(run.ops)
        # Whether each value varies by block (reads a sliced input), and its block shape.
        varies = [*sliced, *([False] * nconst)]
        shapes = [(h, *sh[1:]) if s else sh for sh, s in zip(in_shapes, sliced, strict=True)]
        shapes += [()] * nconst
        for _, args in run.ops:
            varies.append(any(varies[i] for i in args))
            shapes.append(np.broadcast_shapes(*[shapes[i] for i in args]))
        last_use = {}
        for k, (_, args) in enumerate(run.ops):
            for i in args:
                last_use[i] = k
        self.out_dtype = dtypes[-1]
        #: With a trailing reduction: (ufunc whose reduce it is, keepdims, count to divide by
        #: for a mean or 0), and the result's shape; else None and the run's shape.
        self.reducer: tuple[Any, bool, int] | None = None
        self.rshape = oshape
        if run.reduce is not None:
            d, kwargs = run.reduce
            keep = bool(kwargs.get("keepdims", False))
            self.reducer = (_REDUCERS[d.name], keep, oshape[-1] if d.name == "mean" else 0)
            self.rshape = (*oshape[:-1], 1) if keep else oshape[:-1]
        self.template: list[Any] = [None] * run.nin + [*run.consts] + [None] * n
        typed = _typed_constants(run, all_dtypes, self.template)
        # Ops on whole inputs alone (``std + 1e-8``): once per call, not per block.
        self.hoisted = [(run.ufuncs[k], typed[k], nbase + k) for k in range(n) if not varies[nbase + k]]
        # The loop: (ufunc, args, scratch index or -1 for the result's block, value slot)
        # per op that varies. Ops whose values do not overlap in time share a buffer (an
        # op may write over an input that dies there: same shape and dtype, in place).
        # In blocks, only the last op writes into the result's block: the others write
        # into 64-byte-aligned scratch blocks (a chain runs in place in one of them, in
        # cache). The result's buffer, recycled or fresh, is mostly only 16-byte aligned
        # (malloc), and ten ops storing into it there ran ~10% slower (1024x1024: 0.77x
        # numpy's chain against 0.70x into aligned scratch). One block (the whole rows)
        # runs in place in the result itself (-1), taken first: no full-size scratch.
        one_block = h >= oshape[0]
        free: dict[Any, list[int]] = {((h, *oshape[1:]), dtypes[-1]): [-1]} if one_block and not self.reducer else {}
        buf_of: dict[int, int] = {}
        self.loop: list[tuple[Any, tuple[int, ...], int, int]] = []
        self.scratch: list[tuple[tuple[int, ...], np.dtype[Any]]] = []
        for k, (_, args) in enumerate(run.ops):
            slot = nbase + k
            if not varies[slot]:
                continue
            for i in set(args):
                if i in buf_of and last_use.get(i) == k:
                    free.setdefault((shapes[i], dtypes[i - nbase]), []).append(buf_of[i])
            if k == n - 1 and not self.reducer:
                self.loop.append((run.ufuncs[k], typed[k], -1, slot))
                continue
            spec = (shapes[slot], dtypes[k])
            pool = free.get(spec)
            if pool:
                buf = pool.pop()
            else:
                buf = len(self.scratch)
                self.scratch.append(spec)
            buf_of[slot] = buf
            self.loop.append((run.ufuncs[k], typed[k], buf, slot))
        #: One block (the run's rows at once, no reduction): per op, for _whole, its ufunc,
        #: arguments and buffer (-1: the result, -2: none, hoisted); else None.
        self.whole: list[tuple[Any, tuple[int, ...], int]] | None = None
        if h >= oshape[0] and not self.reducer:
            self.whole = [
                (run.ufuncs[k], typed[k], buf_of.get(nbase + k, -1 if varies[nbase + k] else -2)) for k in range(n)
            ]

    def run(self, inputs: tuple[Any, ...], flagged: list[str]) -> Any:
        """The result, computed in blocks; floating-point flags raised go to ``flagged``."""
        vals = list(self.template)
        vals[: len(inputs)] = inputs
        holder = _OUT.get()
        out = holder[0] if holder else None
        if out is not None and out.shape == self.rshape and out.dtype == self.out_dtype:
            holder[0] = None  # type: ignore[index]
        else:
            out = np.empty(self.rshape, self.out_dtype)
        if self.whole is not None:  # one block: each op once, as op by op (numpy's own warnings)
            self._whole(vals, out)
            return out
        watch = {kind: ("ignore" if mode == "ignore" else "call") for kind, mode in np.geterr().items()}

        def record(kind: str, flag: int) -> None:
            flagged.append(kind)

        rows = self.oshape[0]
        pool = _POOL.get()
        with np.errstate(call=record, **watch):  # type: ignore[arg-type]
            for ufunc, args, slot in self.hoisted:
                vals[slot] = ufunc(*[vals[i] for i in args])
            if pool is None or pool[1] < 2 or out.nbytes < SPLIT_MIN_BYTES:
                self._rows(vals, out, 0, rows)
                return self._finish(out)
        spawn, workers = pool
        step = max(self.h, self.h * (_PART_BYTES // max(1, out.nbytes // rows * self.h)))
        bounds = _aligned(rows, max(workers * 2, -(-rows // step)), self.h)

        def part(lo: int, hi: int) -> None:
            with np.errstate(call=record, **watch):  # type: ignore[arg-type]
                self._rows(vals, out, lo, hi)

        blocks = _Blocks([functools.partial(part, lo, hi) for lo, hi in bounds])
        for _ in range(min(workers, len(bounds)) - 1):
            try:
                spawn(blocks.drain)
            except Exception:  # no worker to be had: this thread does it all
                break
        blocks.drain()
        blocks.done.acquire()
        if blocks.failed:
            raise blocks.failed[0]
        with np.errstate(call=record, **watch):  # type: ignore[arg-type]
            return self._finish(out)

    def _finish(self, out: Any) -> Any:
        # A mean: the sums divided by the count, as numpy's _mean does (in place, unsafe cast).
        if self.reducer is not None and self.reducer[2]:
            np.true_divide(out, np.intp(self.reducer[2]), out=out, casting="unsafe", subok=False)
        return out

    def _whole(self, vals: list[Any], out: Any) -> None:
        # The ops in program order on whole arrays, each writing where _rows would. (On
        # the inline path of runs of ~64K elements: per-op Python work is kept small.)
        scratch = [np.empty(shape, dtype) for shape, dtype in self.scratch] if self.scratch else ()
        slot = self.run_.nin + len(self.run_.consts)
        try:
            for ufunc, args, buf in self.whole:  # type: ignore[union-attr]
                if buf == -1:
                    dst = out
                elif buf == -2:  # reads whole inputs alone (hoisted out of _rows' loop)
                    vals[slot] = ufunc(*[vals[i] for i in args])
                    slot += 1
                    continue
                else:
                    dst = scratch[buf]
                if len(args) == 2:
                    vals[slot] = ufunc(vals[args[0]], vals[args[1]], out=dst)
                else:
                    vals[slot] = ufunc(*[vals[i] for i in args], out=dst)
                slot += 1
        except Exception as exc:
            d, args = self.run_.ops[slot - self.run_.nin - len(self.run_.consts)]
            a = tuple(vals[i] for i in args)
            error = kernel_error(d.name, a, exc, False)
            raise error from error.__cause__

    def _rows(self, shared: list[Any], out: Any, lo: int, hi: int) -> None:
        # Rows [lo, hi) of the result, block by block, with scratch buffers of this call's own.
        h = self.h
        vals = list(shared)
        scratch = [aligned_empty(shape, dtype) for shape, dtype in self.scratch]
        steps = [(ufunc, args, scratch[b] if b >= 0 else None, slot, len(args)) for ufunc, args, b, slot in self.loop]
        inputs = [(i, vals[i]) for i in self.sliced]
        reducer = self.reducer
        last = self.run_.nin + len(self.run_.consts) + len(self.run_.ops) - 1  # the last op's value
        for r0 in range(lo, hi, h):
            r1 = min(r0 + h, hi)
            tail = r1 - r0 != h
            for i, x in inputs:
                vals[i] = x[r0:r1]
            for ufunc, args, dst, slot, n in steps:
                if dst is None:
                    dst = out[r0:r1]
                elif tail:
                    dst = dst[: r1 - r0]
                if n == 2:
                    vals[slot] = ufunc(vals[args[0]], vals[args[1]], out=dst)
                elif n == 1:
                    vals[slot] = ufunc(vals[args[0]], out=dst)
                else:
                    vals[slot] = ufunc(*[vals[i] for i in args], out=dst)
            if reducer is not None:  # each row of the block reduced as numpy reduces it
                reducer[0].reduce(vals[last], axis=-1, keepdims=reducer[1], out=out[r0:r1])


def _typed_constants(run: BlockedRun, dtypes: list[np.dtype[Any]], template: list[Any]) -> list[tuple[int, ...]]:
    # Each op's argument slots, where a Python float read with one array value is replaced
    # by a slot appended to ``template`` holding it as a 0-d array of the dtype numpy's loop
    # casts it to (NEP 50: ``ufunc.resolve_dtypes`` with the weak ``float``): the same loop
    # on the same values, without converting the scalar at every call (~0.25 µs each; a
    # 1024x1024 chain makes 160 calls). Kept as it is when the typed operand would not
    # select the same loop, or the cast would overflow.
    nin, nconst = run.nin, len(run.consts)
    nbase = nin + nconst
    found: dict[tuple[int, np.dtype[Any]], int] = {}
    out: list[tuple[int, ...]] = []
    for ufunc, (_, args) in zip(run.ufuncs, run.ops, strict=True):
        if len(args) != 2 or not isinstance(ufunc, np.ufunc):
            out.append(args)
            continue
        kinds = [type(run.consts[i - nin]) if nin <= i < nbase else dtypes[i if i < nin else i - nconst] for i in args]
        pos = [j for j, kind in enumerate(kinds) if kind is float]
        if len(pos) != 1 or not isinstance(kinds[1 - pos[0]], np.dtype):
            out.append(args)
            continue
        j = pos[0]
        try:
            loop = ufunc.resolve_dtypes((*kinds, None))
            target = loop[j]
            if target.kind not in "fc":
                raise TypeError
            with np.errstate(all="ignore"):
                value = np.array(run.consts[args[j] - nin], target)
            if not np.isfinite(value) and math.isfinite(run.consts[args[j] - nin]):
                raise OverflowError
            if ufunc.resolve_dtypes((*[target if i == j else kinds[i] for i in range(2)], None)) != loop:
                raise TypeError
        except (TypeError, ValueError, OverflowError, np.exceptions.DTypePromotionError):
            out.append(args)
            continue
        key = (args[j], target)
        if key not in found:
            found[key] = len(template)
            template.append(value)
        out.append(tuple(found[key] if i == j else a for i, a in enumerate(args)))
    return out


def _aligned(rows: int, parts: int, h: int) -> list[tuple[int, int]]:
    # ``parts`` row ranges covering ``rows``, each a whole number of blocks but the last.
    blocks = -(-rows // h)
    parts = max(1, min(parts, blocks))
    base, extra = divmod(blocks, parts)
    bounds = []
    lo = 0
    for i in range(parts):
        hi = min(rows, lo + (base + (1 if i < extra else 0)) * h)
        bounds.append((lo, hi))
        lo = hi
    return bounds


class _WithSpawn:
    """A program whose blocked runs may share their blocks with the pool's workers."""

    __slots__ = ("fn", "spawn", "workers")

    def __init__(self, fn: Callable[..., Any], spawn: Spawn, workers: int) -> None:
        self.fn = fn
        self.spawn = spawn
        self.workers = workers

    def __call__(self, *args: Any, out: Any = None) -> Any:
        token = _POOL.set((self.spawn, self.workers))
        given = _OUT.set([out])
        try:
            return self.fn(*args)
        finally:
            _OUT.reset(given)
            _POOL.reset(token)

    @property
    def __name__(self) -> str:  # how backends name the task
        return str(getattr(self.fn, "__name__", "blocked"))


def result_buffer(cache: Any, bufs: tuple[Any, ...]) -> dict[str, Any]:
    """``{"out": buffer}``: a recycled buffer of the largest input's shape and dtype, or ``{}``.

    Call on the loop thread (the session's cache is confined to it) for a program with
    blocked runs going to the pool: the run whose result has exactly that shape and
    dtype (an element-wise formula over same-shaped arrays) writes into it, as a single
    op writes into the buffer ``_allocator.out_for`` finds. An unused buffer is freed.
    """
    if cache is None or not cache.cached_bytes:
        return {}
    largest = max((b for b in bufs if type(b) is _ndarray), key=lambda b: b.nbytes, default=None)
    if largest is None or largest.nbytes < cache.min_bytes:
        return {}
    found = cache.take(largest.shape, largest.dtype)
    return {} if found is None else {"out": found}


def with_pool(fn: Callable[..., Any], spawn: Spawn, workers: int) -> Callable[..., Any]:
    """``fn`` (a program with blocked runs) run with the pool's ``spawn`` at hand (the backend's hook)."""
    return _WithSpawn(fn, spawn, workers)
