"""Keys by value of constants: what tells two constants apart exactly as their results differ.

:func:`scalar_key` is the one value key of scalar constants, used by expression
signatures (``_expr``: the key of the compiled-program cache) and by the compiler's
common-subexpression merging (``_programs/_compile``). :data:`SCALARS` and
:data:`HASHED_BY_VALUE` name the Python types an expression's signature keys by
value; anything else (an array, a user's object) is told apart by identity only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["HASHED_BY_VALUE", "SCALARS", "scalar_key"]

#: Keyed by themselves (their equality is their identity of value).
HASHED_BY_VALUE = frozenset({str, type(None), type(Ellipsis)})
#: Keyed by :func:`scalar_key`.
SCALARS = frozenset({int, bool, float, complex})


def scalar_key(x: Any) -> Any:
    """A key telling scalars apart exactly as their results differ, or None (never equal).

    The one value key of constants, used by expression signatures (the compiled-program
    cache) and by the compiler's common-subexpression merging: ``0.0`` and ``-0.0``
    (and complex numbers whose parts differ only in the sign of a zero) give different
    results, so they get different keys; a NaN is never equal to itself, so it gets
    None. Numpy scalars are keyed by type and bytes (NEP 50: their type matters; any
    dtype, ``longdouble`` included, without converting to a Python number).
    """
    tx = type(x)
    if tx is int or tx is bool:
        return (tx, x)
    if tx is float:
        # 0.0 == -0.0 but they differ in results; NaN: never equal to itself
        return (float, x, math.copysign(1.0, x)) if x == x else None
    if tx is complex:
        re, im = x.real, x.imag
        if re != re or im != im:
            return None
        return (complex, re, math.copysign(1.0, re), im, math.copysign(1.0, im))
    if isinstance(x, np.generic) and x.dtype.kind in "biufc":
        if x.dtype.kind in "fc" and np.isnan(x):
            return None
        return (tx, x.tobytes())
    return None
