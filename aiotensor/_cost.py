"""Whether a kernel runs inline on the event loop thread or on the pool: a cheap cost estimate.

A thread hop costs tens of microseconds of latency (and ~10-30 µs of the loop thread's
own time for the submit, the wake-up and the future callbacks), while numpy adds two
16-element arrays in half a microsecond. So a kernel cheaper than the hop runs inline:
it holds the loop for less time than dispatching it to the pool would.

The estimate is ``overhead + bytes touched x ns per byte`` for memory-bound and
transcendental ops (:class:`~aiotensor._opdef.Cost` ``MEMORY`` and ``MATH``), and
``flops x ns per flop`` for matrix products. The constants were measured on a 2-core
x86-64 machine (``docs/performance.md``, "break-even") and are deliberately on the slow
side, so that a mis-estimate sends a kernel to the pool rather than stalling the loop.
``Cost.UNKNOWN`` (``apply``, fused functions on first sight) is never inlined. On a
saturated loop (``_loopload``) the bound drops to ``BUSY_INLINE_US``: there the loop's
own time, not the hop's latency, is what a kernel should not cost.

What of an estimate runs without the GIL (:func:`gil_free_us`) is what busy-loop placement
weighs (``_loopload``): numpy releases the GIL in a ufunc's or gufunc's inner loop (and a
reduction's, and BLAS under ``matmul``) only when the loop runs over more than
:data:`GIL_FREE_ABOVE` elements (``NPY_BEGIN_THREADS_THRESHOLDED`` in numpy's C source:
the output's elements for element-wise ops and products, the input's for reductions);
below that, and for numpy's dispatch of every call, the thread holds the GIL.

The estimate reads only shapes and byte counts (no numpy call on the common path, where
every array argument has the same shape). It works on arrays and on :class:`Spec`
objects, the shapes an expression's intermediates will have (see ``_placement.program_cost``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._opdef import Cost, OpDef

__all__ = [
    "DEFAULT_INLINE_US",
    "GIL_FREE_ABOVE",
    "HOLD_PER_OP_S",
    "HOLD_THRESHOLDS",
    "OVERHEAD_NS",
    "PER_BYTE",
    "SLICED_MAX",
    "Spec",
    "estimate_us",
    "gil_free_us",
    "out_spec",
]

#: Default bound on the estimated time one inline op may hold the event loop (µs).
DEFAULT_INLINE_US = 50.0
#: Once a run of inline ops has held the loop for this many inline thresholds (16 x 50 µs
#: = 0.8 ms by default), the next op first yields to the loop once. The run is measured
#: in time, not counted in ops: a run of 16 ops that each take the whole threshold holds
#: the loop as long as ~230 small adds, and yielding after 16 of those (a loop iteration
#: costs 4-5 µs on asyncio) made them ~5% dearer.
HOLD_THRESHOLDS = 16
#: What one inline op holds the loop for besides its kernel (its checks, registering the
#: result, freeing what was dropped), counted towards ``HOLD_THRESHOLDS`` (seconds). The
#: lean path takes 2.5-3.5 µs here.
HOLD_PER_OP_S = 3e-6
#: An expression's program estimated at most this many inline thresholds runs on the
#: loop in slices, each ending once it has held the loop for the threshold (it yields
#: between two slices once ``HOLD_THRESHOLDS`` is spent, as inline ops do): a thread
#: hop costs 80-200 µs of latency here, and estimates run 2.5-3x above measured times,
#: so such a program takes about what the hop would add.
SLICED_MAX = 4

#: numpy releases the GIL in a kernel's loop only above this many elements (numpy 2.4,
#: ``NPY_BEGIN_THREADS_THRESHOLDED``; checked here: ``a + a`` on 400 float64 holds the GIL,
#: on 501 releases it; ``(16, 512) @ (512, 10)``, 160 outputs, holds it throughout).
GIL_FREE_ABOVE = 500

# Fixed cost of one numpy call on small arrays (ns), measured ~0.5-3 µs.
OVERHEAD_NS = 1500.0
# ns per byte touched (inputs + output): add/copy ~0.018 measured, exp ~0.2.
# floor_divide/remainder on floats: ~11 ns an element whatever the width (0.8-0.9 ns/B on
# float32, measured with numpy 2.4), 3x what MATH would say.
# erf (and gelu through it): ~80 numpy steps, ~70 µs on 1,000 float64 and ~5 ns a byte
# beyond (a loaded 2-core machine), or ~0.1 µs an element through math.erf on small arrays.
PER_BYTE = {
    Cost.MEMORY: 0.03,
    Cost.MATH: 0.3,
    Cost.DIVMOD: 1.0,
    Cost.SPECIAL: 5.0,
    Cost.INDEX: 0.03,
    Cost.CREATE: 0.03,
}
# ns per multiply-add pair for BLAS products on small matrices (measured ~0.015).
_NS_PER_FLOP = 0.025
# A factorization of a stack of matrices (inv, svd, eigh ...: a PRODUCT op of one tensor)
# counts this many flops per n^3 of each n x n matrix: numpy's SVD, the dearest, took
# ~29 µs on 16x16 (~7 ns per n^3, 250 x _NS_PER_FLOP), cheaper ones (inv: 5 µs) less.
_FACTOR_FLOPS = 250.0
# Python data a constant may hold that is bounded below (flat, <= 64 items).
_SMALL_DATA = (int, float, bool, complex, list, tuple, np.generic)
_SCALARS = frozenset({int, float, bool, complex})
_ndarray = np.ndarray
# Module constants: an enum member looked up on its class costs ~80 ns (EnumType.__getattr__).
_UNKNOWN, _CREATE, _PRODUCT, _INDEX = Cost.UNKNOWN, Cost.CREATE, Cost.PRODUCT, Cost.INDEX
# Element-wise costs: their loop runs over the broadcast output (gil_free_us).
_BROADCASTING = frozenset({Cost.MEMORY, Cost.MATH, Cost.DIVMOD, Cost.SPECIAL})
# Broadcast shapes by the operands' shapes (see _broadcast), cleared when full.
_broadcasts: dict[tuple[tuple[int, ...], ...], tuple[int, ...] | None] = {}
_BROADCASTS_MAX = 1024
# The same for two shapes, with the size: the hot path of estimate_us.
_pairs: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[tuple[int, ...], int]] = {}
# A product's estimate of two arrays by op and shapes (it reads nothing else): a service
# multiplies the same few shapes, and working it out costs ~0.3 µs a call.
_products: dict[tuple[OpDef, tuple[int, ...], tuple[int, ...]], float] = {}


class Spec:
    """The shape and item size an array will have: what the estimate reads of an array."""

    __slots__ = ("itemsize", "nbytes", "ndim", "shape", "size")

    def __init__(self, shape: tuple[int, ...], itemsize: int) -> None:
        self.shape = shape
        self.ndim = len(shape)
        self.size = math.prod(shape)
        self.itemsize = itemsize
        self.nbytes = self.size * itemsize


def _arrays(args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any] | None) -> list[Any] | None:
    """The array arguments (one level into lists and tuples), or None if a size is unknown."""
    found: list[Any] = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if type(a) is _ndarray or type(a) is Spec:
            found.append(a)
        elif type(a) in (list, tuple):
            if len(a) > 64:  # a python list of data: converting it costs per element
                return None
            for e in a:
                if type(e) is _ndarray or type(e) is Spec:
                    found.append(e)
                elif type(e) in (list, tuple):
                    return None  # nested python data: size unknown without walking it
    return found


def _broadcast(arrays: list[Any]) -> tuple[int, ...] | None:
    shape = arrays[0].shape
    for a in arrays:
        if a.shape != shape:
            shapes = tuple([a.shape for a in arrays])
            try:
                return _broadcasts[shapes]
            except KeyError:
                pass
            try:
                out: tuple[int, ...] | None = tuple(np.broadcast_shapes(*shapes))
            except ValueError:  # the kernel will reject these shapes
                out = None
            # np.broadcast_shapes costs ~4 µs, as much as the op it estimates; a service
            # broadcasts the same few shapes (rows against a parameter's) again and again.
            if len(_broadcasts) >= _BROADCASTS_MAX:
                _broadcasts.clear()
            _broadcasts[shapes] = out
            return out
    return tuple(shape)


def out_spec(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Spec | None:
    """An upper bound on the size of ``d``'s output (for the estimate of what follows it)."""
    cost = d.cost
    arrays = _arrays(args, kwargs)
    if not arrays or cost is _UNKNOWN or cost is _CREATE:
        return None
    itemsize = 8 if d.name == "astype" else max(8, *(a.itemsize for a in arrays))
    if cost is _PRODUCT:
        if d.name != "matmul" or len(arrays) != 2:
            return None
        a, b = arrays
        if a.ndim != 2 or b.ndim != 2:
            return None
        return Spec((a.shape[0], b.shape[-1]), itemsize)
    if d.name in ("concat", "stack", "split"):
        return Spec((sum(a.size for a in arrays),), itemsize)
    if cost is _INDEX:
        return None if len(arrays) > 1 else Spec(tuple(arrays[0].shape), itemsize)
    shape = _broadcast(arrays)
    return None if shape is None else Spec(shape, itemsize)


