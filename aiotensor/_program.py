"""Kernels made of ops: one op (:class:`Step`), or a whole expression (:class:`Program`).

``_compile`` turns an expression's graph into a :class:`Program` (its steps in order,
common subexpressions merged, each intermediate dropped after its last use); this
module runs it. The program runs as *one* kernel, so a ten-op expression costs one
dispatch (one thread hop, or one Dask task), and only its results are registered.

Both classes are plain picklable objects (ops pickle by name), so a backend may run
them in another process.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ._errors import ResourceExhaustedError
from ._kernels import SEQUENCES, as_numeric, kernel_error
from ._opdef import OpDef, namespace

if TYPE_CHECKING:
    pass

__all__ = ["Budget", "Program", "Ref", "Slices", "Step"]

_ndarray = np.ndarray
_new = object.__new__
_clock = time.perf_counter
_PlanStep = tuple[
    OpDef,
    Callable[..., Any],
    "tuple[int, ...] | None",
    tuple[Any, ...],
    "dict[str, Any] | None",
    int,
    tuple[int, ...],
    int,
    int,
]
_Plan = tuple[list[_PlanStep], list[_PlanStep], list[Any]]  # steps, steps writing into, constants


class Step:
    """One op as a kernel: ``d``'s kernel, with its first ``checked`` args checked numeric."""

    __slots__ = ("checked", "d", "name", "xp")

    def __init__(self, d: OpDef, checked: int, xp: str, name: str | None = None) -> None:
        self.d = d
        self.name = d.name if name is None else name
        self.checked = checked
        self.xp = xp

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kernel = self.d.kernel_for(namespace(self.xp))
        n = self.checked
        if n:
            args = (*[as_numeric(a) for a in args[:n]], *args[n:])
        return kernel(*args, **kwargs)

    @property
    def __name__(self) -> str:  # how backends name the task
        return self.name

    def __repr__(self) -> str:
        return f"Step({self.d.name})"


