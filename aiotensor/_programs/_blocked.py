"""Runs of element-wise ops found in a compiled expression, each made one step.

numpy evaluates ``((a * 2.0 + 1.0) * a - 3.0) / 2.0`` one op at a time, each op reading
and writing full-size arrays. An expression is compiled whole, so :func:`block_runs`
finds each maximal run of element-wise ufunc steps (a tree of them whose
intermediates nothing else reads) on leaves of ``_blocked_run.MIN_ITEMS`` elements or
more and replaces it with one step whose kernel is a
:class:`~aiotensor._programs._blocked_run.BlockedRun` (one pass per op in place in the result, or
cache-sized blocks: see there), and gives ``var`` and ``std`` the blocked kernel of
``_blocked_var``. The program's budget then counts a run's result alone: its kernel
holds no full-size intermediate.
"""

from __future__ import annotations

import math
from typing import Any, cast

import numpy as np

from .._cost import PER_BYTE
from .._opdef import Cost, OpDef
from . import _blocked_run
from ._blocked_center import CenteredRun
from ._blocked_run import BlockedRun
from ._blocked_split import with_pool
from ._blocked_var import VARIANCE, blocked_variance
from ._program import Program, Ref

__all__ = ["TRAILING", "BlockedOp", "block_runs"]

#: A blocked op's estimate, in arrays touched per output element at ``_cost.PER_BYTE``'s
#: rates (op by op it is inputs + output, 3 for a binary op). Measured: the 10-op chain
#: on 256x256 float32 in one block took 43 µs (numpy's chain 38 µs), 0.016 ns per byte
#: and op, 0.55x ``PER_BYTE[MEMORY]``: a block stays in cache. So that run is inline.
_WEIGHT = 0.6
_generic = np.generic
_SCALARS = (int, float, bool, complex)


class BlockedOp(OpDef):
    """The op of a blocked step: its kernel is a :class:`BlockedRun` (pickled with it)."""

    __slots__ = ("run", "weight")

    def __init__(self, run: BlockedRun | CenteredRun, weight: float) -> None:
        def blocked(*inputs: Any) -> None:
            """An element-wise run evaluated in cache-sized blocks."""

        super().__init__(
            cast("Any", blocked), run, data=0, cost=Cost.MATH, plain=True, returns="one", blas=False, user=False
        )
        self.run = run
        #: ns per output byte, the run's ops' estimate summed (``_compile.program_cost``).
        self.weight = weight

    def __reduce__(self) -> Any:
        return BlockedOp, (self.run, self.weight)


def _eligible(d: OpDef, templates: tuple[Any, ...], kwargs: Any, checked: int) -> bool:
    # One ufunc of one output on values and scalar constants (what a block can be fed).
    if not d.ufunc or kwargs or checked or type(d) is not OpDef:
        return False
    kernel = d.kernel_for(np)
    if not isinstance(kernel, np.ufunc) or kernel.nout != 1:
        return False
    return all(type(t) is Ref or type(t) in _SCALARS or isinstance(t, _generic) for t in templates)


#: Reductions a run may end with (over its last axis: each row is reduced as numpy does).
TRAILING = frozenset({"sum", "mean", "max", "min"})


def _trailing(step: Any) -> bool:
    # A sum, mean, max or min of one value over one axis, with numpy's own accumulator.
    d, templates, kwargs, checked, _ = step
    if d.name not in TRAILING or type(d) is not OpDef or checked or len(templates) != 1:
        return False
    if type(templates[0]) is not Ref:
        return False
    kwargs = kwargs or {}
    axis = kwargs.get("axis")
    if type(axis) is tuple and len(axis) == 1:
        axis = axis[0]
    return type(axis) is int and set(kwargs) <= {"axis", "keepdims", "dtype"} and kwargs.get("dtype") is None


