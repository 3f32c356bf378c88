"""Expressions into programs: the compiler, its cache, and a program's memory bound.

:func:`compile_program` orders an expression's nodes so that each comes after its
inputs, merges common subexpressions (two nodes with the same op on the same inputs
and values are one node) and drops each intermediate right after its last use;
:func:`compiled` does it once per formula and tensor shapes (with the costs the engine
caches per program: ``_placement.program_cost``); :func:`program_need` bounds what a
run holds. ``_program`` runs the result.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._cost import Spec, out_spec
from .._kernels import as_numeric
from .._opdef import OpDef
from .._value_keys import scalar_key
from ._blocked import block_runs
from ._placement import Unknown, spec_of
from ._program import Program, Ref

if TYPE_CHECKING:
    from .._expr import Expr

__all__ = ["FREE_KEY", "NEED_KEY", "compile_program", "compiled", "program_need"]

_ndarray = np.ndarray


def _check_constants(d: OpDef, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], int]:
    """Constant data arguments checked numeric once, at compile time: (args, 0); or, when
    one fails (or holds values only known at run time), (args, ``d.data``) so that the run
    checks them and raises the op's own error."""
    n = d.data
    out = list(args)
    for i, a in enumerate(args[:n]):
        ta = type(a)
        if ta is Ref:
            continue
        if (ta is list or ta is tuple) and any(type(e) is Ref for e in a):
            return args, n
        try:
            out[i] = as_numeric(a)
        except Exception:
            return args, n
    return tuple(out), 0


def _children(node: Expr) -> list[Any]:
    found: list[Any] = []
    for a in (*node._args, *(node._kwargs or {}).values()):
        if type(a) in (list, tuple):
            found.extend(a)
        else:
            found.append(a)
    return found


def compile_program(
    roots: list[Expr], is_leaf: Callable[[Any], bool], xp: str, expr_type: type[Expr]
) -> tuple[Program, list[Any]]:
    """The program of ``roots`` and its leaves (the tensors it reads, each once, in slot order)."""
    order: list[Expr] = []
    leaves: list[Any] = []
    slots: dict[int, int] = {}  # id(tensor or expr) -> slot of its value
    stack: list[tuple[Expr, bool]] = [(r, False) for r in reversed(roots)]
    visited: set[int] = set()
    while stack:  # iterative post-order: a 10,000-deep expression must not recurse
        node, ready = stack.pop()
        if ready:
            order.append(node)
            continue
        if id(node) in visited:
            continue
        visited.add(id(node))
        stack.append((node, True))
        for x in _children(node):
            if type(x) is expr_type:
                if id(x) not in visited:
                    stack.append((x, False))
            elif id(x) not in slots and is_leaf(x):
                slots[id(x)] = len(leaves)
                leaves.append(x)

    nleaves = len(leaves)
    refs: list[Ref] = [Ref(i) for i in range(nleaves + len(order))]
    _scalars = _SCALAR_TYPES

    def arg(x: Any) -> tuple[Any, Any]:
        # (template, CSE key) of one argument, in one pass
        tx = type(x)
        if tx in _scalars:
            if tx is int or tx is str or x is None:
                return x, (tx, x)
            # floats and complex numbers: signed zeros apart; a NaN merges with nothing
            return x, _key_or_id(x)
        slot = slots.get(id(x))
        if slot is not None and (tx is expr_type or is_leaf(x)):
            return refs[slot], slot
        if tx is list or tx is tuple:
            pairs = [arg(e) for e in x]
            return tx(p[0] for p in pairs), (tx, tuple(p[1] for p in pairs))
        if isinstance(x, np.generic):
            return x, _key_or_id(x)
        return x, ("id", id(x))  # arrays, dtypes, user objects: the same object only

    merged: dict[Any, int] = {}  # structural key -> slot
    steps: list[list[Any]] = []
    last: dict[int, int] = {}  # slot -> index of the last step reading it
    for node in order:
        d = node._d
        pairs = [arg(a) for a in node._args]
        args = tuple(p[0] for p in pairs)
        key: Any = (d, *[p[1] for p in pairs])
        kwargs = None
        if node._kwargs:
            kw_pairs = {k: arg(v) for k, v in node._kwargs.items()}
            kwargs = {k: p[0] for k, p in kw_pairs.items()}
            key = (*key, "kw", *[(k, p[1]) for k, p in sorted(kw_pairs.items())])
        hit = merged.get(key)
        if hit is not None:  # a common subexpression: computed once
            slots[id(node)] = hit
            continue
        checked = 0
        if d.data:
            args, checked = _check_constants(d, args)
        index = len(steps)
        for a in (*args, *kwargs.values()) if kwargs else args:
            if type(a) is Ref:
                last[a.slot] = index
            elif type(a) in (list, tuple):
                for e in a:
                    if type(e) is Ref:
                        last[e.slot] = index
        slots[id(node)] = merged[key] = nleaves + index
        steps.append([d, args, kwargs, checked, ()])
    root_slots = [slots[id(r)] for r in roots]
    keep = set(root_slots)
    for s, i in last.items():
        if s >= nleaves and s not in keep:
            steps[i][4] = (*steps[i][4], s)
    program = Program([(s[0], s[1], s[2], s[3], s[4]) for s in steps], root_slots, nleaves, xp)
    return block_runs(program, leaves), leaves  # runs of element-wise steps: one blocked step each


