"""Kernels made of ops: one op (:class:`Step`), or a whole expression (:class:`Program`).

``_compile`` turns an expression's graph into a :class:`Program` (its steps in order,
common subexpressions merged, each intermediate dropped after its last use); this
module runs it. The program runs as *one* kernel, so a ten-op expression costs one
dispatch (one thread hop, or one Dask task), and only its results are registered.

Both classes are plain picklable objects (ops pickle by name), so a backend may run
them in another process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._opdef import OpDef, namespace
from ._interpreter import Budget, Pause, checked, run_one, run_steps
from ._recycler import Ref, into_slots, writes_into

__all__ = ["Budget", "Program", "Ref", "Slices", "Step"]

_new = object.__new__
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
#: steps, steps writing into, constants, and (op, kernel, leaf indices) of a program that
#: is one step on leaves alone (run by ``run_one``), else None.
_Plan = tuple[list[_PlanStep], list[_PlanStep], list[Any], "tuple[OpDef, Callable[..., Any], tuple[int, ...]] | None"]


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
            args = checked(args, n)
        return kernel(*args, **kwargs)

    @property
    def __name__(self) -> str:  # how backends name the task
        return self.name

    def __repr__(self) -> str:
        return f"Step({self.d.name})"


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
        # _recycler.into_slots), for runs on leaves of INTO_MIN_BYTES or more.
        xp = namespace(self.xp)
        first_const = self.nleaves + len(self.steps)
        consts: list[Any] = []
        steps: list[_PlanStep] = []
        into_steps: list[_PlanStep] = []
        into = into_slots(self.steps, self.nleaves)
        for i, (d, templates, kwargs, checks, drop) in enumerate(self.steps):
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
            arity = len(idx) if idx is not None and len(idx) in (1, 2) and not kwargs and not checks else 0
            step = (d, d.kernel_for(xp), idx, templates, kwargs, checks, drop, arity, into[i])
            steps.append(step)
            into_steps.append((*step[:7], arity + 2, into[i]) if arity and into[i] >= 0 else step)
        one = None
        if len(steps) == 1 and self.roots == [self.nleaves]:
            d, kernel, idx, _, _, _, _, arity, _ = steps[0]
            if arity and idx is not None and all(i < self.nleaves for i in idx):
                one = (d, kernel, idx)
        plan = (steps, into_steps, consts, one)
        self._kernels = plan
        return plan

    def __call__(self, *leaves: Any, out: Any = None) -> Any:
        # ``out``: a recycled buffer the engine offers a program with blocked runs; only
        # the backend's wrapper of such a program (``_blocked_split.with_pool``) hands it on.
        plan = self._kernels
        if plan is None:
            plan = self._resolve_kernels()
        one = plan[3]
        if one is not None:  # (a blocked run alone: the 256x256 chain)
            return run_one(self.budget, one[0], one[1], one[2], leaves)
        vals: list[Any] = [*leaves, *([None] * len(plan[0])), *plan[2]]
        return self._run(plan[1] if writes_into(leaves) else plan[0], vals, [0] * len(vals), 0, 0.0)

    def sliced(self, *leaves: Any) -> Slices:
        """A run of this program that :meth:`Slices.advance` makes in slices (see :class:`Slices`)."""
        plan = self._kernels
        if plan is None:
            plan = self._resolve_kernels()
        steps = plan[1] if writes_into(leaves) else plan[0]
        return Slices(self, steps, [*leaves, *([None] * len(steps)), *plan[2]])

    def _run(self, steps: list[_PlanStep], vals: list[Any], sizes: list[int], first: int, deadline: float) -> Any:
        # Steps ``first``.. on ``vals``: the interpreter's step-list driver, on this run's budget.
        return run_steps(self.budget, self.nleaves, self.roots, steps, vals, sizes, first, deadline)


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
        if type(out) is Pause:
            self._next = out.next
            return False
        self.result, self._vals = out, None
        return True