def block_runs(program: Program, leaves: list[Any]) -> Program:
    """``program`` with each run of element-wise steps over its largest leaves made one blocked step.

    A run is a tree of eligible steps (one ufunc, on values and scalar constants) whose
    values only the run reads, ending at a step whose value anything may read, or at a
    ``sum``, ``mean``, ``max`` or ``min`` over one axis that alone reads it. Programs
    on leaves under ``_blocked_run.MIN_ITEMS`` elements, or with no run of two steps or more,
    are returned as they are. (Steps of a run on small values alone, such as
    ``std + 1e-8``, run once per call, not per block: see ``_blocked_layout.Layout``.)
    """
    nleaves = program.nleaves
    sizes = [math.prod(getattr(t, "_shape", np.shape(t))) for t in leaves]
    if program.xp != "numpy" or not sizes or max(sizes) < _blocked_run.MIN_ITEMS:
        return program
    steps = program.steps
    nsteps = len(steps)
    roots = set(program.roots)
    readers: dict[int, set[int]] = {}
    for k, (_, templates, kwargs, _, _) in enumerate(steps):
        for t in (*templates, *(kwargs or {}).values()):
            for e in t if type(t) in (list, tuple) else (t,):
                if type(e) is Ref:
                    readers.setdefault(e.slot, set()).add(k)
    eligible = [_eligible(d, templates, kwargs, checked) for d, templates, kwargs, checked, _ in steps]
    # Reverse sweep: a step joins the run of its readers when they are all in one run.
    run_of: list[int] = [-1] * nsteps
    for k in range(nsteps - 1, -1, -1):
        if not eligible[k]:
            continue
        slot = nleaves + k
        owners = {run_of[r] for r in readers.get(slot, ())}
        if slot not in roots and len(owners) == 1 and -1 not in owners:
            run_of[k] = owners.pop()
        else:
            run_of[k] = k  # the end of a run
    members: dict[int, list[int]] = {}
    for k in range(nsteps):
        if run_of[k] >= 0:
            members.setdefault(run_of[k], []).append(k)
    runs = {end: ks for end, ks in members.items() if len(ks) > 1}
    for end in list(runs):  # a reduction over the last axis reading the run's result alone joins it
        (k, *others) = readers.get(nleaves + end, {-1})
        if k >= 0 and not others and nleaves + end not in roots and _trailing(steps[k]):
            runs[k] = [*runs.pop(end), k]
            for m in runs[k]:
                run_of[m] = k
    if not runs and not any(step[0].name in VARIANCE for step in steps):
        return program
    centered: dict[int, _Centered] = {}  # run end -> its step fused with a mean and a var (_blocked_center)
    for end, ks in runs.items():
        found = _centered(program, ks, readers, roots)
        taken = {m for c in centered.values() for m in c[0]}
        made = None if found is None or set(found) & taken else _centered_step(program, ks, found)
        if made is not None:
            centered[end] = made
    return _rewrite(program, runs, run_of, centered)


def _axis0(step: Any, x: int, names: frozenset[str], keys: set[str]) -> bool:
    # ``step`` is one of ``names`` of the value at slot ``x`` over axis 0, with keyword arguments among ``keys``.
    d, templates, kwargs, checked, _ = step
    kwargs = kwargs or {}
    return (
        d.name in names
        and type(d) is OpDef
        and not checked
        and len(templates) == 1
        and type(templates[0]) is Ref
        and templates[0].slot == x
        and set(kwargs) <= keys
        and kwargs.get("axis") in (0, (0,))
    )


def _centered(
    program: Program, ks: list[int], readers: dict[int, set[int]], roots: set[int]
) -> tuple[int, int, int] | None:
    # (subtract, mean, var) steps when the run ``ks`` reads ``x - mean(x, axis=0)`` and a
    # ``var``/``std`` of ``x`` over axis 0, the mean and the variance read by the run alone.
    nleaves, steps = program.nleaves, program.steps
    if steps[ks[-1]][0].name in TRAILING and not steps[ks[-1]][0].ufunc:
        return None  # a trailing reduction: no result of the deviations' shape to write over
    members = set(ks)

    def only_run(slot: int) -> bool:
        return slot not in roots and bool(readers.get(slot)) and readers[slot] <= members

    for k in ks[:-1]:  # (the subtraction as the run's result would leave nothing to fuse)
        d, templates, _, _, _ = steps[k]
        if d.name != "subtract" or len(templates) != 2 or any(type(t) is not Ref for t in templates):
            continue
        x, m = templates[0].slot, templates[1].slot
        if m < nleaves or not _axis0(steps[m - nleaves], x, _MEAN, {"axis", "keepdims"}) or not only_run(m):
            continue
        for v, step in enumerate(steps):
            if _axis0(step, x, VARIANCE, {"axis", "correction", "keepdims"}) and only_run(nleaves + v):
                return k, m - nleaves, v
    return None


_MEAN = frozenset({"mean"})


def _rewrite(
    program: Program, runs: dict[int, list[int]], run_of: list[int], centered: dict[int, _Centered]
) -> Program:
    nleaves = program.nleaves
    steps = program.steps
    new_slot: dict[int, int] = {i: i for i in range(nleaves)}
    out: list[tuple[OpDef, tuple[Any, ...], Any, int]] = []
    fused = {m for c in centered.values() for m in c[0]}  # made by a centered run's step

    for k, (d, templates, kwargs, checked, _) in enumerate(steps):
        end = run_of[k]
        if k in fused and k != end:
            continue
        if end >= 0 and end in runs:
            if end != k:
                continue  # made by the run's step, at its end
            if k in centered:
                _, op, reads = centered[k]
                step: tuple[OpDef, tuple[Any, ...], Any, int] = (op, tuple(Ref(new_slot[s]) for s in reads), None, 0)
            else:
                step = _run_step(program, runs[k], new_slot)
        else:
            step = (
                blocked_variance(d),  # var and std over axis 0 in blocks too (_blocked_var)
                _remap(templates, new_slot),
                None if not kwargs else {name: _remap_one(v, new_slot) for name, v in kwargs.items()},
                checked,
            )
        new_slot[nleaves + k] = nleaves + len(out)
        out.append(step)
    roots = [new_slot[r] for r in program.roots]
    # Each intermediate dropped after its last reader, as compile_program does.
    last: dict[int, int] = {}
    for i, (_, templates, kwargs, _) in enumerate(out):
        for t in (*templates, *(kwargs or {}).values()):
            for e in t if type(t) in (list, tuple) else (t,):
                if type(e) is Ref:
                    last[e.slot] = i
    drops: list[tuple[int, ...]] = [() for _ in out]
    keep = set(roots)
    for s, i in last.items():
        if s >= nleaves and s not in keep:
            drops[i] = (*drops[i], s)
    rewritten = Program([(*s, drops[i]) for i, s in enumerate(out)], roots, nleaves, program.xp)
    rewritten.spawning = with_pool if runs else None
    return rewritten