_SCALAR_TYPES = frozenset({int, float, bool, complex, str, type(None)})


def _key_or_id(x: Any) -> Any:
    # A scalar's CSE key: its value key (the one expression signatures use), else its identity.
    key = scalar_key(x)
    return ("id", id(x)) if key is None else key


class _Entry:
    __slots__ = ("costs", "perm", "program")

    def __init__(self, program: Program, perm: tuple[int, ...]) -> None:
        self.program = program
        self.perm = perm  # the leaves in program order, as indices into the distinct tensors
        self.costs: dict[float, float] = {}  # the engine's inline threshold -> estimate (µs)


#: Compiled programs by expression signature (``Expr._sig``) with where its tensors go,
#: their shapes and dtypes, and the array namespace. Bounded; the oldest entry goes first.
_CACHE: dict[Any, _Entry] = {}
_CACHE_ENTRIES = 512


def compiled(
    root: Expr, is_leaf: Callable[[Any], bool], xp: str, expr_type: type[Expr]
) -> tuple[Program, list[Any], dict[float, float]]:
    """The program of ``root`` (for one run), its leaves, and the cache of its cost estimates.

    A formula evaluated again on tensors of the same shapes (a loop, a request handler)
    is compiled once: the second time costs a dictionary lookup on its signature. The
    signature has every constant by value and type (``-0.0`` apart from ``0.0``), so a
    cached program computes exactly what compiling anew would.
    """
    sig = root._sig
    if sig is None:
        program, leaves = compile_program([root], is_leaf, xp, expr_type)
        return program, leaves, {}
    lv = root._lv
    distinct: list[Any]
    if len(lv) == 1:
        distinct = [lv[0]]
        key: Any = (sig, xp, lv[0]._shape, lv[0]._dtype)
    else:
        if lv:
            first = lv[0]
            for t in lv:
                if t is not first:
                    break
            else:  # one tensor read several times (``y + v`` in a formula of ``v``): the key below, made directly
                entry = _CACHE.get((sig, xp, (0,) * len(lv), (first._shape, first._dtype)))
                if entry is not None:
                    return entry.program.fresh(), [first], entry.costs
        index: dict[int, int] = {}
        distinct = []
        pattern = []
        for t in lv:
            i = index.get(id(t))
            if i is None:
                i = index[id(t)] = len(distinct)
                distinct.append(t)
            pattern.append(i)
        key = (sig, xp, tuple(pattern), *[(t._shape, t._dtype) for t in distinct])
    entry = _CACHE.get(key)
    if entry is None:
        program, leaves = compile_program([root], is_leaf, xp, expr_type)
        where = {id(t): i for i, t in enumerate(distinct)}
        perm = tuple(where.get(id(t), -1) for t in leaves)
        if len(leaves) != len(distinct) or -1 in perm:  # tensors nested deeper than compiling looks
            return program, leaves, {}
        if len(_CACHE) >= _CACHE_ENTRIES:
            del _CACHE[next(iter(_CACHE))]
        entry = _CACHE[key] = _Entry(program, perm)
        return program.fresh(), leaves, entry.costs
    return entry.program.fresh(), [distinct[i] for i in entry.perm], entry.costs


#: The key under which a program's cost cache keeps :func:`program_need` (thresholds are >= 0).
NEED_KEY = -1.0
#: The key, in a compiled expression's costs, of its program's GIL-free µs (``_placement.program_free_us``).
FREE_KEY = -2.0


def program_need(program: Program, leaves: list[Any]) -> int | None:
    """An upper bound on the bytes a run's own values (intermediates and results) hold at once, or None.

    Step by step through the cost model's output sizes (``out_spec``: 8-byte items at
    most, views counted as copies), each intermediate dropped after its last use: what
    a session with a ``memory_limit`` reserves (or waits for) before the run. None when
    a size is unknown before the run (creation ops, data-dependent shapes).
    """
    specs: list[Any] = [Spec(t._shape, t._dtype.itemsize) for t in leaves]
    live = peak = 0
    for d, templates, kwargs, _, drop in program.steps:
        try:
            args = tuple(spec_of(t, specs) for t in templates)
        except Unknown:
            return None
        out = out_spec(d, args, kwargs)
        if out is None:
            return None
        specs.append(out)
        live += out.nbytes
        peak = max(peak, live)
        for slot in drop:
            live -= specs[slot].nbytes
    return peak
