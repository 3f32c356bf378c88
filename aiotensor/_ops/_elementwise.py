"""Element-wise ops, with numpy broadcasting, type promotion and results.

Each op is one ufunc of the array namespace (or a two-line kernel). numpy's
floating-point warnings follow the caller's ``np.errstate``: kernels run in a copy of
the caller's context.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._kernels import as_numeric
from .._opdef import Cost, Prepared, op

if TYPE_CHECKING:
    from .._types import TensorLike

M, F = Cost.MEMORY, Cost.MATH


def _k_sigmoid(xp: Any, x: Any) -> Any:
    # tanh form: no overflow for large |x|, and float32 stays float32.
    x = xp.asarray(x)
    if x.dtype.kind not in "fc":
        x = x.astype(xp.float64)
    return 0.5 * (1.0 + xp.tanh(0.5 * x))


def _k_relu(xp: Any, x: Any) -> Any:
    x = xp.asarray(x)
    if xp is np:
        return relu_into(x)
    # A zero of x's own dtype: a python 0 would turn bool input into int64.
    return xp.maximum(x, xp.zeros((), x.dtype))


#: Elements per ``maximum`` call of :func:`relu_into` (and of its zeros).
RELU_CHUNK = 65536
_zeros: dict[np.dtype[Any], Any] = {}


def relu_into(x: Any, out: Any = None) -> Any:
    """``np.maximum(x, 0)`` (into ``out`` if given), fast for large float arrays.

    numpy's ``maximum`` against a broadcast scalar runs 3-4x slower than against an
    array of the same shape (measured with numpy 2.4: 135 µs against 44 µs on 256K
    float32), so a C-contiguous float array is compared chunk by chunk with a
    read-only block of zeros (calloc'd, so it reads the kernel's zero page and costs
    no memory). The result is the same, NaN and signed zeros included.
    """
    dt = x.dtype
    if dt.kind != "f" or x.size < 4096 or not x.flags.c_contiguous or (out is not None and not out.flags.c_contiguous):
        zero = np.zeros((), dt)
        return np.maximum(x, zero) if out is None else np.maximum(x, zero, out=out)
    zeros = _zeros.get(dt)
    if zeros is None:
        zeros = _zeros[dt] = np.zeros(RELU_CHUNK, dt)
        zeros.flags.writeable = False
    n = x.size
    if n <= RELU_CHUNK:
        # One chunk: the zeros as x's shape, without the loop's slicing (a third of the
        # time at 16x512).
        like = zeros[:n].reshape(x.shape)
        return np.maximum(x, like) if out is None else np.maximum(x, like, out=out)
    if out is None:
        out = np.empty_like(x)
    src, dst = x.reshape(-1), out.reshape(-1)
    for i in range(0, n, RELU_CHUNK):
        j = min(i + RELU_CHUNK, n)
        np.maximum(src[i:j], zeros[: j - i], out=dst[i:j])
    return out


def _k_clip(xp: Any, x: Any, lo: Any, hi: Any) -> Any:
    # ``None`` is a valid bound here (no limit on that side), so only real bounds are checked.
    lo = None if lo is None else as_numeric(lo)
    hi = None if hi is None else as_numeric(hi)
    return xp.clip(x, lo, hi)


def _maybe_inf(x: Any) -> bool:
    """Whether ``x`` may hold an infinity (a large array: two reductions, no temporary; NaN says maybe)."""
    tx = type(x)
    if tx is float:
        return not math.isfinite(x)
    if tx is np.ndarray:
        if x.dtype.kind != "f" or not x.size:
            return False
        if x.size < 4096:  # one call: its temporary is small
            return bool(np.isinf(x).any())
        return not (math.isfinite(np.maximum.reduce(x, axis=None)) and math.isfinite(np.minimum.reduce(x, axis=None)))
    return tx is not int and tx is not bool  # numpy scalars: the exact check decides


def _k_floor_divide(xp: Any, x1: Any, x2: Any) -> Any:
    if xp is not np or not (_maybe_inf(x1) or _maybe_inf(x2)):
        return xp.floor_divide(x1, x2)
    a, b = np.asarray(x1), np.asarray(x2)
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if not (inf_a.any() or inf_b.any()):
        return np.floor_divide(x1, x2)
    # The standard's special cases numpy misses (it gives NaN for inf // 2, with an
    # "invalid value" warning, and -1 for -1 // inf): where one operand is infinite and
    # the other finite, the result is the true quotient, an infinity or a signed zero.
    with np.errstate(invalid="ignore"):  # numpy's NaN there is replaced below
        q = np.floor_divide(x1, x2)
    if q.dtype.kind != "f":
        return q
    mask = (inf_a & np.isfinite(b)) | (np.isfinite(a) & inf_b)
    q = np.array(q)  # writable, also when numpy gave a scalar
    with np.errstate(all="ignore"):  # the quotient elsewhere (inf / inf) is not used
        np.copyto(q, np.true_divide(a, b), casting="unsafe", where=mask)
    return q


# fmt: off
@op("add", data=2, cost=M, plain=True, ufunc=True)
def add(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 + x2``."""