def _pair(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """The broadcast shape of ``a`` and ``b`` and its size, cached in ``_pairs``; None if they do not broadcast."""
    shape = _broadcast([Spec(a, 1), Spec(b, 1)])
    if shape is None:
        return None
    if len(_pairs) >= _BROADCASTS_MAX:
        _pairs.clear()
    both = _pairs[(a, b)] = (shape, math.prod(shape))
    return both


def _touched_bytes(arrays: list[Any], nbytes: int | None) -> int:
    """Bytes read plus bytes written, the output sized from the inputs' shapes."""
    total: int = sum(a.nbytes for a in arrays)
    if nbytes is not None:
        return total + nbytes
    if not arrays:
        return 0
    shape = _broadcast(arrays)
    if shape is None:
        return 2 * total
    itemsize: int = max(a.itemsize for a in arrays)
    return total + math.prod(shape) * itemsize


def _product_flops(d: OpDef, arrays: list[Any]) -> float:
    if d.data == 1 and arrays[0].ndim >= 2:  # a factorization: ~n^3 a matrix of the stack
        a = arrays[0]
        return float(_FACTOR_FLOPS * a.size * max(a.shape[-2:]))
    if d.name == "matmul" and len(arrays) == 2:
        a, b = arrays
        cols = b.shape[-1] if b.ndim >= 2 else 1
        return float(2.0 * a.size * cols * (math.prod(b.shape[:-2]) if b.ndim > 2 and a.ndim <= 2 else 1))
    # tensordot/einsum: the product of the operand sizes bounds the work of any contraction.
    return float(2.0 * math.prod(a.size or 1 for a in arrays))


def estimate_us(
    d: OpDef, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any] | None, nbytes: int | None
) -> float:
    """The estimated kernel time of ``d`` on these arguments in µs; ``inf`` when it cannot be bounded cheaply."""
    cost = d.cost
    per_byte = PER_BYTE.get(cost)
    if per_byte is not None and cost is not _INDEX and nbytes is None and not kwargs:
        # The hot case (an element-wise op on same-shaped arrays and scalars), in one
        # pass; anything else takes the general path below, which gives the same value.
        total = size = 0
        itemsize = 1
        shape = None
        for a in args:
            if type(a) is _ndarray:
                if shape is None:
                    shape, size = a.shape, a.size
                elif a.shape != shape:
                    # Broadcasting (rows against a parameter's row): the shapes' result, cached.
                    both = _pairs.get((shape, a.shape))
                    if both is None:
                        both = _pair(shape, a.shape)
                        if both is None:
                            break  # shapes the kernel will reject: the general path
                    shape, size = both
                total += a.nbytes
                if a.itemsize > itemsize:
                    itemsize = a.itemsize
            elif type(a) not in _SCALARS:
                break
        else:
            if shape is not None:
                return (OVERHEAD_NS + (total + size * itemsize) * per_byte) / 1000.0
    if cost is _PRODUCT and nbytes is None and not kwargs and len(args) == 2:
        a, b = args
        if type(a) is _ndarray and type(b) is _ndarray:  # (matmul's hot case: its value below, cached)
            key = (d, a.shape, b.shape)
            est = _products.get(key)
            if est is None:
                if len(_products) >= _BROADCASTS_MAX:
                    _products.clear()
                est = _products[key] = (OVERHEAD_NS + _product_flops(d, [a, b]) * _NS_PER_FLOP) / 1000.0
            return est
    if cost is _UNKNOWN:
        return math.inf
    arrays = _arrays(args, kwargs)
    if arrays is None:
        return math.inf
    if cost is _CREATE:
        if nbytes is None:
            if d.name not in ("constant", "asarray") or arrays or not isinstance(args[0], _SMALL_DATA):
                return math.inf  # an object with __array__ (another library's tensor): size unknown
            return OVERHEAD_NS / 1000.0
        return (OVERHEAD_NS + nbytes * PER_BYTE[cost]) / 1000.0
    if cost is _PRODUCT:
        if not arrays:
            return math.inf
        return (OVERHEAD_NS + _product_flops(d, arrays) * _NS_PER_FLOP) / 1000.0
    if cost is _INDEX:
        if not arrays:
            return math.inf
        x, rest = arrays[0], arrays[1:]
        out: int = x.nbytes
        for idx in rest:  # fancy indexing: each index picks at most a whole slice of x
            out += idx.size * x.nbytes // max(1, min(x.shape, default=1))
        return float(OVERHEAD_NS + (out + sum(a.nbytes for a in arrays)) * PER_BYTE[cost]) / 1000.0
    assert per_byte is not None
    return (OVERHEAD_NS + _touched_bytes(arrays, nbytes) * per_byte) / 1000.0


def gil_free_us(d: OpDef, args: tuple[Any, ...] | list[Any], kwargs: dict[str, Any] | None, est: float) -> float:
    """The part of ``est`` (``d``'s estimate on these arguments) that runs without the GIL, in µs.

    Its loop: the estimate less numpy's dispatch (``OVERHEAD_NS``, which holds the GIL)
    when the loop runs over more than :data:`GIL_FREE_ABOVE` elements (the output's for
    element-wise ops and products, else the largest array's), and 0 otherwise; ``est``
    itself when it is unbounded (nothing to weigh: the pool, as before).
    """
    if est == math.inf:
        return est
    arrays = _arrays(tuple(args), kwargs)
    if not arrays:
        return 0.0
    if d.cost is _PRODUCT:
        out = out_spec(d, tuple(args), kwargs)
        loop = out.size if out is not None else max(a.size for a in arrays)
    else:
        loop = max(a.size for a in arrays)
        if d.cost in _BROADCASTING:
            shape = _broadcast(arrays)
            if shape is not None:
                loop = max(loop, math.prod(shape))
    return max(0.0, est - OVERHEAD_NS / 1000.0) if loop > GIL_FREE_ABOVE else 0.0
