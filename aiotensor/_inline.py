"""Whether an op runs inline on the event loop thread or on the pool: a cheap cost estimate.

A thread hop costs tens of microseconds of latency (and ~10-30 µs of the loop thread's
own time for the submit, the wake-up and the future callbacks), while numpy adds two
16-element arrays in half a microsecond. So an op whose kernel is cheaper than the hop
runs inline: it holds the loop for less time than dispatching it to the pool would.

The estimate is ``overhead + bytes touched x ns per byte`` for element-wise, shape and
reduction ops (two classes: memory-bound arithmetic, and transcendental math), and
``flops x ns per flop`` for matrix products. The constants were measured on a 2-core
x86-64 machine (see ``docs/performance.md``, "break-even") and are deliberately on
the slow side, so that a mis-estimate sends an op to the pool rather than stalling
the loop. Ops not listed here (``apply``, fused functions, anything new) always run
on the pool: an unknown cost is never inlined.

The estimate reads only shapes and byte counts of the arguments (no numpy call on
the common path, where every array argument has the same shape).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["DEFAULT_INLINE_US", "INLINE_STREAK", "estimate_us"]

#: Default bound on the estimated time one inline op may hold the event loop (µs).
DEFAULT_INLINE_US = 50.0
#: After this many consecutive inline ops, the next op first yields to the loop once,
#: so a tight loop of inline ops holds the loop at most ``INLINE_STREAK x threshold``.
INLINE_STREAK = 16

# Fixed cost of one numpy call on small arrays (ns), measured ~0.5-3 µs.
_OVERHEAD_NS = 1500.0
# ns per byte touched (inputs + output): add/copy ~0.018 measured, exp ~0.2.
_MEMORY_NS_PER_BYTE = 0.03
_MATH_NS_PER_BYTE = 0.3
# ns per multiply-add pair for BLAS products on small matrices (measured ~0.015).
_NS_PER_FLOP = 0.025

_MEMORY_OPS = frozenset(
    {
        "add",
        "subtract",
        "multiply",
        "maximum",
        "minimum",
        "equal",
        "not_equal",
        "less",
        "less_equal",
        "greater",
        "greater_equal",
        "logical_and",
        "logical_or",
        "logical_not",
        "negative",
        "abs",
        "sign",
        "square",
        "floor",
        "ceil",
        "isnan",
        "isfinite",
        "relu",
        "clip",
        "where",
        "astype",
        "zeros_like",
        "ones_like",
        "reshape",
        "permute_dims",
        "expand_dims",
        "squeeze",
        "concat",
        "stack",
        "split",
        "sum",
        "prod",
        "max",
        "min",
        "mean",
        "argmax",
        "argmin",
        "zeros",
        "ones",
        "full",
        "constant",
    }
)
_MATH_OPS = frozenset(
    {
        "divide",
        "floor_divide",
        "remainder",
        "pow",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "round",
        "softmax",
        "log_softmax",
        "std",
        "var",
        "eye",
        "random_uniform",
        "random_normal",
        "linspace",
    }
)
_INDEXING_OPS = frozenset({"getitem", "take"})
_PRODUCT_OPS = frozenset({"matmul", "tensordot", "einsum"})

_JOIN_OPS = frozenset({"concat", "stack", "split"})
# Python data a constant may hold that _arrays has already bounded (flat, <= 64 items).
_SMALL_DATA = (int, float, bool, complex, list, tuple, np.generic)

_ndarray = np.ndarray
_SCALARS = frozenset({int, float, bool, complex})
# ns per byte of the ops whose output has the (broadcast) shape of their inputs.
_ELEMENTWISE: dict[str, float] = {
    **dict.fromkeys(_MEMORY_OPS - _JOIN_OPS - {"constant", "zeros", "ones", "full"}, _MEMORY_NS_PER_BYTE),
    **dict.fromkeys(_MATH_OPS - {"eye", "random_uniform", "random_normal", "linspace"}, _MATH_NS_PER_BYTE),
}


def _arrays(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """The ndarray arguments (one level into lists and tuples), or None if a size is unknown."""
    found: list[Any] = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if type(a) is _ndarray:
            found.append(a)
        elif type(a) in (list, tuple):
            if len(a) > 64:  # a python list of data: converting it costs per element
                return None
            for e in a:
                if type(e) is _ndarray:
                    found.append(e)
                elif type(e) in (list, tuple):
                    return None  # nested python data: size unknown without walking it
    return found


def _touched_bytes(arrays: list[Any], nbytes: int | None, joins: bool) -> int:
    """Bytes read plus bytes written, the output sized from the inputs' shapes."""
    total = 0
    shape = arrays[0].shape if arrays else ()
    same = True
    itemsize = 1
    for a in arrays:
        total += a.nbytes
        if a.itemsize > itemsize:
            itemsize = a.itemsize
        if a.shape != shape:
            same = False
    if nbytes is not None:
        out = nbytes
    elif joins or not arrays:
        out = total
    elif same:
        out = math.prod(shape) * itemsize
    else:  # broadcasting can make the output much larger than any input
        try:
            out = math.prod(np.broadcast_shapes(*(a.shape for a in arrays))) * itemsize
        except ValueError:  # the kernel will reject these shapes
            out = total
    return total + out


def _product_flops(op: str, arrays: list[Any]) -> float:
    if op == "matmul" and len(arrays) == 2:
        a, b = arrays
        cols = b.shape[-1] if b.ndim >= 2 else 1
        return float(2.0 * a.size * cols * (math.prod(b.shape[:-2]) if b.ndim > 2 and a.ndim <= 2 else 1))
    # tensordot/einsum: the product of the operand sizes bounds the work of any contraction.
    return float(2.0 * math.prod(a.size or 1 for a in arrays))


def estimate_us(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], nbytes: int | None) -> float:
    """The estimated kernel time of ``op`` in µs; ``inf`` when it cannot be bounded cheaply."""
    per_byte = _ELEMENTWISE.get(op)
    if per_byte is not None and nbytes is None and not kwargs:
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
                    break
                total += a.nbytes
                if a.itemsize > itemsize:
                    itemsize = a.itemsize
            elif type(a) not in _SCALARS:
                break
        else:
            if shape is not None:
                return (_OVERHEAD_NS + (total + size * itemsize) * per_byte) / 1000.0
    arrays = _arrays(args, kwargs)
    if arrays is None:
        return math.inf
    if op in _MEMORY_OPS:
        if op == "constant" and not arrays and not isinstance(args[0], _SMALL_DATA):
            return math.inf  # an object with __array__ (another library's tensor): size unknown
        touched = _touched_bytes(arrays, nbytes, op in _JOIN_OPS)
        return (_OVERHEAD_NS + touched * _MEMORY_NS_PER_BYTE) / 1000.0
    if op in _MATH_OPS:
        if op == "linspace" and nbytes is None:
            return math.inf
        return (_OVERHEAD_NS + _touched_bytes(arrays, nbytes, False) * _MATH_NS_PER_BYTE) / 1000.0
    if op in _INDEXING_OPS and arrays:
        x, rest = arrays[0], arrays[1:]
        out: int = x.nbytes
        for idx in rest:  # fancy indexing: each index picks at most a whole slice of x
            out += idx.size * x.nbytes // max(1, min(x.shape, default=1))
        return float(_OVERHEAD_NS + (out + sum(a.nbytes for a in arrays)) * _MEMORY_NS_PER_BYTE) / 1000.0
    if op in _PRODUCT_OPS and arrays:
        return (_OVERHEAD_NS + _product_flops(op, arrays) * _NS_PER_FLOP) / 1000.0
    return math.inf