class Ref:
    """A reference to a value of a program: a leaf buffer or a node's output."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot

    def __reduce__(self) -> tuple[type[Ref], tuple[int]]:
        return Ref, (self.slot,)


class Budget:
    """Bytes the intermediates of one run may hold at once, and what they held.

    The engine sets ``limit`` right before the kernel runs (after the safe point and
    any wait for memory), from what ``memory_limit`` leaves free then.
    """

    __slots__ = ("count", "escaped", "holders", "limit", "live", "owners", "peak", "where")

    def __init__(self, where: str) -> None:
        self.where = where  # "a fused function", "an expression": for error messages
        self.limit: int | None = None
        self.count = 0
        self.escaped = 0  # values made in the run that became its results (registered)
        self.live = 0
        self.peak = 0
        # A program's views of its intermediates (None until a step makes one): the slot
        # whose buffer each view slot keeps alive, and how many live slots keep each such
        # buffer (itself included). Its bytes count until the last of them is dropped.
        self.owners: dict[int, int] | None = None
        self.holders: dict[int, int] | None = None

    def made(self, nbytes: int, op: str) -> None:
        """Account for a value of ``nbytes`` made by ``op``; raise if it does not fit."""
        live = self.live + nbytes
        if self.limit is not None and live > self.limit:
            raise ResourceExhaustedError(
                f"{op} inside {self.where}: {live} bytes of intermediates would exceed the {self.limit} bytes"
                " the session's memory_limit left free"
            )
        self.count += 1
        self.live = live
        if live > self.peak:
            self.peak = live


def _resolve(template: Any, vals: list[Any]) -> Any:
    if type(template) is Ref:
        return vals[template.slot]
    if type(template) in (list, tuple) and any(type(e) is Ref for e in template):
        return type(template)(vals[e.slot] if type(e) is Ref else e for e in template)
    return template


class Program:
    """The nodes of an expression, run in order as one kernel; called with the leaf buffers.

    A program is immutable once compiled (programs are cached and shared, see
    :func:`compiled`); :meth:`fresh` gives the copy one run uses, with its own budget.
    """

    __slots__ = ("_kernels", "blas", "budget", "nleaves", "roots", "spawning", "steps", "xp")

    def __init__(
        self,
        steps: list[tuple[OpDef, tuple[Any, ...], dict[str, Any] | None, int, tuple[int, ...]]],
        roots: list[int],
        nleaves: int,
        xp: str,
    ) -> None:
        #: (op, arg templates, kwargs, checked, slots to drop after it) per node.
        self.steps = steps
        self.roots = roots
        self.nleaves = nleaves
        self.xp = xp
        self.blas = any(s[0].blas for s in steps)
        self.budget = Budget("an expression")
        self._kernels: _Plan | None = None
        #: Set for a program with blocked runs (``_blocked``): how a backend lends it its pool.
        self.spawning: Callable[..., Any] | None = None

    def fresh(self) -> Program:
        """This program with a budget of its own, for one run."""
        run = _new(Program)
        run.steps, run.roots, run.nleaves, run.xp, run.blas = self.steps, self.roots, self.nleaves, self.xp, self.blas
        run.spawning = self.spawning
        kernels = self._kernels
        run._kernels = kernels if kernels is not None else self._resolve_kernels()
        run.budget = Budget("an expression")
        return run

    def __getstate__(self) -> dict[str, Any]:
        # Kernels are functions of this process's namespace: resolved again after unpickling.
        return {"steps": self.steps, "roots": self.roots, "nleaves": self.nleaves, "xp": self.xp}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["steps"], state["roots"], state["nleaves"], state["xp"])  # type: ignore[misc]

    @property
    def __name__(self) -> str:  # how backends name the task
        return "expr_" + "_".join(dict.fromkeys(s[0].name for s in self.steps[-3:]))

    def _resolve_kernels(self) -> _Plan:
        # Per step: (op, kernel, slots of its arguments or None, templates, kwargs, checked,
        # drops, arity, into). Constants get slots after the steps' outputs, so that the
        # arguments of a step whose templates hold no list of Refs are one indexing each.
        # ``arity`` is 1 or 2 for a step called as ``kernel(vals[i])`` /
        # ``kernel(vals[i], vals[j])`` (slots, no keywords, nothing to check), the hot case;
        # else 0. The plan has the steps twice: as they are, and with 3 or 4 for the
        # same calls that may write into the dying intermediate at slot ``into`` (see
        # _into_slots), for runs on leaves of INTO_MIN_BYTES or more.
        xp = namespace(self.xp)
        first_const = self.nleaves + len(self.steps)
        consts: list[Any] = []
        steps: list[_PlanStep] = []
        into_steps: list[_PlanStep] = []
        into = _into_slots(self.steps, self.nleaves)
        for i, (d, templates, kwargs, checked, drop) in enumerate(self.steps):
            idx: tuple[int, ...] | None = None
            if not any(type(t) in (list, tuple) for t in templates):
                slots = []
                for t in templates:
                    if type(t) is Ref:
                        slots.append(t.slot)
                    else:
                        slots.append(first_const + len(consts))
                        consts.append(t)
                idx = tuple(slots)
            arity = len(idx) if idx is not None and len(idx) in (1, 2) and not kwargs and not checked else 0
            step = (d, d.kernel_for(xp), idx, templates, kwargs, checked, drop, arity, into[i])
            steps.append(step)
            into_steps.append((*step[:7], arity + 2, into[i]) if arity and into[i] >= 0 else step)
        plan = (steps, into_steps, consts)
        self._kernels = plan
        return plan

    def __call__(self, *leaves: Any, out: Any = None) -> Any:
        # ``out``: a recycled buffer the engine offers a program with blocked runs; only
        # the backend's wrapper of such a program (``_blocked_run.with_pool``) hands it on.
        plan = self._kernels
        if plan is None:
            plan = self._resolve_kernels()
        vals: list[Any] = [*leaves, *([None] * len(plan[0])), *plan[2]]
        return self._run(plan[1] if _large(leaves) else plan[0], vals, [0] * len(vals), 0, 0.0)

    def sliced(self, *leaves: Any) -> Slices:
        """A run of this program that :meth:`Slices.advance` makes in slices (see :class:`Slices`)."""
        plan = self._kernels
        if plan is None:
            plan = self._resolve_kernels()
        steps = plan[1] if _large(leaves) else plan[0]
        return Slices(self, steps, [*leaves, *([None] * len(steps)), *plan[2]])

    def _run(self, steps: list[_PlanStep], vals: list[Any], sizes: list[int], first: int, deadline: float) -> Any:
        # Steps ``first``.. on ``vals`` (leaves, then outputs, then constants); their
        # results, or a _Pause at the first step that ends past ``deadline`` (0: none).
        budget = self.budget
        limit = budget.limit
        slot = self.nleaves + first
        count = budget.count
        live = budget.live
        peak = budget.peak
        for d, kernel, idx, templates, kwargs, checked, drop, arity, into in steps if not first else steps[first:]:
            try:
                if arity == 2:
                    out = kernel(vals[idx[0]], vals[idx[1]])  # type: ignore[index]
                elif arity == 1:
                    out = kernel(vals[idx[0]])  # type: ignore[index]
                elif arity == 4:
                    a, b = vals[idx[0]], vals[idx[1]]  # type: ignore[index]
                    y = vals[into]
                    if _writable_into(y, b if a is y else a):
                        out = kernel(a, b, out=y)
                        live, sizes[into], count = live - sizes[into], 0, count - 1  # no new buffer
                    else:
                        out = kernel(a, b)
                elif arity == 3:
                    y = vals[into]
                    if _writable_into(y, y):
                        out = kernel(y, out=y)
                        live, sizes[into], count = live - sizes[into], 0, count - 1  # no new buffer
                    else:
                        out = kernel(y)
                else:
                    args = [vals[i] for i in idx] if idx is not None else [_resolve(t, vals) for t in templates]
                    if checked:
                        args = [*[as_numeric(a) for a in args[:checked]], *args[checked:]]
                    if kwargs:
                        out = kernel(*args, **{k: _resolve(v, vals) for k, v in kwargs.items()})
                    else:
                        out = kernel(*args)
            except Exception as exc:
                budget.count, budget.live, budget.peak = count, live, peak
                args = [vals[i] for i in idx] if idx is not None else [_resolve(t, vals) for t in templates]
                error = kernel_error(d.name, tuple(args), exc, d.user)
                raise error from error.__cause__
            if type(out) is _ndarray:
                if out.base is None:
                    nbytes = out.nbytes
                else:  # a view: no new memory, but it may keep an intermediate alive
                    nbytes = 0
                    _hold(budget, out.base, idx, templates, vals, sizes, slot)
            else:  # a numpy scalar (a reduction) counts; a list (split) does not
                nbytes = getattr(out, "nbytes", 0) if getattr(out, "base", None) is None else 0
            live += nbytes
            if limit is not None and live > limit:
                budget.count, budget.live, budget.peak = count, live - nbytes, peak
                budget.made(nbytes, d.name)  # raises
            count += 1
            if live > peak:
                peak = live
            vals[slot] = out
            sizes[slot] = nbytes
            for s in drop:  # last use: free it now, not at the end of the run
                vals[s] = None
                live -= sizes[s] if budget.owners is None else _release(budget, s, sizes)
            slot += 1
            if deadline and _clock() >= deadline and slot < self.nleaves + len(steps):
                budget.count, budget.live, budget.peak = count, live, peak
                return _Pause(slot - self.nleaves)
        budget.count, budget.live, budget.peak = count, live, peak
        if len(self.roots) == 1 and not isinstance(vals[self.roots[0]], SEQUENCES):
            budget.escaped = 1 if sizes[self.roots[0]] else 0
            return vals[self.roots[0]]  # one buffer: a backend keeps it as it is (one Dask task)
        results: list[Any] = []
        budget.escaped = sum(1 for r in set(self.roots) if sizes[r])
        for r in self.roots:  # a multi-output root (split) gives several buffers
            v = vals[r]
            if isinstance(v, SEQUENCES):
                results.extend(v)
            else:
                results.append(v)
        return results


def _hold(
    budget: Budget,
    base: Any,
    idx: tuple[int, ...] | None,
    templates: tuple[Any, ...],
    vals: list[Any],
    sizes: list[int],
    slot: int,
) -> None:
    # The view at ``slot`` keeps ``base`` alive: if that is an intermediate's buffer (an
    # argument's, or the one an argument view keeps), it stays counted until both go.
    args = (
        idx
        if idx is not None
        else [e.slot for t in templates for e in (t if type(t) in (list, tuple) else (t,)) if type(e) is Ref]
    )
    owners = budget.owners
    for a in args:
        v = vals[a]
        if v is base and sizes[a]:
            owner = a
        elif owners is not None and a in owners and getattr(v, "base", None) is base:
            owner = owners[a]
        else:
            continue
        if owners is None or budget.holders is None:
            owners, budget.holders = {}, {}
            budget.owners = owners
        owners[slot] = owner
        budget.holders[owner] = budget.holders.get(owner, 1) + 1
        return


def _release(budget: Budget, slot: int, sizes: list[int]) -> int:
    # The bytes that dropping ``slot`` frees, when views of intermediates exist (_hold).
    owners, holders = budget.owners, budget.holders
    assert owners is not None
    assert holders is not None
    owner = owners.pop(slot, slot)
    n = holders.get(owner)
    if n is None:
        return sizes[slot]
    if n > 1:
        holders[owner] = n - 1
        return 0
    del holders[owner]
    return sizes[owner]


class _Pause:
    __slots__ = ("next",)

    def __init__(self, next_step: int) -> None:
        self.next = next_step


class Slices:
    """One run of a :class:`Program` made step by step, in slices of bounded time.

    An engine runs a program a little longer than an inline op would hold the loop
    this way: :meth:`advance` runs steps until one ends past its deadline, the engine
    lets the loop run other tasks when its hold budget is spent, and calls it again. Intermediates live here between
    slices (and count in the program's budget); dropping the object frees them.
    """

    __slots__ = ("_next", "_program", "_sizes", "_steps", "_vals", "result")

    def __init__(self, program: Program, steps: list[_PlanStep], vals: list[Any]) -> None:
        self._program = program
        self._steps = steps
        self._vals: list[Any] | None = vals
        self._sizes = [0] * len(vals)
        self._next = 0
        #: What the program returned, once :meth:`advance` said it is done.
        self.result: Any = None

    def advance(self, deadline: float) -> bool:
        """Run steps until one ends at or after ``deadline`` (a ``perf_counter`` time); whether all ran."""
        vals = self._vals
        if vals is None:
            raise RuntimeError("this run of the program is over")
        out = self._program._run(self._steps, vals, self._sizes, self._next, deadline)
        if type(out) is _Pause:
            self._next = out.next
            return False
        self.result, self._vals = out, None
        return True


#: ufuncs (by kernel name) whose output has the dtype of a float input, against a python number or an
#: array of that dtype: they may write into a dying intermediate (see _into_slots).
_SAME_DTYPE = frozenset(
    {
        *("add", "subtract", "multiply", "true_divide", "floor_divide", "remainder", "power", "maximum", "minimum"),
        *("negative", "absolute", "sign", "exp", "log", "log1p", "sqrt", "square", "sin", "cos", "tanh", "floor"),
        "ceil",
    }
)
#: Intermediates smaller than this are not written into: numpy allocates small arrays
#: from a cache, and the checks would cost more than they save.
INTO_MIN_BYTES = 1 << 15
_PY_NUMBERS = (float, int, bool)
_NEP50 = int(np.__version__.split(".")[0]) >= 2


def _into_slots(steps: list[Any], nleaves: int) -> list[int]:
    """Per step, the slot of an intermediate it may write its output into, or -1.

    A step may reuse an input's buffer when it is an element-wise ufunc of
    :data:`_SAME_DTYPE`, called on slots alone, and that input is an intermediate whose
    last use is this step, which a ufunc step made (so it is a fresh array of the run's
    own, never a leaf or an object an ``apply`` returned as is) and which only ufunc
    steps read (so no view of it exists: no reshape, index or split took one). Whether
    the buffer really fits (owned, float, the output's dtype and shape) is checked when
    the program runs (_writable_into).
    Writing into it saves an allocation and keeps the data in cache: a 10-op chain on
    256x256 float32 runs in ~0.8x the time of numpy's own chain.
    """
    only_ufuncs: dict[int, bool] = {}
    for d, templates, kwargs, _, _ in steps:
        ok = d.ufunc and not kwargs
        for t in (*templates, *(kwargs or {}).values()):
            for e in t if type(t) in (list, tuple) else (t,):
                if type(e) is Ref:
                    only_ufuncs[e.slot] = only_ufuncs.get(e.slot, True) and ok and type(t) is Ref
    found: list[int] = []
    for d, templates, kwargs, checked, drop in steps:
        slot = -1
        if d.ufunc and d.kernel in _SAME_DTYPE and not kwargs and not checked and len(templates) in (1, 2):
            for t in templates:
                if (
                    type(t) is Ref
                    and t.slot >= nleaves
                    and t.slot in drop
                    and steps[t.slot - nleaves][0].ufunc
                    and only_ufuncs.get(t.slot)
                ):
                    slot = t.slot
                    break
        found.append(slot)
    return found


def _large(leaves: tuple[Any, ...]) -> bool:
    # Whether a run writes into intermediates: only on leaves large enough to gain.
    return any(type(x) is _ndarray and x.nbytes >= INTO_MIN_BYTES for x in leaves)


def _writable_into(y: Any, other: Any) -> bool:
    """Whether a ufunc of ``y`` and ``other`` may write into ``y`` (see :func:`_into_slots`)."""
    if type(y) is not _ndarray or y.base is not None or y.dtype.kind != "f":
        return False
    if other is y:
        return True
    if type(other) in _PY_NUMBERS:
        # numpy 2 keeps y's dtype against any python number (NEP 50); numpy 1 widens
        # for a value the dtype cannot hold.
        return _NEP50 or np.result_type(y, other) == y.dtype
    return type(other) is _ndarray and other.dtype == y.dtype and other.shape == y.shape
