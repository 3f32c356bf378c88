"""``var`` and ``std`` over axis 0 in row blocks: numpy's values without its full-size temporary.

numpy's ``var`` (``numpy/_core/_methods.py``, ``_var``) computes the mean, then
``x - mean`` as a full-size array, squares it in place and sums it over the axis. Over
axis 0 of a C-contiguous float array, that sum adds the rows in order (the reduction
axis is the outer loop: no pairwise summation), so it can be accumulated a block of
rows at a time: the running sum is put in front of the block's squared deviations
and ``np.add.reduce`` over axis 0 continues the same sequence of additions. The
result is bit for bit numpy's; the deviations live in one block-sized buffer.

:class:`BlockedVar` does that for float32 and float64 arrays of two or more
dimensions reduced over axis 0 alone (what a standardization per column asks);
anything else, and any run that raises a floating-point flag the caller's ``errstate``
does not ignore, is numpy's own call.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from .._opdef import OpDef

__all__ = ["VARIANCE", "BlockedVar", "aligned_empty", "blockable", "blocked_variance", "mean_keepdims"]

#: The ops :func:`blocked_variance` replaces.
VARIANCE = frozenset({"var", "std"})
#: Elements of deviations per block.
BLOCK_ITEMS = 65536
#: Elements from which the blocked computation is used.
MIN_ITEMS = 1 << 16
_FLOATS = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


class BlockedVar:
    """The kernel of ``var`` or ``std``: blocked over axis 0 when that keeps numpy's values."""

    __slots__ = ("kernel", "sqrt")

    def __init__(self, kernel: Any, sqrt: bool) -> None:
        self.kernel = kernel
        self.sqrt = sqrt

    def __call__(self, xp: Any, x: Any, **kwargs: Any) -> Any:
        ddof = blockable(x, kwargs)
        if ddof is None:
            return self.kernel(x, **kwargs)
        flagged: list[str] = []

        def record(kind: str, flag: int) -> None:
            flagged.append(kind)

        watch = {kind: ("ignore" if mode == "ignore" else "call") for kind, mode in np.geterr().items()}
        with np.errstate(call=record, **cast("Any", watch)):
            out = self._blocked(x, ddof, bool(kwargs.get("keepdims", False)))
        if flagged:  # numpy's own warnings or errors, as the caller's errstate says
            return self.kernel(x, **kwargs)
        return out

    def _blocked(self, x: Any, ddof: float, keepdims: bool, arrmean: Any = None, dev_out: Any = None) -> Any:
        # numpy's _var, step for step, with ``x - mean`` squared and summed a block at a time.
        # ``arrmean``: the mean (keepdims) if already computed; ``dev_out``: an array of
        # ``x``'s shape that receives the deviations ``x - mean`` (``_blocked_center``).
        rows = x.shape[0]
        rcount = np.intp(rows)
        if arrmean is None:
            arrmean = mean_keepdims(x)
        row_items = math.prod(x.shape[1:])
        h = max(1, BLOCK_ITEMS // max(1, row_items))
        # The running sum, then the block's squared deviations; cache-line aligned: the
        # squares' stores ran ~6% faster in the whole pass (4096x512 float32).
        buf = aligned_empty((h + 1, *x.shape[1:]), x.dtype)
        acc = np.empty((1, *x.shape[1:]), x.dtype)
        # The mean copied over a block's rows: one loop over contiguous operands per block
        # instead of one per row (see ``_blocked_layout._tiled``; same values).
        mean = arrmean
        if rows > h > 1 and row_items > 1:
            mean = aligned_empty((h, *x.shape[1:]), x.dtype)
            np.copyto(mean, arrmean)
        for lo in range(0, rows, h):
            hi = min(lo + h, rows)
            dev = buf[1 : hi - lo + 1]
            m = mean if hi - lo == h or mean is arrmean else mean[: hi - lo]
            if dev_out is None:
                np.subtract(x[lo:hi], m, out=dev)
                np.square(dev, out=dev)
            else:  # the deviations kept, their squares in the block
                np.square(np.subtract(x[lo:hi], m, out=dev_out[lo:hi]), out=dev)
            if lo:
                buf[0] = acc[0]
                np.add.reduce(buf[: hi - lo + 1], axis=0, keepdims=True, out=acc)
            else:
                np.add.reduce(dev, axis=0, keepdims=True, out=acc)
        ret = acc if keepdims else acc[0].copy()
        count = np.maximum(rcount - ddof, 0)
        ret = np.true_divide(ret, count, out=ret, casting="unsafe", subok=False)
        if self.sqrt:
            ret = np.sqrt(ret, out=ret)
        return ret

    def __reduce__(self) -> tuple[type[BlockedVar], tuple[Any, bool]]:
        return BlockedVar, (self.kernel, self.sqrt)


def aligned_empty(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Any:
    """An uninitialized scratch array whose data starts on a 64-byte boundary (a cache line).

    malloc aligns large blocks to 16 bytes only, and AVX stores that straddle cache lines
    cost the blocked kernels 6-10%. It is a view of a byte buffer: scratch, never a result.
    """
    nbytes = math.prod(shape) * dtype.itemsize
    raw = np.empty(nbytes + 64, np.uint8)
    off = -raw.ctypes.data % 64
    return raw[off : off + nbytes].view(dtype).reshape(shape)


def blockable(x: Any, kwargs: dict[str, Any]) -> float | None:
    """The ``correction`` of a ``var``/``std`` of ``x`` (``kwargs``) that blocks keep numpy's values for, or None."""
    axis = kwargs.get("axis")
    ddof = kwargs.get("correction", 0)
    if (
        type(x) is not np.ndarray
        or x.dtype not in _FLOATS
        or axis not in (0, (0,))
        or x.ndim < 2
        or not x.flags.c_contiguous
        or x.size < MIN_ITEMS
        or set(kwargs) - {"axis", "correction", "keepdims"}
        or type(ddof) not in (int, float)
        or not 0 <= ddof < x.shape[0]
    ):
        return None
    return cast("float", ddof)


def mean_keepdims(x: Any) -> Any:
    """``x.mean(axis=0, keepdims=True)`` of a float array, computed as numpy's ``_mean`` and ``_var`` do."""
    arrmean = np.add.reduce(x, axis=(0,), keepdims=True)
    return np.true_divide(arrmean, np.intp(x.shape[0]), out=arrmean, casting="unsafe", subok=False)


class _VarOp(OpDef):
    """``var`` or ``std`` with a :class:`BlockedVar` kernel (named, costed and checked as the op)."""

    __slots__ = ("op",)

    def __init__(self, d: OpDef) -> None:
        kernel = BlockedVar(d.kernel_for(np), d.name == "std")
        super().__init__(
            d.spec, kernel, data=d.data, cost=d.cost, plain=d.plain, returns=d.returns, blas=False, user=False
        )
        self.op = d

    def __reduce__(self) -> Any:
        return _VarOp, (self.op,)


def blocked_variance(d: OpDef) -> OpDef:
    """``d`` itself, or for ``var`` and ``std`` the same op with the blocked kernel."""
    if d.name in VARIANCE and type(d) is OpDef and isinstance(d.kernel, str):
        return _VarOp(d)
    return d
