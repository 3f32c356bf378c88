"""THE rule of which session evaluates, and the engine behind a session or a tensor.

Every front end asks :func:`evaluating_engine` (``await e``, ``e.eval()``, module-level
ops through :func:`engine_of`, fused and batched calls); see docs/semantics.md,
"Which session evaluates".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from .. import _defaults
from .._errors import NoSessionError
from .._expr import Expr
from .._kernels import forgotten_await
from .._tensor import Tensor

if TYPE_CHECKING:
    from .._protocols import EngineLike, SessionLike
    from ._core import Engine

__all__ = ["engine_of", "evaluating_engine", "expr_tensors", "owner_of", "session_engine"]


def _flat(args: tuple[Any, ...], kwargs: dict[str, Any] | None) -> list[Any]:
    out: list[Any] = []
    for a in (*args, *(kwargs or {}).values()):
        if type(a) in (list, tuple):
            out.extend(a)
        else:
            out.append(a)
    return out


def session_engine(session: object) -> Engine:
    """The engine of a session facade (the default session is stored untyped in ``_defaults``)."""
    return cast("Engine", cast("SessionLike", session)._engine)


def owner_of(t: Tensor) -> Engine:
    """The engine that owns ``t`` (a tensor sees it as an :class:`~aiotensor._protocols.EngineLike`)."""
    return cast("Engine", t._engine)


def evaluating_engine(tensors: Iterable[Tensor], explicit: Engine | None = None) -> Engine:
    """THE rule for which session evaluates (docs/semantics.md, "Which session evaluates").

    Every front end asks it: ``await e``, ``e.eval()``, module-level ops, fused and
    batched calls (and, through them, an expression given to an op). ``explicit``, a
    session named by the caller (``s.run(e)``, ``e.eval(session=s)``, ``s.add(e, 1)``,
    ``s.function(fn)``), evaluates. Otherwise the most derived of the tensors' sessions
    (a child may read its parent's tensors), unless the default session
    (``with s.as_default():``, an ``InteractiveSession``) is that session or a child of
    it: then the default, so a request session reading app weights owns the result.
    With no tensor at all (``xp.zeros(3)``), the default session; with none either,
    :class:`NoSessionError`. Tensors of unrelated sessions are not refused here: the
    session chosen refuses the ones it cannot read ("belongs to another session").
    """
    if explicit is not None:
        return explicit
    found: EngineLike | None = None
    for t in tensors:
        owner = t._engine
        if found is None or (owner is not found and found in owner.ancestors):
            found = owner  # the most derived so far
    return _or_default(found)


def _or_default(found: EngineLike | None) -> Engine:
    # evaluating_engine's second half: the default session takes over from ``found``
    # (the most derived of the tensors' engines) when it is that one or a child of it.
    default = _defaults.get_default_session()
    if default is not None:
        engine = session_engine(default)
        if found is None or engine is found or found in engine.ancestors:
            return engine
    if found is None:
        raise NoSessionError(
            "no session to evaluate in: pass a tensor argument or session=, use `with session.as_default():`,"
            " or create an InteractiveSession"
        )
    return cast("Engine", found)


def engine_of(args: tuple[Any, ...], kwargs: dict[str, Any] | None, op: str = "this op") -> Engine:
    """The engine a module-level op (or an unbound fused function) runs in: :func:`evaluating_engine`.

    Over its tensor arguments, one level into lists, and the tensors of its expression
    arguments, so an op given an expression is evaluated where the expression would be.
    ``op`` names the caller in the error for a coroutine argument (a forgotten ``await``).
    """
    # evaluating_engine over the arguments' tensors, without building their list (the
    # hot path of module-level ops): the same most-derived test, the same default.
    found: EngineLike | None = None
    for arg in (*args, *kwargs.values()) if kwargs else args:
        for item in arg if type(arg) in (list, tuple) else (arg,):
            ti = type(item)
            if ti is Tensor:
                owner = item._engine
                if found is None or (owner is not found and found in owner.ancestors):
                    found = owner
            elif ti is Expr:
                for t in expr_tensors(item):
                    owner = t._engine
                    if found is None or (owner is not found and found in owner.ancestors):
                        found = owner
    if found is None and _defaults.get_default_session() is None:
        awaited = forgotten_await(op, args, kwargs)  # no tensor: maybe a forgotten await
        if awaited is not None:
            raise awaited
    return _or_default(found)


def expr_tensors(expr: Expr) -> list[Tensor]:
    """The tensors an expression reads (its signature's list, or a walk of its graph)."""
    if expr._sig is not None:
        return list(expr._lv)
    found: list[Tensor] = []
    stack: list[Any] = [expr]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        for x in _flat(node._args, node._kwargs):
            if type(x) is Expr:
                if id(x) not in seen:
                    seen.add(id(x))
                    stack.append(x)
            elif type(x) is Tensor:
                found.append(x)
    return found
