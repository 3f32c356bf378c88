"""Shape rules: an op's output shape from its inputs' shapes and arguments, without running it.

``_meta`` runs an op's kernel on small stand-ins to learn its output's shape; on large
inputs it uses these rules instead (a stand-in the input's size would cost what the op
costs), and on inputs with a size known only at run time (``None``), whose stand-ins
cannot be made. A rule gives ``None`` sizes where the size is not known before running,
and raises where it has no answer (``_meta`` then says the shape is unknown).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import numpy as np

__all__ = ["PRESERVING", "SHAPE_RULES", "Shape", "broadcast"]

#: A shape with ``None`` where the size is known only at run time.
Shape = tuple[int | None, ...]


def broadcast(shapes: list[Shape]) -> Shape | None:
    """The broadcast of shapes with unknown (``None``) sizes, or ``None`` if they cannot broadcast."""
    ndim = max((len(s) for s in shapes), default=0)
    out: list[int | None] = []
    for i in range(-ndim, 0):
        dims = {s[i] for s in shapes if len(s) >= -i}
        known = {d for d in dims if d is not None and d != 1}
        if len(known) > 1:
            return None
        if known:
            out.append(known.pop())
        elif None in dims:
            out.append(None)
        else:
            out.append(1)
    return tuple(out)


def _shape_of(x: Any, meta_of: Callable[[Any], Any]) -> tuple[int, ...]:
    m = meta_of(x)
    return tuple(np.shape(x)) if m is None else tuple(m[0])


def _reshape_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = _shape_of(args[0], meta_of)
    new = (args[1],) if isinstance(args[1], int) else tuple(args[1])
    if -1 in new:
        rest = math.prod(n for n in new if n != -1)
        new = tuple(math.prod(shape) // rest if n == -1 else n for n in new)
    return new


def _permute_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = _shape_of(args[0], meta_of)
    axes = args[1] if args[1] is not None else range(len(shape))[::-1]
    return tuple(shape[i] for i in axes)


def _expand_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = list(_shape_of(args[0], meta_of))
    axes = (args[1],) if isinstance(args[1], int) else tuple(args[1])
    ndim = len(shape) + len(axes)
    for a in sorted(a % ndim for a in axes):
        shape.insert(a, 1)
    return tuple(shape)


def _squeeze_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = _shape_of(args[0], meta_of)
    if args[1] is None:
        return tuple(n for n in shape if n != 1)
    axes = {a % len(shape) for a in ((args[1],) if isinstance(args[1], int) else args[1])}
    if any(shape[a] != 1 for a in axes):
        raise ValueError("squeeze of a dimension that is not 1")  # (the kernel raises too)
    return tuple(n for i, n in enumerate(shape) if i not in axes)


def _concat_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shapes = [_shape_of(a, meta_of) for a in args[0]]
    axis = args[1]
    if axis is None:
        return (sum(math.prod(sh) for sh in shapes),)
    axis %= len(shapes[0])
    return (*shapes[0][:axis], sum(sh[axis] for sh in shapes), *shapes[0][axis + 1 :])


def _stack_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    first = _shape_of(args[0][0], meta_of)
    axis = args[1] % (len(first) + 1)
    return (*first[:axis], len(args[0]), *first[axis:])


def _broadcast_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape | None:
    return broadcast([_shape_of(a, meta_of) for a in args if a is not None])


def _matmul_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape | None:
    a, b = _shape_of(args[0], meta_of), _shape_of(args[1], meta_of)
    if len(a) == 1 and len(b) == 1:
        return ()
    if len(a) == 1:
        return (*b[:-2], b[-1])
    if len(b) == 1:
        return a[:-1]
    batch = broadcast([a[:-2], b[:-2]])
    return None if batch is None else (*batch, a[-2], b[-1])


def _take_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape, index = _shape_of(args[0], meta_of), _shape_of(args[1], meta_of)
    axis = kw.get("axis")
    if axis is None:
        return index
    axis %= len(shape)
    return (*shape[:axis], *index, *shape[axis + 1 :])


def _same_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    return _shape_of(args[0], meta_of)


def _cumulative_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    # (x, kind, axis, dtype, include_initial): numpy's cumsum flattens without an axis.
    shape: list[int | None] = list(_shape_of(args[0], meta_of))
    axis = args[2]
    if axis is None:
        if len(shape) != 1:
            raise ValueError("cumulative_sum of a multi-dimensional array needs an axis")
        axis = 0
    axis %= len(shape)
    n = shape[axis]
    if args[4] and n is not None:
        shape[axis] = n + 1
    return tuple(shape)


def _swap_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = _shape_of(args[0], meta_of)
    return (*shape[:-2], shape[-1], shape[-2])


def _moveaxis_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    shape = _shape_of(args[0], meta_of)
    # The permutation, from a zero-stride array whose sizes name its axes (no memory).
    named = np.broadcast_to(np.zeros((), np.int8), tuple(range(2, len(shape) + 2)))
    return tuple(shape[n - 2] for n in np.moveaxis(named, args[1], args[2]).shape)


def _repeat_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    # (x, repeats, axis); an array of repeats makes the size along axis known only at run time.
    shape: list[int | None] = list(_shape_of(args[0], meta_of))
    repeats, axis = args[1], args[2]
    if axis is None:
        size = None if None in shape else math.prod(cast("list[int]", shape))
        shape, axis = [size], 0
    axis %= len(shape)
    n = shape[axis]
    shape[axis] = n * repeats if isinstance(repeats, int) and n is not None else None
    return tuple(shape)


def _reduce_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    # (x, axis, keepdims, ...): count_nonzero, vector_norm.
    shape = _shape_of(args[0], meta_of)
    axis, keepdims = args[1], args[2]
    axes = range(len(shape)) if axis is None else {a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis)}
    return tuple(1 if i in axes else n for i, n in enumerate(shape) if keepdims or i not in axes)


def _vecdot_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape | None:
    shape = broadcast([_shape_of(args[0], meta_of), _shape_of(args[1], meta_of)])
    if shape is None:
        return None
    axis = args[2] % len(shape)
    return shape[:axis] + shape[axis + 1 :]


def _diff_rule(args: tuple[Any, ...], kw: dict[str, Any], meta_of: Callable[[Any], Any]) -> Shape:
    # (x, axis, n, prepend, append): only without prepend/append (whose sizes would add).
    if args[3] is not None or args[4] is not None:
        raise ValueError("diff with prepend or append: no rule")
    shape: list[int | None] = list(_shape_of(args[0], meta_of))
    axis = args[1] % len(shape)
    n = shape[axis]
    shape[axis] = None if n is None else max(n - args[2], 0)
    return tuple(shape)


SHAPE_RULES: dict[str, Callable[[tuple[Any, ...], dict[str, Any], Callable[[Any], Any]], Shape | None]] = {
    "astype": lambda args, kw, meta_of: _shape_of(args[0], meta_of),
    "round": lambda args, kw, meta_of: _shape_of(args[0], meta_of),
    "reshape": _reshape_rule,
    "permute_dims": _permute_rule,
    "expand_dims": _expand_rule,
    "squeeze": _squeeze_rule,
    "concat": _concat_rule,
    "stack": _stack_rule,
    "broadcast_to": lambda args, kw, meta_of: tuple(args[1]) if not isinstance(args[1], int) else (args[1],),
    "where": _broadcast_rule,
    "clip": _broadcast_rule,
    "matmul": _matmul_rule,
    "take": _take_rule,
    "sort": _same_rule,
    "argsort": _same_rule,
    "flip": _same_rule,
    "roll": _same_rule,
    "tril": _same_rule,
    "triu": _same_rule,
    "isin": _same_rule,
    "cumulative_sum": _cumulative_rule,
    "cumulative_prod": _cumulative_rule,
    "matrix_transpose": _swap_rule,
    "swap_matrix_axes": _swap_rule,
    "moveaxis": _moveaxis_rule,
    "repeat": _repeat_rule,
    "count_nonzero": _reduce_rule,
    "vector_norm": _reduce_rule,
    "vecdot": _vecdot_rule,
    "diff": _diff_rule,
    "searchsorted": lambda args, kw, meta_of: _shape_of(args[1], meta_of),
    "unique_values": lambda args, kw, meta_of: (None,),
}
#: Ops whose result has the dtype of their first input.
PRESERVING = frozenset(
    (
        "reshape",
        "permute_dims",
        "expand_dims",
        "squeeze",
        "broadcast_to",
        "take",
        "sort",
        "flip",
        "roll",
        "repeat",
        "diff",
    )
)