def _remap_one(t: Any, new_slot: dict[int, int]) -> Any:
    if type(t) is Ref:
        return Ref(new_slot[t.slot])
    if type(t) in (list, tuple):
        return type(t)(_remap_one(e, new_slot) for e in t)
    return t


def _remap(templates: tuple[Any, ...], new_slot: dict[int, int]) -> tuple[Any, ...]:
    return tuple(_remap_one(t, new_slot) for t in templates)


def _run_step(program: Program, ks: list[int], new_slot: dict[int, int]) -> tuple[OpDef, tuple[Any, ...], Any, int]:
    # The blocked step of the run made of steps ``ks`` (in program order, the last its end).
    run, weight, inputs = _make_run(program, ks)
    return BlockedOp(run, weight), tuple(Ref(new_slot[s]) for s in inputs), None, 0


def _make_run(program: Program, ks: list[int]) -> tuple[BlockedRun, float, list[int]]:
    # The run of steps ``ks``, its weight, and the slots of its inputs in order.
    nleaves = program.nleaves
    steps = program.steps
    inside = {nleaves + k: j for j, k in enumerate(ks)}
    inputs: dict[int, int] = {}  # old slot -> input index
    consts: list[Any] = []
    raw: list[tuple[OpDef, list[tuple[str, Any]]]] = []
    weight = 0.0
    reduce = None
    if steps[ks[-1]][0].name in TRAILING and not steps[ks[-1]][0].ufunc:
        reduce = (steps[ks[-1]][0], dict(steps[ks[-1]][2] or {}))
        ks = ks[:-1]
    for k in ks:
        d, templates, _, _, _ = steps[k]
        args: list[tuple[str, Any]] = []
        for t in templates:
            if type(t) is Ref:
                if t.slot in inside:
                    args.append(("op", inside[t.slot]))
                else:
                    args.append(("in", inputs.setdefault(t.slot, len(inputs))))
            else:
                args.append(("const", len(consts)))
                consts.append(t)
        raw.append((d, args))
        weight += _WEIGHT * PER_BYTE[d.cost]
    nin, nconst = len(inputs), len(consts)
    base = {"in": 0, "const": nin, "op": nin + nconst}
    ops = tuple((d, tuple(base[kind] + i for kind, i in args)) for d, args in raw)
    return BlockedRun(ops, nin, tuple(consts), reduce), weight, list(inputs)


#: A centered run: the steps it stands for (subtract, mean, var), its op, the slots it reads.
_Centered = tuple[tuple[int, int, int], BlockedOp, list[int]]


def _centered_step(program: Program, ks: list[int], found: tuple[int, int, int]) -> _Centered | None:
    # The run ``ks`` on ``x - mean`` fused with the mean and var steps (_blocked_center),
    # or None when the run's ops before the one reading the deviations read an input
    # other than the mean and the variance (they could write over the deviations first).
    nleaves, steps = program.nleaves, program.steps
    k, j, v = found
    run, weight, inputs = _make_run(program, [i for i in ks if i != k])
    slots = (nleaves + k, nleaves + j, nleaves + v)
    d_pos, m_pos, v_pos = (inputs.index(s) if s in inputs else -1 for s in slots)
    nin, nconst = run.nin, len(run.consts)
    small = {i for i in range(nin) if inputs[i] in slots[1:]} | set(range(nin, nin + nconst))
    readers = [i for i, (_, args) in enumerate(run.ops) if d_pos in args]
    if len(readers) != 1 or run.reduce is not None:
        return None
    for i, (_, args) in enumerate(run.ops[: readers[0]]):
        if not set(args) <= small:
            return None
        small.add(nin + nconst + i)
    d_mean, d_var = steps[j], steps[v]
    mean, var = (d_mean[0], dict(d_mean[2] or {})), (d_var[0], dict(d_var[2] or {}))
    kernel = CenteredRun(steps[k][0], mean, var, run, (d_pos, m_pos, v_pos), v < k)
    reads = [cast("Ref", steps[k][1][0]).slot, *[s for s in inputs if s not in slots]]
    return found, BlockedOp(kernel, weight + 2 * _WEIGHT * PER_BYTE[Cost.MATH]), reads
