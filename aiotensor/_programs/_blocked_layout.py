"""How a blocked run computes on inputs of given shapes and dtypes: its :class:`Layout`.

``BlockedRun`` (``_blocked_run``) makes one layout per shapes and dtypes of its inputs
and keeps it. The layout holds the block height, the scratch blocks (one per value
alive at once, reused from op to op: an op may write over an input that dies there),
the ops hoisted out of the loop (they read whole inputs alone), the constants typed
once as the dtype numpy's loop casts them to, the values every block reads whole (a
row vector) copied once per call over a block's shape, and the loop itself: per block of rows,
each op into its scratch block, the last one into the result's block (or each row
reduced into the result's rows). One block (the whole rows) runs each op once over
whole arrays, in place in the result. A run large enough is shared with the pool's
other workers (``_blocked_split``); each participant walks its rows with scratch of
its own. Before all that, a run of correctly rounded float ops on one dtype whose
inputs have the result's shape is one compiled loop when numba is installed
(``_blocked_jit``, :data:`JIT`), on the thread the run was placed on, unsplit: the
placement's cost estimate is still the interpreter's (it overestimates such a run).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._kernels import kernel_error
from . import _blocked_jit, _blocked_split
from ._blocked_split import _OUT, in_parts, split_pool
from ._blocked_var import aligned_empty
from ._blocked_whole import (
    ALIGN_FROM,
    RESULT_TRIES,
    SIGN_MASKS,
    aligned_result,
    failed_step,
    positional_out,
    straight_line,
)

if TYPE_CHECKING:
    from ._blocked_run import BlockedRun

__all__ = ["Layout"]

_REDUCERS = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}


class Layout:
    """A run on inputs of given shapes and dtypes: block shapes, scratch buffers, ops hoisted out of the loop."""

    __slots__ = (
        "_dtypes",
        "_made_with",
        "bits",
        "h",
        "hoisted",
        "in_place",
        "in_place_run",
        "jit",
        "jit_consts",
        "loop",
        "oshape",
        "out_dtype",
        "reducer",
        "rshape",
        "run_",
        "scratch",
        "sliced",
        "split",
        "template",
        "tiled",
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
        #: The layout a split run walks (``_blocked_split.SPLIT_BLOCK_ITEMS``), made at its first split run.
        self.split: Layout | None = None
        self._made_with = (in_shapes, sliced, all_dtypes)
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
        #: The run as one compiled loop (``_blocked_jit``) when it is eligible, and its constants' values; else None.
        self.jit = None
        if self.reducer is None:
            same = all(sh == oshape for sh in in_shapes)
            self.jit = _blocked_jit.plan(run.ufuncs, typed, run.nin, nconst, all_dtypes, self.template, same)
        self.jit_consts = self.jit.values if self.jit is not None else []
        # Ops on whole inputs alone (``std + 1e-8``): once per call, not per block.
        self.hoisted = [(run.ufuncs[k], typed[k], nbase + k) for k in range(n) if not varies[nbase + k]]
        # The loop: (ufunc, args, scratch index or -1 for the result's block, value slot)
        # per op that varies. Ops whose values do not overlap in time share a buffer (an
        # op may write over an input that dies there: same shape and dtype, in place).
        # In blocks, only the last op writes into the result's block: the others write
        # into 64-byte-aligned scratch blocks (a chain runs in place in one of them, in
        # cache). The result's buffer, recycled or fresh, is mostly only 16-byte aligned
        # (malloc), and ten ops storing into it there ran ~10% slower (1024x1024: 0.77x
        # numpy's chain against 0.70x into aligned scratch). With one op storing into it,
        # the result's alignment no longer shows: a 64-byte-aligned result (an aligned view
        # the registry owns) measured 1.00x a 16-byte-aligned one in numpy alone and within
        # noise through the benchmark, so results stay numpy's allocations, which the
        # registry and the cache own as they are. One block (the whole rows) runs in place
        # in the result itself (-1), taken first: no full-size scratch; there all ops store
        # into the result, so a fresh one is asked to be 32-byte aligned (``_aligned_result``).
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
        #: One block whose every op is a ufunc of one or two arguments writing into the
        #: result (the chain in place): per op, its ufunc, arguments (the second -1 for
        #: none, -2 for a float's ``absolute`` done on the result's bits) and value slot,
        #: for _whole's loop; else None.
        self.in_place: list[tuple[Any, int, int, int]] | None = None
        #: The result's bits as integers and the mask that clears a float's sign, when an
        #: in-place op is ``absolute`` (see :data:`ABS_AS_BITS`); else None.
        self.bits: tuple[np.dtype[Any], Any] | None = None
        #: ``in_place`` as one function of straight-line calls (``_straight_line``), and
        #: the line of each step in it; else None.
        self.in_place_run: tuple[Callable[..., None], dict[int, int]] | None = None
        self._dtypes = (all_dtypes, run.nin, nconst)
        if h >= oshape[0] and not self.reducer:
            self.whole = [
                (run.ufuncs[k], typed[k], buf_of.get(nbase + k, -1 if varies[nbase + k] else -2)) for k in range(n)
            ]
            if all(buf == -1 and positional_out(f, args) for f, args, buf in self.whole):
                self.in_place = [
                    (f, args[0], args[-1] if len(args) == 2 else -2 if self._sign_bit(f, args[0], k) else -1, nbase + k)
                    for k, (f, args, _) in enumerate(self.whole)
                ]
                self.in_place_run = straight_line(self.in_place, run.nin, nbase, self.template)
        #: Values read whole by every block (a row vector, a hoisted ``std + 1e-8``) copied
        #: once per call into a block of the shape they broadcast to: (slot, shape).
        self.tiled = [] if self.whole is not None or not 1 < h < oshape[0] else _tiled(run, typed, varies, shapes)

    def _sign_bit(self, f: Any, arg: int, k: int) -> bool:
        # Whether op ``k``, ``f(vals[arg], out)`` in place, is a float's absolute value that
        # _whole may compute as the result's sign bits cleared: the same bits (numpy's loop
        # clears the sign bit too: NaN payloads kept, no floating-point flag raised either
        # way), ~0.6 µs less on a 256x256 float32 (numpy 2.4's float32 ``absolute`` took
        # 3.2 µs there, a bitwise and of its bits 2.3, a multiply 2.1, on this machine).
        all_dtypes, nin, nconst = self._dtypes
        if f is not np.absolute or not ABS_AS_BITS or arg < nin + nconst:
            return False  # (of an input or a constant: not the result's bits)
        dtype = all_dtypes[arg - nconst]
        mask = SIGN_MASKS.get(dtype)
        if mask is None or dtype != self.out_dtype or all_dtypes[nin + k] != dtype:
            return False
        if math.prod(self.rshape) * dtype.itemsize < ALIGN_FROM:
            return False  # (small: the view of the result costs more than the faster loop saves)
        self.bits = mask
        return True

    def run(self, inputs: tuple[Any, ...], flagged: list[str]) -> Any:
        """The result, computed in blocks; floating-point flags raised go to ``flagged``."""
        holder = _OUT.get()
        out = holder[0] if holder else None
        if out is not None and out.shape == self.rshape and out.dtype == self.out_dtype:
            holder[0] = None  # type: ignore[index]
        elif self.whole is not None and ALIGN_RESULT:
            out = aligned_result(self.rshape, self.out_dtype, tries=RESULT_TRIES)
        else:
            out = np.empty(self.rshape, self.out_dtype)
        if self.jit is not None and JIT and self._compiled(inputs, out, flagged):
            return out
        straight = self.in_place_run
        if straight is not None:  # one block in place: each op once, as op by op (numpy's own warnings)
            self._in_place(straight, inputs, out)
            return out
        vals = list(self.template)
        vals[: len(inputs)] = inputs
        if self.whole is not None:  # one block: each op once, as op by op (numpy's own warnings)
            self._whole(vals, out)
            return out
        watch = {kind: ("ignore" if mode == "ignore" else "call") for kind, mode in np.geterr().items()}

        def record(kind: str, flag: int) -> None:
            flagged.append(kind)

        rows = self.oshape[0]
        split = split_pool(out.nbytes)
        with np.errstate(call=record, **watch):  # type: ignore[arg-type]
            for ufunc, args, slot in self.hoisted:
                vals[slot] = ufunc(*[vals[i] for i in args])
            if split is None:
                self._rows(vals, out, 0, rows)
                return self._finish(out)
        pool, tall = split
        walker = (self.split or self._split_layout()) if tall else self
        kept = threading.local()  # each participant's scratch and copies, from its first part to its last

        def part(lo: int, hi: int) -> None:
            mine = getattr(kept, "state", None)
            if mine is None:
                mine = kept.state = []
            with np.errstate(call=record, **watch):  # type: ignore[arg-type]
                walker._rows(vals, out, lo, hi, mine)

        in_parts(part, rows, walker.h, out.nbytes, pool, _blocked_split.START_WAIT_S if tall else 0.0)
        with np.errstate(call=record, **watch):  # type: ignore[arg-type]
            return self._finish(out)

    def _compiled(self, inputs: tuple[Any, ...], out: Any, flagged: list[str]) -> bool:
        # Whether the run's compiled loop (``_blocked_jit``) computed ``out`` (or
        # ``flagged`` says the run is computed again op by op). Not when the caller does
        # not ignore underflow (finite values: the loop cannot tell), nor on inputs or a
        # result the loop cannot read as flat C arrays. A value that was not finite: the
        # loop's result is dropped (a NaN's sign and payload may not be numpy's loops'
        # where two NaNs meet); when the caller ignores overflow, invalid and division
        # by zero, the interpreter's path computes it, else op by op (numpy's warnings),
        # as it does when the result is one of the inputs (the loop wrote over it).
        err = np.geterr()
        if err["under"] != "ignore" or not out.flags.c_contiguous:
            return False
        for x in inputs:
            if not (x.flags.c_contiguous and x.flags.aligned):
                return False
        loop = _blocked_jit.kernel(self.jit)  # type: ignore[arg-type]
        if loop is None:
            return False
        try:
            bad = loop(*[x.reshape(-1) for x in inputs], *self.jit_consts, out.reshape(-1))
        except (TypeError, ValueError):  # (arguments numba does not take: before the loop ran)
            return False
        if not bad:
            return True
        if err["over"] == err["invalid"] == err["divide"] == "ignore" and not any(
            np.may_share_memory(x, out) for x in inputs
        ):
            return False
        flagged.append("not finite")
        return True

    def _split_layout(self) -> Layout:
        # The same run in the taller blocks of a split run (``SPLIT_BLOCK_ITEMS``: each
        # ufunc call long enough that two threads taking the GIL in turn do not wait on
        # each other; see ``_blocked_split``), at most half the rows; made once (two
        # threads making it at once make equal ones). The values do not depend on the
        # blocks' height: each element is the same ops on the same operands.
        rows = self.oshape[0]
        per_row = math.prod(self.oshape) // max(1, rows)
        h = max(self.h, min(rows // 2, _blocked_split.SPLIT_BLOCK_ITEMS // max(1, per_row)))
        if h == self.h:
            self.split = self
        else:
            in_shapes, sliced, all_dtypes = self._made_with
            self.split = Layout(self.run_, in_shapes, sliced, self.oshape, h, all_dtypes)
        return self.split

    def _finish(self, out: Any) -> Any:
        # A mean: the sums divided by the count, as numpy's _mean does (in place, unsafe cast).
        if self.reducer is not None and self.reducer[2]:
            np.true_divide(out, np.intp(self.reducer[2]), out=out, casting="unsafe", subok=False)
        return out

    def _in_place(
        self, straight: tuple[Callable[..., None], dict[int, int]], inputs: tuple[Any, ...], out: Any
    ) -> None:
        # The ops in program order, each on the whole result in place (``in_place_run``).
        # (On the inline path of runs of ~64K elements: per-op Python work is kept small;
        # out is given by position: numpy parses no keyword, ~0.02 µs an op.)
        sign = self.bits
        try:
            if sign is None:
                straight[0](inputs, out, None, None)
            else:
                straight[0](inputs, out, out.view(sign[0]), sign[1])
        except Exception as exc:
            k = failed_step(exc, straight)
            if k < 0:  # (not raised by a step)
                raise
            d, args = self.run_.ops[k]
            nin, first = self.run_.nin, self.run_.nin + len(self.run_.consts)
            a = tuple(
                inputs[i] if i < nin else out if first <= i < first + len(self.run_.ops) else self.template[i]
                for i in args
            )  # (every op's value is the result: see _straight_line)
            error = kernel_error(d.name, a, exc, False)
            raise error from error.__cause__

    def _whole(self, vals: list[Any], out: Any) -> None:
        # The ops in program order on whole arrays, each writing where _rows would (a
        # one-block run that is not all in place: see _in_place).
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

    def _rows(self, shared: list[Any], out: Any, lo: int, hi: int, kept: list[Any] | None = None) -> None:
        # Rows [lo, hi) of the result, block by block, with scratch buffers of this call's
        # own, or of the participant's earlier parts of a split run (``kept``: filled by
        # its first part: the tiled copies are made once per participant, not per part).
        h = self.h
        if kept:
            vals, steps, inputs, tiled = kept
            for i, block in tiled:  # (an earlier part may have ended with a short block)
                vals[i] = block
        else:
            vals = list(shared)
            scratch = [aligned_empty(shape, dtype) for shape, dtype in self.scratch]
            steps = [(f, args, scratch[b] if b >= 0 else None, slot, len(args)) for f, args, b, slot in self.loop]
            inputs = [(i, vals[i]) for i in self.sliced]
            tiled = []
            for i, shape in self.tiled:
                block = aligned_empty(shape, vals[i].dtype)  # (its own dtype: the copy is exact)
                np.copyto(block, vals[i])
                vals[i] = block
                tiled.append((i, block))
            if kept is not None:
                kept[:] = [vals, steps, inputs, tiled]
        reducer = self.reducer
        last = self.run_.nin + len(self.run_.consts) + len(self.run_.ops) - 1  # the last op's value
        for r0 in range(lo, hi, h):
            r1 = min(r0 + h, hi)
            tail = r1 - r0 != h
            for i, x in inputs:
                vals[i] = x[r0:r1]
            if tail:
                for i, block in tiled:
                    vals[i] = block[: r1 - r0]
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


#: Whether an eligible run is one compiled loop (``_blocked_jit``; off, the interpreter's path: for measuring).
JIT = True

#: Whether an in-place one-block run computes a float's ``absolute`` as its sign bit
#: cleared (``Layout._sign_bit``; off, numpy's ``absolute``: for measuring).
ABS_AS_BITS = True

#: Whether a one-block run asks malloc again for a result that is not 32-byte aligned
#: (``_blocked_whole.aligned_result``; off, the first chunk is taken as it comes: for measuring).
ALIGN_RESULT = True


def _tiled(
    run: BlockedRun,
    typed: list[tuple[int, ...]],
    varies: list[bool],
    shapes: list[tuple[int, ...]],
) -> list[tuple[int, tuple[int, ...]]]:
    # The array values every block reads whole and broadcasts (an input that is not sliced
    # by rows, a hoisted op's value; not one element: numpy's loop already reads that as
    # a scalar; blocks of one row gain nothing), each with the one block shape its
    # readers give it. numpy's loop over a block then runs once over contiguous
    # operands instead of once per row with the row vector re-read: the standardization's
    # ``x - mean`` and ``/ std`` over (128, 512) blocks took 257 and 210 µs per (4096, 512)
    # float32 pass against 372 and 334 µs broadcast. Same ufunc, same operand values:
    # the same result.
    nin, nbase = run.nin, run.nin + len(run.consts)
    wanted: dict[int, set[tuple[int, ...]]] = {}
    for k, args in enumerate(typed):
        slot = nbase + k
        if not varies[slot]:
            continue
        for i in args:
            if (
                i < len(shapes)
                and not varies[i]
                and not nin <= i < nbase
                and math.prod(shapes[i]) > 1
                and shapes[i] != shapes[slot]
            ):
                wanted.setdefault(i, set()).add(shapes[slot])
    return [(i, found.pop()) for i, found in wanted.items() if len(found) == 1]


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
