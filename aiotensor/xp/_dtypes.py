"""The standard's data types and data type functions: Python objects, returned directly (nothing is lazy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._expr import Operand

__all__ = [
    "DTYPES",
    "bool_",
    "can_cast",
    "complex64",
    "complex128",
    "dtype_of",
    "finfo",
    "float32",
    "float64",
    "iinfo",
    "int8",
    "int16",
    "int32",
    "int64",
    "isdtype",
    "result_type",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
]

bool_ = np.dtype(np.bool_)
int8, int16, int32, int64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float32, float64 = np.dtype(np.float32), np.dtype(np.float64)
complex64, complex128 = np.dtype(np.complex64), np.dtype(np.complex128)
#: Every data type of the standard, by its name.
DTYPES: dict[str, np.dtype[Any]] = {
    "bool": bool_,
    "int8": int8,
    "int16": int16,
    "int32": int32,
    "int64": int64,
    "uint8": uint8,
    "uint16": uint16,
    "uint32": uint32,
    "uint64": uint64,
    "float32": float32,
    "float64": float64,
    "complex64": complex64,
    "complex128": complex128,
}


def dtype_of(x: Any) -> np.dtype[Any]:
    """The dtype of a dtype, tensor, expression or array (an expression's must be known before it runs)."""
    if isinstance(x, Operand | np.ndarray | np.generic):
        dt = getattr(x, "dtype", None)
        if dt is None:
            raise TypeError("the dtype of this expression is known only when it runs: await it first")
        found: np.dtype[Any] = np.dtype(dt)
        return found
    out: np.dtype[Any] = np.dtype(x)
    return out


def result_type(*arrays_and_dtypes: Any) -> np.dtype[Any]:
    """The dtype the standard's type promotion gives (numpy 2's rules for mixed kinds; scalars are weak)."""
    if not arrays_and_dtypes:
        raise ValueError("result_type: at least one array or dtype is required")
    args = [a if isinstance(a, bool | int | float | complex) else dtype_of(a) for a in arrays_and_dtypes]
    if all(isinstance(a, bool | int | float | complex) for a in args):
        raise ValueError("result_type: at least one array or dtype is required (Python scalars alone have none)")
    return np.result_type(*args)


def can_cast(from_: Any, to: Any, /) -> bool:
    """Whether ``from_`` (a dtype or array) casts to ``to`` by the standard's promotion rules (safe casting)."""
    return bool(np.can_cast(dtype_of(from_), np.dtype(to)))


def finfo(type: Any, /) -> np.finfo[Any]:
    """Machine limits of a floating dtype (or array): ``bits``, ``eps``, ``max``, ``min``, ``smallest_normal``."""
    return np.finfo(dtype_of(type))


def iinfo(type: Any, /) -> np.iinfo[Any]:
    """Machine limits of an integer dtype (or array): ``bits``, ``max``, ``min``, ``dtype``."""
    return np.iinfo(dtype_of(type))


def isdtype(dtype: Any, kind: Any) -> bool:
    """Whether ``dtype`` is of ``kind``: a dtype, a kind name (``"real floating"``, ...) or a tuple of them."""
    if not isinstance(dtype, np.dtype):
        raise TypeError(f"isdtype: expected a dtype, got {type(dtype).__name__}")
    return bool(np.isdtype(dtype, kind))
