"""Beyond the standard: the ops a feature service or a small model reaches for.

Each op names its numpy, SciPy or PyTorch reference in its docstring and matches it
(values, shapes and, where the reference is numpy, dtypes). Float inputs keep their
dtype; integer and bool inputs to the transcendental ops give float64, as numpy's ufuncs
do. ``top_k`` returns a list ``[values, indices]`` (:class:`TopKResult`'s fields).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, TypeVar

import numpy as np

from .._errors import InvalidArgumentError
from .._kernels import as_numeric
from .._opdef import Cost, Prepared, op
from . import _erf
from ._checks import axes, check_dtype, integer, ints, real

if TYPE_CHECKING:
    from .._types import AxisLike, DTypeLike, TensorLike

__all__ = ["TopKResult"]

#: What the named tuples hold: tensors from ops, fused values inside fused functions.
T = TypeVar("T")

F, M = Cost.MATH, Cost.MEMORY
_SQRT_HALF = 1.0 / math.sqrt(2.0)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_PAD_MODES = ("constant", "edge", "reflect", "symmetric", "wrap")
_QUANTILE_METHODS = ("linear", "lower", "higher", "midpoint", "nearest")


class TopKResult(NamedTuple, Generic[T]):
    """``top_k``'s result, as ``torch.topk``'s: the values and their indices along the axis."""

    values: T
    indices: T


def _real(xp: Any, x: Any) -> Any:
    """``x`` as a real float array: float dtypes kept, integers and bool as float64."""
    a = xp.asarray(x)
    if a.dtype.kind == "f":
        return a
    if a.dtype.kind in "biu":
        return a.astype(xp.float64)
    raise TypeError(f"needs a real input, got {a.dtype}")


def _k_erf(xp: Any, x: Any) -> Any:
    return _erf.erf(x)


def _k_gelu(xp: Any, x: Any, approximate: str) -> Any:
    a = _real(xp, x)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (a + 0.044715 * a * a * a)
        return (0.5 * a * (1.0 + xp.tanh(inner))).astype(a.dtype, copy=False)
    # x * Phi(x) as 0.5 * x * erfc(-x / sqrt 2): no cancellation in the negative tail.
    return (0.5 * a * _erf.erfc(-_SQRT_HALF * a.astype(xp.float64))).astype(a.dtype, copy=False)


def _k_silu(xp: Any, x: Any) -> Any:
    a = _real(xp, x)
    # sigmoid from e = exp(-|x|): no overflow, and no cancellation in the negative tail.
    e = xp.exp(-xp.abs(a))
    return a * xp.where(a >= 0, 1.0, e) / (1.0 + e)


def _k_softplus(xp: Any, x: Any, beta: float, threshold: float) -> Any:
    a = _real(xp, x)
    bx = a * beta
    # log(1 + e^bx) = max(bx, 0) + log1p(e^-|bx|): exact everywhere, no overflow.
    soft = (xp.maximum(bx, 0) + xp.log1p(xp.exp(-xp.abs(bx)))) / beta
    return xp.where(bx > threshold, a, soft).astype(a.dtype, copy=False)


def _k_logsumexp(xp: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    a = _real(xp, x)
    peak = xp.max(a, axis=axis, keepdims=True, initial=-xp.inf)
    peak = xp.where(xp.isfinite(peak), peak, 0)  # all -inf (or an inf): no shift, as SciPy
    total = xp.sum(xp.exp(a - peak), axis=axis, keepdims=True)
    with np.errstate(divide="ignore"):  # log(0) = -inf for an empty or all -inf slice, as SciPy
        out = xp.log(total) + peak
    if not keepdims:
        out = xp.squeeze(out, axis=axis) if axis is not None else out.reshape(())
    return out.astype(a.dtype, copy=False)


def _k_one_hot(xp: Any, x: Any, num_classes: int, dtype: Any, axis: int) -> Any:
    idx = xp.asarray(x)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"needs integer class indices, got {idx.dtype}")
    if idx.size and (idx.min() < 0 or idx.max() >= num_classes):
        raise ValueError(f"class indices must be in [0, {num_classes}), got values from {idx.min()} to {idx.max()}")
    out = xp.equal(idx[..., None], xp.arange(num_classes)).astype(dtype)
    return xp.moveaxis(out, -1, axis) if axis != -1 else out


def _k_top_k(xp: Any, x: Any, k: int, axis: int, largest: bool, sorted: bool) -> list[Any]:
    a = xp.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"needs a real input, got {a.dtype}")
    if a.ndim == 0:
        raise ValueError("needs an array of at least 1 dimension, got a 0-d array")
    n = a.shape[axis]  # an IndexError for a bad axis
    if k > n:
        raise ValueError(f"k={k} is larger than the {n} elements along axis {axis}")
    if largest:
        # Descending with ties in index order and NaN first (as the largest), from a stable
        # ascending sort of the reversed axis.
        flipped = xp.flip(a, axis=axis)
        order = xp.argsort(flipped, axis=axis, kind="stable")
        top = xp.flip(xp.take(order, xp.arange(n - k, n), axis=axis), axis=axis)
        indices = (n - 1) - top
    else:
        order = xp.argsort(a, axis=axis, kind="stable")
        indices = xp.take(order, xp.arange(k), axis=axis)
    indices = indices.astype(xp.int64, copy=False)
    return [xp.take_along_axis(a, indices, axis=axis), indices]


def _k_bincount(xp: Any, x: Any, weights: Any, minlength: int) -> Any:
    idx = xp.asarray(x)
    if idx.dtype.kind not in "iub":
        raise TypeError(f"needs non-negative integers, got {idx.dtype}")
    w = None if weights is None else as_numeric(weights)
    return xp.bincount(idx, weights=w, minlength=minlength)


def _k_scatter_add(xp: Any, x: Any, indices: Any, updates: Any, axis: int) -> Any:
    a = xp.asarray(x)
    idx = xp.asarray(as_numeric(indices))
    if idx.dtype.kind not in "iu":
        raise TypeError(f"indices must be integers, got {idx.dtype}")
    if idx.ndim != 1:
        raise ValueError(f"indices must be 1-d, got shape {idx.shape}")
    upd = as_numeric(updates)
    out = a.astype(xp.result_type(a, upd), copy=True)  # functional: x itself is never changed
    moved = xp.moveaxis(out, axis, 0)  # a view: adding into it adds into out
    u = xp.asarray(upd)
    xp.add.at(moved, idx, xp.moveaxis(u, axis, 0) if u.ndim == a.ndim else u)
    return out


def _k_pad(xp: Any, x: Any, pad_width: Any, mode: str, constant_values: Any) -> Any:
    a = xp.asarray(x)
    if mode == "constant":
        return xp.pad(a, pad_width, mode="constant", constant_values=as_numeric(constant_values))
    return xp.pad(a, pad_width, mode=mode)


def _k_median(xp: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    a = xp.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"needs a real input, got {a.dtype}")
    if a.size == 0:
        raise ValueError("the median of an empty array is undefined")
    return xp.median(a, axis=axis, keepdims=keepdims)


def _k_quantile(xp: Any, x: Any, q: Any, axis: Any, keepdims: bool, method: str) -> Any:
    a = xp.asarray(x)
    if a.dtype.kind not in "biuf":
        raise TypeError(f"needs a real input, got {a.dtype}")
    if a.size == 0:
        raise ValueError("the quantile of an empty array is undefined")
    return xp.quantile(a, as_numeric(q), axis=axis, keepdims=keepdims, method=method)


def _k_layer_norm(xp: Any, x: Any, normalized_shape: tuple[int, ...], weight: Any, bias: Any, eps: float) -> Any:
    a = _real(xp, x)
    nd = len(normalized_shape)
    if a.ndim < nd or tuple(a.shape[a.ndim - nd :]) != normalized_shape:
        raise ValueError(f"normalized_shape {normalized_shape} does not match the last dimensions of shape {a.shape}")
    dims = tuple(range(a.ndim - nd, a.ndim))
    mean = xp.mean(a, axis=dims, keepdims=True)
    centered = a - mean
    var = xp.mean(centered * centered, axis=dims, keepdims=True)
    out = centered / xp.sqrt(var + eps)
    if weight is not None:
        out = out * as_numeric(weight)
    if bias is not None:
        out = out + as_numeric(bias)
    return out


def _axis(axis: AxisLike, opname: str) -> Any:
    return axes(axis, opname)


@op(_k_erf, data=1, cost=Cost.SPECIAL, plain=True)
def erf(x: TensorLike, /) -> None:
    """Element-wise error function ``2/sqrt(pi) * integral of exp(-t**2) from 0 to x`` (``scipy.special.erf``).

    Full float64 precision (W. J. Cody's rational approximations), without SciPy;
    float32 stays float32, integers give float64, complex input is refused.
    """


@op(_k_gelu, data=1, cost=Cost.SPECIAL)
def gelu(x: TensorLike, /, *, approximate: str = "none") -> Prepared:
    """Gaussian error linear unit ``x * Phi(x)`` (``torch.nn.functional.gelu``).

    ``approximate="tanh"`` gives PyTorch's ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))``.
    """
    if approximate not in ("none", "tanh"):
        raise InvalidArgumentError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r:.40}")
    return (x, approximate), None, None


@op(_k_silu, data=1, cost=F, plain=True)
def silu(x: TensorLike, /) -> None:
    """Sigmoid linear unit (swish) ``x * sigmoid(x)`` (``torch.nn.functional.silu``), without overflow."""


@op(_k_softplus, data=1, cost=F)
def softplus(x: TensorLike, /, *, beta: float = 1.0, threshold: float = 20.0) -> Prepared:
    """``log(1 + exp(beta * x)) / beta``, or ``x`` where ``beta * x > threshold`` (``torch.nn.functional.softplus``).

    Computed as ``max(bx, 0) + log1p(exp(-|bx|))``: no overflow, exact in both tails.
    """
    b = real(beta, "beta", "softplus")
    if b == 0:
        raise InvalidArgumentError("softplus: beta must not be 0")
    return (x, b, real(threshold, "threshold", "softplus")), None, None


@op(_k_logsumexp, data=1, cost=F)
def logsumexp(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """``log(sum(exp(x)))`` over ``axis``, without overflow (``scipy.special.logsumexp``).

    An empty or all ``-inf`` slice gives ``-inf``; an ``inf`` gives ``inf``.
    """
    return (x, _axis(axis, "logsumexp"), bool(keepdims)), None, None


@op(_k_one_hot, data=1, cost=Cost.UNKNOWN)
def one_hot(x: TensorLike, /, num_classes: int, *, dtype: DTypeLike | None = None, axis: int = -1) -> Prepared:
    """Integer class indices as one-hot vectors on a new ``axis`` (``torch.nn.functional.one_hot``; ``np.eye(n)[x]``).

    ``dtype`` defaults to int64 (PyTorch's); an index outside ``[0, num_classes)`` is an
    InvalidArgumentError.
    """
    n = integer(num_classes, "num_classes", "one_hot")
    if n < 1:
        raise InvalidArgumentError(f"one_hot: num_classes must be at least 1, got {n}")
    dt = check_dtype(dtype, "one_hot") or np.dtype(np.int64)
    return (x, n, dt, integer(axis, "axis", "one_hot")), None, None


@op(_k_top_k, data=1, cost=F, returns="list", result=TopKResult._make)
def top_k(x: TensorLike, k: int, /, *, axis: int = -1, largest: bool = True, sorted: bool = True) -> Prepared:
    """``[values, indices]`` of the ``k`` largest (or smallest) elements along ``axis`` (``torch.topk``).

    Sorted (largest first, or smallest first); ties keep index order; NaN counts as the
    largest value. Indices are int64. ``sorted=False`` is accepted and gives the same order.
    """
    n = integer(k, "k", "top_k")
    if n < 0:
        raise InvalidArgumentError(f"top_k: k must be >= 0, got {n}")
    return (x, n, integer(axis, "axis", "top_k"), bool(largest), bool(sorted)), None, None


@op(_k_bincount, data=1, cost=Cost.UNKNOWN)
def bincount(x: TensorLike, /, weights: TensorLike | None = None, *, minlength: int = 0) -> Prepared:
    """Occurrences of each value ``0 .. max(x)`` in the 1-d non-negative integer ``x`` (``numpy.bincount``).

    With ``weights``, their sums instead of counts. The length, ``max(max(x) + 1,
    minlength)``, depends on the data.
    """
    m = integer(minlength, "minlength", "bincount")
    if m < 0:
        raise InvalidArgumentError(f"bincount: minlength must be >= 0, got {m}")
    return (x, weights, m), None, None


@op(_k_scatter_add, data=3, cost=Cost.INDEX)
def scatter_add(x: TensorLike, indices: TensorLike, updates: TensorLike, /, *, axis: int = 0) -> Prepared:
    """A copy of ``x`` with ``updates`` added at ``indices`` along ``axis``, repeats accumulating.

    Functional index-add: ``torch.Tensor.index_add(axis, indices, updates)`` and
    ``numpy.add.at`` on a copy. ``indices`` is 1-d; ``updates`` has ``x``'s shape with
    ``len(indices)`` along ``axis`` (or broadcasts to it). The dtype is ``x``'s promoted
    with ``updates``'.
    """
    return (x, indices, updates, integer(axis, "axis", "scatter_add")), None, None


@op(_k_pad, data=1, cost=Cost.UNKNOWN)
def pad(
    x: TensorLike,
    /,
    pad_width: int | Sequence[int] | Sequence[Sequence[int]],
    *,
    mode: str = "constant",
    constant_values: float = 0,
) -> Prepared:
    """``x`` padded by ``pad_width`` (``numpy.pad``): per axis ``(before, after)``, or one pair or width for all.

    ``mode``: ``"constant"`` (``constant_values``), ``"edge"``, ``"reflect"``,
    ``"symmetric"`` or ``"wrap"``.
    """
    if mode not in _PAD_MODES:
        raise InvalidArgumentError(f"pad: mode must be one of {', '.join(_PAD_MODES)}; got {mode!r:.40}")
    if isinstance(pad_width, int | np.integer):
        width: Any = integer(pad_width, "pad_width", "pad")
    else:
        try:
            width = tuple(ints(w, "pad_width", "pad") for w in pad_width)
        except TypeError:
            raise InvalidArgumentError(f"pad: pad_width must be ints or pairs of ints, got {pad_width!r:.60}") from None
    return (x, width, mode, constant_values), None, None


@op(_k_median, data=1, cost=F)
def median(x: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False) -> Prepared:
    """Median over ``axis`` (``numpy.median``: the mean of the two middle values for an even count)."""
    return (x, _axis(axis, "median"), bool(keepdims)), None, None


@op(_k_quantile, data=2, cost=F)
def quantile(
    x: TensorLike, q: TensorLike, /, *, axis: AxisLike = None, keepdims: bool = False, method: str = "linear"
) -> Prepared:
    """The ``q``-th quantiles (``q`` in ``[0, 1]``, a number or 1-d) over ``axis`` (``numpy.quantile``).

    ``method``: ``"linear"``, ``"lower"``, ``"higher"``, ``"midpoint"`` or ``"nearest"``.
    An array ``q`` puts its axis first in the result.
    """
    if method not in _QUANTILE_METHODS:
        raise InvalidArgumentError(
            f"quantile: method must be one of {', '.join(_QUANTILE_METHODS)}; got {method!r:.40}"
        )
    return (x, q, _axis(axis, "quantile"), bool(keepdims), method), None, None


@op(_k_layer_norm, data=1, cost=F)
def layer_norm(
    x: TensorLike,
    normalized_shape: int | Sequence[int],
    /,
    weight: TensorLike | None = None,
    bias: TensorLike | None = None,
    *,
    eps: float = 1e-5,
) -> Prepared:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last dimensions (``torch.nn.functional.layer_norm``).

    ``normalized_shape`` names those dimensions (it must equal the end of ``x``'s shape);
    the variance is the biased one, as PyTorch's.
    """
    shape = ints(normalized_shape, "normalized_shape", "layer_norm")
    dims = (shape,) if isinstance(shape, int) else shape
    e = real(eps, "eps", "layer_norm")
    if e < 0:
        raise InvalidArgumentError(f"layer_norm: eps must be >= 0, got {e}")
    return (x, dims, weight, bias, e), None, None
