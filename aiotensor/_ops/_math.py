"""The Array API standard's other element-wise functions: trigonometry, logarithms, bits, parts.

Each is one numpy ufunc under the standard's name (``acos`` is numpy's ``arccos``), with
numpy's broadcasting and type promotion; ``real`` and ``imag`` are two-line kernels.
numpy meets the standard's special cases (NaN, signed zeros, infinities) for all of
these, so no kernel patches a result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .._opdef import Cost, op

if TYPE_CHECKING:
    from .._types import TensorLike

M, F = Cost.MEMORY, Cost.MATH


def _k_real(xp: Any, x: Any) -> Any:
    x = xp.asarray(x)
    # numpy gives a real array itself back: copy, so the result never aliases its input.
    return xp.real(x) if x.dtype.kind == "c" else x.copy()


def _k_imag(xp: Any, x: Any) -> Any:
    x = xp.asarray(x)
    return xp.imag(x) if x.dtype.kind == "c" else xp.zeros_like(x)


# fmt: off
@op("arccos", data=1, cost=F, plain=True, ufunc=True)
def acos(x: TensorLike, /) -> None:
    """Element-wise inverse cosine, in radians (``numpy.arccos``)."""

@op("arccosh", data=1, cost=F, plain=True, ufunc=True)
def acosh(x: TensorLike, /) -> None:
    """Element-wise inverse hyperbolic cosine (``numpy.arccosh``)."""

@op("arcsin", data=1, cost=F, plain=True, ufunc=True)
def asin(x: TensorLike, /) -> None:
    """Element-wise inverse sine, in radians (``numpy.arcsin``)."""

@op("arcsinh", data=1, cost=F, plain=True, ufunc=True)
def asinh(x: TensorLike, /) -> None:
    """Element-wise inverse hyperbolic sine (``numpy.arcsinh``)."""

@op("arctan", data=1, cost=F, plain=True, ufunc=True)
def atan(x: TensorLike, /) -> None:
    """Element-wise inverse tangent, in radians (``numpy.arctan``)."""

@op("arctan2", data=2, cost=F, plain=True, ufunc=True)
def atan2(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise angle of the point ``(x2, x1)``, quadrant-aware (``numpy.arctan2``)."""

@op("arctanh", data=1, cost=F, plain=True, ufunc=True)
def atanh(x: TensorLike, /) -> None:
    """Element-wise inverse hyperbolic tangent (``numpy.arctanh``)."""

@op("tan", data=1, cost=F, plain=True, ufunc=True)
def tan(x: TensorLike, /) -> None:
    """Element-wise tangent."""

@op("sinh", data=1, cost=F, plain=True, ufunc=True)
def sinh(x: TensorLike, /) -> None:
    """Element-wise hyperbolic sine."""

@op("cosh", data=1, cost=F, plain=True, ufunc=True)
def cosh(x: TensorLike, /) -> None:
    """Element-wise hyperbolic cosine."""

@op("expm1", data=1, cost=F, plain=True, ufunc=True)
def expm1(x: TensorLike, /) -> None:
    """Element-wise ``e ** x - 1``, exact for small x."""

@op("log2", data=1, cost=F, plain=True, ufunc=True)
def log2(x: TensorLike, /) -> None:
    """Element-wise base-2 logarithm."""

@op("log10", data=1, cost=F, plain=True, ufunc=True)
def log10(x: TensorLike, /) -> None:
    """Element-wise base-10 logarithm."""

@op("logaddexp", data=2, cost=F, plain=True, ufunc=True)
def logaddexp(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``log(exp(x1) + exp(x2))``, without overflow."""

@op("hypot", data=2, cost=F, plain=True, ufunc=True)
def hypot(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``sqrt(x1 ** 2 + x2 ** 2)``, without overflow."""

@op("copysign", data=2, cost=M, plain=True, ufunc=True)
def copysign(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``|x1|`` with the sign of ``x2`` (signed zeros and NaN signs included)."""

@op("nextafter", data=2, cost=M, plain=True, ufunc=True)
def nextafter(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise next representable float after ``x1`` towards ``x2``."""

@op("reciprocal", data=1, cost=M, plain=True, ufunc=True)
def reciprocal(x: TensorLike, /) -> None:
    """Element-wise ``1 / x`` (``numpy.reciprocal``: integer input gives integer results)."""

@op("positive", data=1, cost=M, plain=True, ufunc=True)
def positive(x: TensorLike, /) -> None:
    """Element-wise ``+x`` (a copy of numeric ``x``)."""

@op("trunc", data=1, cost=M, plain=True, ufunc=True)
def trunc(x: TensorLike, /) -> None:
    """Element-wise rounding towards zero."""

@op("signbit", data=1, cost=M, plain=True, ufunc=True)
def signbit(x: TensorLike, /) -> None:
    """Element-wise whether the sign bit is set (true for ``-0.0``; bool)."""

@op("isinf", data=1, cost=M, plain=True, ufunc=True)
def isinf(x: TensorLike, /) -> None:
    """Element-wise whether ``+inf`` or ``-inf`` (bool)."""

@op("conjugate", data=1, cost=M, plain=True, ufunc=True)
def conj(x: TensorLike, /) -> None:
    """Element-wise complex conjugate (real input unchanged)."""

@op(_k_real, data=1, cost=M, plain=True)
def real(x: TensorLike, /) -> None:
    """Element-wise real part (``float32`` for ``complex64``; real input copied)."""

@op(_k_imag, data=1, cost=M, plain=True)
def imag(x: TensorLike, /) -> None:
    """Element-wise imaginary part (``float32`` for ``complex64``; zeros for real input)."""

@op("logical_xor", data=2, cost=M, plain=True, ufunc=True)
def logical_xor(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise logical exclusive or (bool)."""

@op("bitwise_and", data=2, cost=M, plain=True, ufunc=True)
def bitwise_and(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise bitwise ``x1 & x2`` (integer or bool)."""

@op("bitwise_or", data=2, cost=M, plain=True, ufunc=True)
def bitwise_or(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise bitwise ``x1 | x2`` (integer or bool)."""

@op("bitwise_xor", data=2, cost=M, plain=True, ufunc=True)
def bitwise_xor(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise bitwise ``x1 ^ x2`` (integer or bool)."""

@op("invert", data=1, cost=M, plain=True, ufunc=True)
def bitwise_invert(x: TensorLike, /) -> None:
    """Element-wise bitwise ``~x`` (integer or bool)."""

@op("left_shift", data=2, cost=M, plain=True, ufunc=True)
def bitwise_left_shift(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 << x2`` (integers; ``x2`` non-negative)."""

@op("right_shift", data=2, cost=M, plain=True, ufunc=True)
def bitwise_right_shift(x1: TensorLike, x2: TensorLike, /) -> None:
    """Element-wise ``x1 >> x2``, arithmetic for signed integers (``x2`` non-negative)."""
# fmt: on