@op("subtract", data=2, cost=M, plain=True, ufunc=True)
def subtract(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 - x2``."""

@op("multiply", data=2, cost=M, plain=True, ufunc=True)
def multiply(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 * x2``."""

@op("true_divide", data=2, cost=M, plain=True, ufunc=True)  # as fast as multiply (measured)
def divide(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 / x2`` (true division)."""

@op(_k_floor_divide, data=2, cost=Cost.DIVMOD, plain=True)
def floor_divide(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 // x2``."""

@op("remainder", data=2, cost=Cost.DIVMOD, plain=True, ufunc=True)
def remainder(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 % x2`` (sign of the divisor, as python)."""

@op("power", data=2, cost=F, plain=True, ufunc=True)
def pow(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 ** x2``."""

@op("maximum", data=2, cost=M, plain=True, ufunc=True)
def maximum(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise maximum (NaN propagates)."""

@op("minimum", data=2, cost=M, plain=True, ufunc=True)
def minimum(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise minimum (NaN propagates)."""

@op("equal", data=2, cost=M, plain=True, ufunc=True)
def equal(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 == x2`` (bool)."""

@op("not_equal", data=2, cost=M, plain=True, ufunc=True)
def not_equal(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 != x2`` (bool)."""

@op("less", data=2, cost=M, plain=True, ufunc=True)
def less(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 < x2`` (bool)."""

@op("less_equal", data=2, cost=M, plain=True, ufunc=True)
def less_equal(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 <= x2`` (bool)."""

@op("greater", data=2, cost=M, plain=True, ufunc=True)
def greater(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 > x2`` (bool)."""

@op("greater_equal", data=2, cost=M, plain=True, ufunc=True)
def greater_equal(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 >= x2`` (bool)."""

@op("logical_and", data=2, cost=M, plain=True, ufunc=True)
def logical_and(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise logical and (bool)."""

@op("logical_or", data=2, cost=M, plain=True, ufunc=True)
def logical_or(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise logical or (bool)."""

@op("negative", data=1, cost=M, plain=True, ufunc=True)
def negative(x: TensorLike, /) -> None:
    """Element-wise ``-x``."""

@op("absolute", data=1, cost=M, plain=True, ufunc=True)
def abs(x: TensorLike, /) -> None:
    """Element-wise absolute value."""

@op("sign", data=1, cost=M, plain=True, ufunc=True)
def sign(x: TensorLike, /) -> None:
    """Element-wise sign (-1, 0 or 1)."""

@op("exp", data=1, cost=F, plain=True, ufunc=True)
def exp(x: TensorLike, /) -> None:
    """Element-wise ``e ** x``."""

@op("log", data=1, cost=F, plain=True, ufunc=True)
def log(x: TensorLike, /) -> None:
    """Element-wise natural logarithm."""

@op("log1p", data=1, cost=F, plain=True, ufunc=True)
def log1p(x: TensorLike, /) -> None:
    """Element-wise ``log(1 + x)``, exact for small x."""

@op("sqrt", data=1, cost=F, plain=True, ufunc=True)
def sqrt(x: TensorLike, /) -> None:
    """Element-wise square root."""

@op("square", data=1, cost=M, plain=True, ufunc=True)
def square(x: TensorLike, /) -> None:
    """Element-wise ``x * x``."""

@op("sin", data=1, cost=F, plain=True, ufunc=True)
def sin(x: TensorLike, /) -> None:
    """Element-wise sine."""

@op("cos", data=1, cost=F, plain=True, ufunc=True)
def cos(x: TensorLike, /) -> None:
    """Element-wise cosine."""

@op("tanh", data=1, cost=F, plain=True, ufunc=True)
def tanh(x: TensorLike, /) -> None:
    """Element-wise hyperbolic tangent."""

@op(_k_sigmoid, data=1, cost=F, plain=True)
def sigmoid(x: TensorLike, /) -> None:
    """Element-wise logistic sigmoid ``1 / (1 + e ** -x)``, without overflow."""

@op(_k_relu, data=1, cost=M, plain=True)
def relu(x: TensorLike, /) -> None:
    """Element-wise ``max(x, 0)``."""

@op("floor", data=1, cost=M, plain=True, ufunc=True)
def floor(x: TensorLike, /) -> None:
    """Element-wise floor."""

@op("ceil", data=1, cost=M, plain=True, ufunc=True)
def ceil(x: TensorLike, /) -> None:
    """Element-wise ceiling."""

@op("logical_not", data=1, cost=M, plain=True, ufunc=True)
def logical_not(x: TensorLike, /) -> None:
    """Element-wise logical not (bool)."""

@op("isnan", data=1, cost=M, plain=True, ufunc=True)
def isnan(x: TensorLike, /) -> None:
    """Element-wise whether NaN (bool)."""

@op("isfinite", data=1, cost=M, plain=True, ufunc=True)
def isfinite(x: TensorLike, /) -> None:
    """Element-wise whether finite (bool)."""
# fmt: on


@op("round", data=1, cost=F)
def round(x: TensorLike, /, decimals: int = 0) -> Prepared:
    """Element-wise rounding to ``decimals`` places (halves to even, as numpy)."""
    return (x, decimals), None, None


@op(_k_clip, data=1, cost=M)
def clip(x: TensorLike, /, min: TensorLike | None = None, max: TensorLike | None = None) -> Prepared:
    """Element-wise ``x`` limited to ``[min, max]`` (either bound may be ``None``)."""
    return (x, min, max), None, None


@op("where", data=3, cost=M, plain=True)
def where(condition: TensorLike, x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1`` where ``condition`` is true, else ``x2``."""
