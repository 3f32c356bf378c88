"""The error function in numpy, to full float64 precision (SciPy is not a dependency).

W. J. Cody's rational Chebyshev approximations ("Rational Chebyshev approximations for
the error function", Math. Comp. 23 (1969) 631-637; SPECFUN's ``CALERF``, which SciPy's
``erf`` descends from): ``erf`` on ``|x| <= 0.46875``, ``erfc`` on ``0.46875 < |x| <= 4``
and, asymptotically, beyond; ``erfc(x) = 0`` past ``x = 27.3`` (it underflows).
Small arrays (``SMALL`` elements or fewer) take ``math.erf`` per element instead.
Relative error is below 1e-15 over the whole line (checked element by element against
``math.erf`` in ``tests/test_ops_nn.py``). Each region is evaluated on its own elements
only, so no branch's overflow or NaN leaks into another's.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._types import NDArray

__all__ = ["erf", "erfc"]

_A = (3.16112374387056560e00, 1.13864154151050156e02, 3.77485237685302021e02, 3.20937758913846947e03)
_A4 = 1.85777706184603153e-1
_B = (2.36012909523441209e01, 2.44024637934444173e02, 1.28261652607737228e03, 2.84423683343917062e03)
_C = (
    5.64188496988670089e-1,
    8.88314979438837594e00,
    6.61191906371416295e01,
    2.98635138197400131e02,
    8.81952221241769090e02,
    1.71204761263407058e03,
    2.05107837782607147e03,
    1.23033935479799725e03,
)
_C8 = 2.15311535474403846e-8
_D = (
    1.57449261107098347e01,
    1.17693950891312499e02,
    5.37181101862009858e02,
    1.62138957456669019e03,
    3.29079923573345963e03,
    4.36261909014324716e03,
    3.43936767414372164e03,
    1.23033935480374942e03,
)
_P = (
    3.05326634961232344e-1,
    3.60344899949804439e-1,
    1.25781726111229246e-1,
    1.60837851487422766e-2,
    6.58749161529837803e-4,
)
_P5 = 1.63153871373020978e-2
_Q = (
    2.56852019228982242e00,
    1.87295284992346047e00,
    5.27905102951428412e-1,
    6.05183413124413191e-2,
    2.33520497626869185e-3,
)
_SQRPI = 5.6418958354775628695e-1  # 1 / sqrt(pi)
_THRESH = 0.46875
_XBIG = 27.3  # erfc(x) underflows to 0 beyond (below 5e-324)


def _ratio(z: NDArray, lead: float, p: tuple[float, ...], q: tuple[float, ...]) -> NDArray:
    """Cody's ``(lead z^k + p0 z^(k-1) + ... + p_last) / (z^k + q0 z^(k-1) + ... + q_last)``, by Horner."""
    # In place throughout: a fresh temporary per step costs more than the arithmetic.
    num = lead * z
    num += p[0]
    den = z + q[0]
    for a, b in zip(p[1:], q[1:], strict=True):
        num *= z
        num += a
        den *= z
        den += b
    num /= den
    return num


def _small(x: NDArray) -> NDArray:
    """erf(x) for |x| <= 0.46875 (odd: the sign of x, -0.0 included, is kept)."""
    r = _ratio(x * x, _A4, _A, _B)
    r *= x
    return r


def _erfc_positive(y: NDArray) -> NDArray:
    """erfc(y) for y > 0.46875 (smaller y are treated as 0.46875; NaN stays NaN)."""
    # Whole-array evaluation of each region, then one select: boolean gathers and
    # scatters cost more than the arithmetic they would save.
    out = _erfc_mid(np.clip(y, _THRESH, 4.0))
    if np.nanmax(y, initial=0.0) > 4.0:
        far = _erfc_far(np.clip(y, 4.0, _XBIG))
        out = np.where(y <= 4.0, out, far)
        out[y >= _XBIG] = 0.0  # underflowed: not the value at the clip
    return out


def _erfc_mid(v: NDArray) -> NDArray:
    r = _ratio(v, _C8, _C, _D)
    r *= _exp_minus_square(v)
    return r


def _erfc_far(v: NDArray) -> NDArray:
    z = 1.0 / (v * v)
    r = _ratio(z, _P5, _P, _Q)
    r *= z
    np.subtract(_SQRPI, r, out=r)
    r /= v
    r *= _exp_minus_square(v)
    return r


def _exp_minus_square(v: NDArray) -> NDArray:
    # exp(-v*v) without the rounding error of v*v: split v into a short part and the rest.
    head = v * 16.0
    np.trunc(head, out=head)
    head /= 16.0
    rest = v - head
    rest *= v + head
    head *= head
    np.negative(head, out=head)
    np.negative(rest, out=rest)
    # Two exps, not exp(-(head^2 + rest)): head^2 is exact (head has 4 fraction bits),
    # while rounding the sum would cost up to ~1e-13 of relative accuracy.
    np.exp(head, out=head)
    np.exp(rest, out=rest)
    head *= rest
    return head


def _float64(x: Any) -> tuple[NDArray, np.dtype[Any]]:
    a = np.asarray(x)
    if a.dtype.kind == "c":
        raise TypeError(f"needs a real input, got {a.dtype}")
    if a.dtype.kind not in "biuf":
        raise TypeError(f"needs a numeric input, got {a.dtype}")
    out_dtype = a.dtype if a.dtype.kind == "f" else np.dtype(np.float64)
    return a.astype(np.float64, copy=False), out_dtype


#: Arrays of at most this many elements go through ``math.erf`` element by element: about
#: 80 numpy calls (~70 µs) cost more than that many C calls (libm's erf is as accurate).
SMALL = 512


def erf(x: Any) -> NDArray:
    """The error function, element-wise; float inputs keep their dtype, others give float64."""
    a, out_dtype = _float64(x)
    if a.size <= SMALL:
        return np.array([math.erf(v) for v in a.ravel().tolist()]).reshape(a.shape).astype(out_dtype)
    with np.errstate(under="ignore"):  # exp(-y*y) underflows in the far tail, by design
        y = np.abs(a)
        large = (0.5 - _erfc_positive(y)) + 0.5
        np.copysign(large, a, out=large)
        out = np.where(y <= _THRESH, _small(np.clip(a, -_THRESH, _THRESH)), large)
    return out.astype(out_dtype, copy=False)


def erfc(x: Any) -> NDArray:
    """The complementary error function ``1 - erf(x)``, element-wise, accurate where it is tiny."""
    a, out_dtype = _float64(x)
    if a.size <= SMALL:
        return np.array([math.erfc(v) for v in a.ravel().tolist()]).reshape(a.shape).astype(out_dtype)
    with np.errstate(under="ignore"):
        y = np.abs(a)
        tail = _erfc_positive(y)
        large = np.where(a < 0, 2.0 - tail, tail)
        out = np.where(y <= _THRESH, 1.0 - _small(np.clip(a, -_THRESH, _THRESH)), large)
    return out.astype(out_dtype, copy=False)
