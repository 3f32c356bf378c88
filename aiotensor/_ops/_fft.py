"""The Array API standard's ``fft`` extension (2024.12), as ops.

The transforms follow the standard and ``array_api_strict.fft``: ``fft``/``ifft``/
``fftn``/``ifftn``/``irfft``/``irfftn``/``hfft`` take complex input, ``rfft``/``rfftn``/
``ihfft`` real floating-point input, and the precision is kept (complex64 in, complex64
out; float32 in, complex64 out), where numpy before 2.0 upcast to double. ``norm`` is
``"backward"`` (no scaling forward, ``1/n`` back), ``"ortho"`` or ``"forward"``.

Cost: the transforms are ``Cost.MATH`` (n log n, measured at about transcendental speed
per byte); the estimate sizes the output as the input, so a large ``n``/``s`` padding
beyond the input is under-counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .._devices import canonical_device
from .._errors import InvalidArgumentError
from .._opdef import Cost, Prepared, op
from ._checks import FLOAT64, check_dtype, count, count_bytes, integer, real

if TYPE_CHECKING:
    from .._types import DTypeLike, TensorLike

F = Cost.MATH
_NORMS = ("backward", "ortho", "forward")
_COMPLEX = {np.dtype(np.float32): np.dtype(np.complex64), np.dtype(np.float64): np.dtype(np.complex128)}
_REAL = {c: r for r, c in _COMPLEX.items()}


def _input(xp: Any, x: Any, kind: str, *, vector: bool = True) -> Any:
    a = xp.asarray(x)
    if kind == "c" and a.dtype not in _REAL:
        raise TypeError(f"needs a complex floating-point input (complex64 or complex128), got {a.dtype}")
    if kind == "f" and a.dtype not in _COMPLEX:
        raise TypeError(f"needs a real floating-point input (float32 or float64), got {a.dtype}")
    if vector and a.ndim == 0:  # (the n-d transforms of a 0-d array transform no axis, as numpy)
        raise ValueError("needs an array of at least 1 dimension, got a 0-d array")
    return a


def _k_1d(xp: Any, x: Any, fn: str, n: int | None, axis: int, norm: str) -> Any:
    kind = "f" if fn in ("rfft", "ihfft") else "c"
    a = _input(xp, x, kind)
    out = getattr(xp.fft, fn)(a, n=n, axis=axis, norm=norm)
    # The standard keeps the input's precision (numpy < 2 computed in double).
    want = _COMPLEX[a.dtype] if kind == "f" else (_REAL[a.dtype] if fn in ("irfft", "hfft") else a.dtype)
    return out.astype(want, copy=False)


def _k_nd(xp: Any, x: Any, fn: str, s: tuple[int, ...] | None, axes: tuple[int, ...] | None, norm: str) -> Any:
    kind = "f" if fn == "rfftn" else "c"
    a = _input(xp, x, kind, vector=False)
    if axes is None:
        # The standard: all axes, or the last len(s) when only s is given (numpy's old default).
        axes = tuple(range(a.ndim)) if s is None else tuple(range(a.ndim - len(s), a.ndim))
    if s is not None:
        if len(s) != len(axes):
            raise ValueError(f"s {s} and axes {axes} must have the same length")
        if len(s) > a.ndim:
            raise ValueError(f"s {s} has more entries than the input has dimensions ({a.ndim})")
        # -1 means the input's own length along that axis (for irfftn's last axis, 2 * (m - 1)).
        last = len(s) - 1
        s = tuple(
            (2 * (a.shape[ax] - 1) if fn == "irfftn" and i == last else a.shape[ax]) if v == -1 else v
            for i, (v, ax) in enumerate(zip(s, axes, strict=True))
        )
    out = getattr(xp.fft, fn)(a, s=s, axes=axes, norm=norm)
    want = _COMPLEX[a.dtype] if kind == "f" else (_REAL[a.dtype] if fn == "irfftn" else a.dtype)
    return out.astype(want, copy=False)


def _k_freq(xp: Any, fn: str, n: int, d: float, dtype: Any) -> Any:
    return getattr(xp.fft, fn)(n, d=d).astype(dtype, copy=False)


def _k_shift(xp: Any, x: Any, fn: str, axes: Any) -> Any:
    a = xp.asarray(x)
    if a.dtype.kind not in "fc":
        raise TypeError(f"needs a floating-point input, got {a.dtype}")
    return getattr(xp.fft, fn)(a, axes=axes)


def _norm(norm: str, opname: str) -> str:
    if norm not in _NORMS:
        raise InvalidArgumentError(f"{opname}: norm must be 'backward', 'ortho' or 'forward', got {norm!r:.40}")
    return norm


def _length(n: int | None, opname: str) -> int | None:
    if n is None:
        return None
    v = integer(n, "n", opname)
    if v < 1:
        raise InvalidArgumentError(f"{opname}: n must be at least 1, got {v}")
    return v


def _ints(value: Sequence[int] | None, what: str, opname: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int | np.integer):
        raise InvalidArgumentError(f"{opname}: {what} must be a sequence of ints, got {value!r}")
    try:
        out = tuple(integer(v, what, opname) for v in value)
    except TypeError:
        raise InvalidArgumentError(f"{opname}: {what} must be a sequence of ints, got {value!r:.40}") from None
    return out


def _one(fn: str, x: TensorLike, n: int | None, axis: int, norm: str) -> Prepared:
    return (x, fn, _length(n, fn), integer(axis, "axis", fn), _norm(norm, fn)), None, None


def _many(fn: str, x: TensorLike, s: Sequence[int] | None, axes: Sequence[int] | None, norm: str) -> Prepared:
    sizes = _ints(s, "s", fn)
    if sizes is not None and any(v < 1 and v != -1 for v in sizes):
        raise InvalidArgumentError(f"{fn}: the entries of s must be at least 1 (or -1: the input's size), got {s}")
    return (x, fn, sizes, _ints(axes, "axes", fn), _norm(norm, fn)), None, None


def _freq(fn: str, n: int, d: float, dtype: DTypeLike | None, device: str | None) -> Prepared:
    length = count(n, "n", fn)
    if length < 1:
        raise InvalidArgumentError(f"{fn}: n must be at least 1, got {length}")
    dt = check_dtype(dtype, fn) or FLOAT64
    if dt not in _COMPLEX:
        raise InvalidArgumentError(f"{fn}: dtype must be a real floating-point dtype (float32, float64), got {dt}")
    if device is not None:
        canonical_device(device)  # a malformed name raises; placement picks the device
    size = length // 2 + 1 if fn == "rfftfreq" else length
    return (fn, length, real(d, "d", fn), dt), None, count_bytes((size,), dt)


def _shift(fn: str, x: TensorLike, axes: int | Sequence[int] | None) -> Prepared:
    if axes is None:
        return (x, fn, None), None, None
    if isinstance(axes, int | np.integer):
        return (x, fn, integer(axes, "axes", fn)), None, None
    return (x, fn, _ints(axes, "axes", fn)), None, None


@op(_k_1d, data=1, cost=F)
def fft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """One-dimensional discrete Fourier transform of complex ``x`` along ``axis`` (``numpy.fft.fft``).

    ``n`` crops or zero-pads the input to that length first. complex64 stays complex64.
    """
    return _one("fft", x, n, axis, norm)


@op(_k_1d, data=1, cost=F)
def ifft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """Inverse of ``fft`` along ``axis`` (``numpy.fft.ifft``)."""
    return _one("ifft", x, n, axis, norm)


@op(_k_nd, data=1, cost=F)
def fftn(
    x: TensorLike, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None, norm: str = "backward"
) -> Prepared:
    """N-dimensional discrete Fourier transform of complex ``x`` over ``axes`` (all if ``None``; ``numpy.fft.fftn``).

    ``s`` crops or zero-pads each transformed axis (``-1``: keep its size).
    """
    return _many("fftn", x, s, axes, norm)


@op(_k_nd, data=1, cost=F)
def ifftn(
    x: TensorLike, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None, norm: str = "backward"
) -> Prepared:
    """Inverse of ``fftn`` (``numpy.fft.ifftn``)."""
    return _many("ifftn", x, s, axes, norm)


@op(_k_1d, data=1, cost=F)
def rfft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """Fourier transform of real ``x`` along ``axis``, the ``n // 2 + 1`` non-negative frequencies (``numpy.fft.rfft``).

    float32 gives complex64, float64 complex128.
    """
    return _one("rfft", x, n, axis, norm)


@op(_k_1d, data=1, cost=F)
def irfft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """Inverse of ``rfft``: a real signal of length ``n`` (default ``2 * (m - 1)``; ``numpy.fft.irfft``)."""
    return _one("irfft", x, n, axis, norm)


@op(_k_nd, data=1, cost=F)
def rfftn(
    x: TensorLike, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None, norm: str = "backward"
) -> Prepared:
    """N-dimensional ``rfft`` of real ``x`` (the last axis halved; ``numpy.fft.rfftn``)."""
    return _many("rfftn", x, s, axes, norm)


@op(_k_nd, data=1, cost=F)
def irfftn(
    x: TensorLike, /, *, s: Sequence[int] | None = None, axes: Sequence[int] | None = None, norm: str = "backward"
) -> Prepared:
    """Inverse of ``rfftn``: a real result (``numpy.fft.irfftn``)."""
    return _many("irfftn", x, s, axes, norm)


@op(_k_1d, data=1, cost=F)
def hfft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """Fourier transform of a Hermitian-symmetric signal given by its first half: a real result (``numpy.fft.hfft``)."""
    return _one("hfft", x, n, axis, norm)


@op(_k_1d, data=1, cost=F)
def ihfft(x: TensorLike, /, *, n: int | None = None, axis: int = -1, norm: str = "backward") -> Prepared:
    """Inverse of ``hfft`` for real ``x``: the non-negative half of its spectrum (``numpy.fft.ihfft``)."""
    return _one("ihfft", x, n, axis, norm)


@op(_k_freq, cost=Cost.CREATE)
def fftfreq(n: int, /, *, d: float = 1.0, dtype: DTypeLike | None = None, device: str | None = None) -> Prepared:
    """The sample frequencies of an ``n``-point ``fft`` with sample spacing ``d`` (``numpy.fft.fftfreq``).

    ``dtype`` is a real floating-point dtype (default float64); ``device`` names a device.
    """
    return _freq("fftfreq", n, d, dtype, device)


@op(_k_freq, cost=Cost.CREATE)
def rfftfreq(n: int, /, *, d: float = 1.0, dtype: DTypeLike | None = None, device: str | None = None) -> Prepared:
    """The ``n // 2 + 1`` non-negative sample frequencies of an ``n``-point ``rfft`` (``numpy.fft.rfftfreq``)."""
    return _freq("rfftfreq", n, d, dtype, device)


@op(_k_shift, data=1, cost=Cost.MEMORY)
def fftshift(x: TensorLike, /, *, axes: int | Sequence[int] | None = None) -> Prepared:
    """The zero-frequency term moved to the centre of ``axes`` (all if ``None``; ``numpy.fft.fftshift``)."""
    return _shift("fftshift", x, axes)


@op(_k_shift, data=1, cost=Cost.MEMORY)
def ifftshift(x: TensorLike, /, *, axes: int | Sequence[int] | None = None) -> Prepared:
    """Inverse of ``fftshift`` (``numpy.fft.ifftshift``)."""
    return _shift("ifftshift", x, axes)
