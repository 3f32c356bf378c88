"""Expressions: compiled into one program (``_programs/_compile``) and run as one kernel; their values.

``Engine.evaluate_expr`` is ``await expr`` (inline at once in a lean session, else a
coroutine), ``Engine.evaluate`` several roots in one program, ``Engine.run_values``
the numpy values of ``e.eval()`` and ``s.run``, ``Engine.evaluate_arguments`` the
expression arguments of fused and batched calls.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .._expr import Expr
from .._loopload import BUSY_INLINE_US
from .._programs._compile import FREE_KEY, NEED_KEY, compile_program, compiled, program_need
from .._programs._placement import program_cost, program_free_us
from .._programs._program import Program
from .._tensor import Tensor
from ._call import _shape_result
from ._lean import LEAN
from ._lifecycle import _OPEN, on_loop
from ._session_rule import _flat, evaluating_engine, owner_of

if TYPE_CHECKING:
    from .._types import NDArray
    from ._core import Engine

__all__ = ["evaluate", "evaluate_arguments", "evaluate_expr", "run_values"]


def _is_tensor(x: Any) -> bool:
    return type(x) is Tensor


def _same_kind(kind: type, values: list[Any]) -> Any:
    # The values of a list, tuple or named tuple of tensors, in the same kind of sequence.
    make = getattr(kind, "_make", None)
    return make(values) if make is not None else kind(values)


def _flat_results(results: list[Any]) -> list[Tensor]:
    out: list[Tensor] = []
    for r in results:
        if isinstance(r, list | tuple):
            out.extend(r)
        else:
            out.append(r)
    return out


def evaluate_expr(self: Engine, expr: Expr) -> Any:
    """``await expr``: its tensor at once when its program runs inline, else a coroutine giving it.

    ``Expr.__await__`` calls this. In a lean session, a program within the inline
    threshold runs here through :meth:`call_inline`, as fused calls do, with no
    coroutine of :meth:`_run_program` and :meth:`call` around it. Otherwise (one
    node, a session that is not lean, a program over the threshold, a freed tensor)
    the coroutine takes the general path, with its checks and errors, on the program
    compiled here. With the hold budget spent, a program that ran inline before
    yields once in a small coroutine, then tries the inline path again.
    """
    if expr._n == 1:  # one node: the op path (see evaluate)
        return self._evaluate_one(expr)
    expr._used = True
    program, leaves, costs = compiled(expr, _is_tensor, self._xp_name, Expr)
    engine = evaluating_engine(leaves)
    if (
        engine._held >= engine._hold_s
        and on_loop(engine._lean_loop)
        and costs.get(engine._inline_us, math.inf) <= engine._inline_us
    ):
        # The run of inline work has spent its hold budget and this program ran inline
        # before: yield once (as call() would), then take the inline path again. The
        # general path, after the same yield, cost one await in ~20 of a 256x256 chain
        # ~6 µs more in its checks and coroutines.
        return _yield_then(engine, expr, program, leaves, costs)
    done = _inline(engine, expr, program, leaves, costs)
    if done is not None:
        return done
    return engine._run_expr(program, leaves, expr, costs)


async def _yield_then(
    engine: Engine, expr: Expr, program: Program, leaves: list[Tensor], costs: dict[float, float]
) -> Any:
    await engine._yield_held()
    done = _inline(engine, expr, program, leaves, costs)
    if done is not None:
        return done
    return await engine._run_expr(program, leaves, expr, costs)


def _inline(engine: Engine, expr: Expr, program: Program, leaves: list[Tensor], costs: dict[float, float]) -> Any:
    # The result of ``expr``'s program run inline through ``call_inline``, or None where
    # the general path must run it (not lean, not on its loop, an unreadable or freed
    # leaf, over the threshold, a busy loop sending it to the pool).
    if engine._lean_loop is None:
        return None
    bufs = []
    for t in leaves:
        owner = t._engine
        if owner is not engine and owner not in engine.ancestors:
            return None  # unreadable: the general path raises, naming the tensor
        entry = t._registry._buffers.get(t._rid)
        if entry is None:
            return None
        bufs.append(entry[0])
    inline_us = engine._inline_us
    est = costs.get(inline_us)
    if est is None:
        est = costs[inline_us] = program_cost(program, leaves, inline_us)
    done = engine.call_inline(
        expr._d.name,
        program,
        tuple(bufs),
        {},
        tuple(leaves),
        user=False,
        est_us=est,
        budget=program.budget,
        free_us=costs.get(FREE_KEY) or _free(costs, program, leaves, est),
    )
    if done is None:  # (nothing ran, the program is still fresh)
        return None
    return done[0][0] if expr._d.returns == "one" else _shape_result(expr._d, *done)


def _free(costs: dict[float, float], program: Program, leaves: list[Tensor], est: float) -> float:
    # The program's GIL-free µs (busy-loop placement weighs it), computed only for a
    # program in the band it decides on, once per compiled program (cached with its costs).
    if est <= BUSY_INLINE_US or est == math.inf:
        return math.inf
    free = costs.get(FREE_KEY)
    if free is None:
        free = costs[FREE_KEY] = program_free_us(program, leaves, est)
    return free


async def _evaluate_one(self: Engine, expr: Expr) -> Tensor:
    (t,) = await self.evaluate([expr], None, choose=True)
    return t  # type: ignore[no-any-return]


async def _run_expr(self: Engine, program: Program, leaves: list[Tensor], expr: Expr, costs: dict[float, float]) -> Any:
    tensors = await self._run_program(program, leaves, [expr], None, costs)
    return tensors[0]


async def evaluate(self: Engine, roots: list[Expr], name: str | None = None, *, choose: bool = False) -> list[Any]:
    """Evaluate expressions in one program; only their results are registered."""
    for r in roots:
        r._used = True
    costs: dict[float, float] = {}
    if len(roots) == 1:
        r = roots[0]
        if r._n == 1:
            # One node on tensors and values: the op path, without compiling anything.
            engine = evaluating_engine([x for x in _flat(r._args, r._kwargs) if type(x) is Tensor]) if choose else self
            if r._kwargs is None and r._d in LEAN:
                t = engine.lean(r._d, r._args, name)  # (op() expects its caller to have tried)
                if t is not None:
                    return [t]
            return [await engine.op(r._d, r._args, r._kwargs, r._nbytes, name)]
        program, leaves, costs = compiled(r, _is_tensor, self._xp_name, Expr)
    else:
        program, leaves = compile_program(roots, _is_tensor, self._xp_name, Expr)
    engine = evaluating_engine(leaves) if choose else self
    return await engine._run_program(program, leaves, roots, name, costs)


async def _run_program(
    self: Engine, program: Program, leaves: list[Tensor], roots: list[Expr], name: str | None, costs: dict[float, float]
) -> list[Any]:
    if self.state is not _OPEN:
        await self.open()
    self.check_loop()
    label = roots[0]._d.name if len(roots) == 1 else "run"
    bufs = tuple([self.buffer(t, label) for t in leaves])
    est = costs.get(self._inline_us)
    if est is None:
        est = costs[self._inline_us] = program_cost(program, leaves, self._inline_us)
    need = None
    limit = self.registry.memory_limit
    if limit is not None:
        found = costs.get(NEED_KEY)
        if found is None:
            bound = program_need(program, leaves)
            found = costs[NEED_KEY] = math.inf if bound is None else float(bound)
        if found != math.inf:
            # An upper bound: never more than what the limit leaves beside the leaves it reads.
            need = int(min(found, max(0, limit - sum(t._nbytes for t in leaves))))
    tensors, multi = await self.call(
        label,
        program,
        bufs,
        {},
        tuple(leaves),
        user=False,
        name=name,
        est_us=est,
        budget=program.budget,
        need=need,
        blas=program.blas,
        free_us=_free(costs, program, leaves, est),
    )
    if len(roots) == 1 and roots[0]._d.returns != "one":
        return [_shape_result(roots[0]._d, tensors, multi)]
    return tensors


async def run_values(self: Engine, fetches: list[Any], api: str, *, explicit: bool = True) -> list[NDArray]:
    """The numpy values of tensors and expressions; results made for them are freed at once.

    ``explicit``: this session was named (``s.run``, ``e.eval(session=s)``) and
    evaluates; else :func:`evaluating_engine` chooses (``e.eval()``).
    """
    exprs = [f for f in fetches if type(f) is Expr]
    made: dict[int, Any] = {}  # id(expression) -> its tensor, or its list/tuple of tensors
    engine = self
    if exprs:
        unique = list({id(e): e for e in exprs}.values())
        results = await self._evaluate_each(unique, choose=not explicit)
        made = {id(e): r for e, r in zip(unique, results, strict=True)}
        if not explicit:
            first = _flat_results(results)
            if first:
                engine = owner_of(first[0])  # the session that evaluated them reads them
    try:
        flat: list[Tensor] = []
        spans: list[tuple[int, int, type | None]] = []  # per fetch: its values in ``flat``, its sequence type
        for f in fetches:
            value = made[id(f)] if type(f) is Expr else f
            kind = type(value) if isinstance(value, list | tuple) else None  # (named tuples too)
            items = list(value) if kind is not None else [value]
            spans.append((len(flat), len(flat) + len(items), kind))
            flat += items
        values = await engine.fetch(flat, api)
        return [values[a] if kind is None else _same_kind(kind, values[a:b]) for a, b, kind in spans]
    finally:
        for t in _flat_results(list(made.values())):
            self.discard(t)


async def _evaluate_each(self: Engine, roots: list[Expr], *, choose: bool) -> list[Any]:
    # One program for the roots of one result each; a root of several (split, an
    # apply returning a tuple) in a program of its own, so its results stay together.
    single = [r for r in roots if r._d.returns == "one"]
    out: dict[int, Any] = {}
    if single:
        out.update(zip(map(id, single), await self.evaluate(single, choose=choose), strict=True))
    for r in roots:
        if r._d.returns != "one":
            (out[id(r)],) = await self.evaluate([r], choose=choose)
    return [out[id(r)] for r in roots]


async def evaluate_arguments(
    self: Engine, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any], list[Tensor]]:
    """A call's arguments with their expressions (one level into lists) evaluated here, in one program.

    For the fused and batched calls this session runs (chosen by
    :func:`evaluating_engine`, expressions' tensors included). Returns the new
    arguments and the tensors made, which the caller discards after the call.
    """
    exprs: dict[int, Expr] = {}
    for a in (*args, *kwargs.values()):
        for x in a if type(a) in (list, tuple) else (a,):
            if type(x) is Expr:
                exprs[id(x)] = x
    if not exprs:
        return args, kwargs, []
    results = await self._evaluate_each(list(exprs.values()), choose=False)
    value = dict(zip(exprs, results, strict=True))
    made = _flat_results(results)

    def swap(a: Any) -> Any:
        if type(a) is Expr:
            return value[id(a)]
        if type(a) in (list, tuple):
            return type(a)(swap(x) for x in a)
        return a

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}, made
