"""The arguments of a fused or batched call, read on the loop before its kernel runs.

Tensors become their buffers (the kernel reads them in place); an expression among the
arguments raises :class:`_ExprArgument`, so that the call evaluates it first; and the
arguments' shapes and dtypes make the key under which ``_placement.Placement`` learns
where calls of those shapes run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .._expr import Expr
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._engine._core import Engine

# (names of the package's other modules: private to it)
__all__ = ["_ExprArgument", "_buffers", "_nested_expr", "_shape_key", "_shape_of"]


class _ExprArgument(Exception):
    """An argument of a fused call is an expression: it is evaluated first."""


def _buffers(engine: Engine, x: Any, op: str) -> Any:
    tx = type(x)
    if tx is Tensor:
        return engine.buffer(x, op)
    if tx is list or tx is tuple:
        if Expr in map(type, x):
            raise _ExprArgument
        return tx(engine.buffer(e, op) if type(e) is Tensor else e for e in x)
    if tx is Expr:
        raise _ExprArgument
    return x


def _shape_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    # Flat, two entries per argument (a tensor's shape and dtype, or another value's type
    # and shape), as FusedFunction.__call__ builds it for tensors without this call.
    key: list[Any] = []
    for a in (*args, *kwargs.values()) if kwargs else args:
        if type(a) is Tensor:
            key += (a._shape, a._dtype)
        else:
            key += (type(a), getattr(a, "shape", None))
    return tuple(key)


def _shape_of(x: Any) -> Any:
    # A param's part of the placement key (from a tensor's metadata: no buffer lookup).
    tx = type(x)
    if tx is Tensor:
        return (x._shape, x._dtype)
    if tx is np.ndarray:
        return (x.shape, x.dtype)
    if tx is list or tx is tuple:
        return tuple([_shape_of(e) for e in x])
    return tx


def _nested_expr(params: tuple[Any, ...]) -> bool:
    return any((type(p) is list or type(p) is tuple) and Expr in map(type, p) for p in params)
