"""How a function of :mod:`aiotensor.xp` builds its expression: one op node, or several results of one."""

from __future__ import annotations

from typing import Any, TypeVar

from .._expr import Expr, Operand
from .._kernels import forgotten_await
from .._opdef import OpDef

__all__ = ["meta_shape", "node", "results", "several"]

R = TypeVar("R")


def node(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> Expr:
    """Op ``d`` applied to ``args``, checked by its spec now (as the session method would), not run."""
    try:
        prepared = d.prepare(*args, **(kwargs or {}))
    except Exception:
        awaited = forgotten_await(d.name, args, kwargs)
        if awaited is not None:
            raise awaited from None
        raise
    return Expr(d, *prepared)


def several(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None, n: int | None = None) -> list[Expr]:
    """The ``n`` results of op ``d`` as expressions that all read one node: a program computes it once.

    ``n`` None: as many as the node's metadata says (a ``TypeError`` when that is known only at run time).
    """
    picks = node(d, args, kwargs).results(n)
    for p in picks:
        p._used = True  # a tuple of results: using only some of them is no mistake
    return picks


def meta_shape(x: Any, what: str) -> tuple[int, ...]:
    """The shape of a tensor, expression or array, which ``what`` needs known before anything runs."""
    shape = x.shape if isinstance(x, Operand) else getattr(x, "shape", None)
    if shape is None or None in shape:
        raise ValueError(f"{what}: needs the shape of its input before it runs, which is {shape} here: await it first")
    return tuple(shape)


def results(d: OpDef, args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> tuple[Expr, ...]:
    """The results of a multi-output op as a tuple of expressions (the standard's ``nonzero``)."""
    return tuple(several(d, args, kwargs))
