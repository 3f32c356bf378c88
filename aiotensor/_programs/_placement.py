"""Where a kernel runs, inline on the loop or on the pool: the one cost model of every front end.

Static estimates come from ``_cost`` (:func:`~aiotensor._cost.estimate_us`, on arrays
or on :class:`~aiotensor._cost.Spec` objects). A single op is that estimate; a program
(an expression) is the sum over its steps, each output sized from its inputs
(:func:`program_cost`); a fused or batched function's run is the sum over the ops it
ran, measured by the interpreter (``_interpreter.Interpreter``). The engine compares
the result with the session's ``inline_threshold_us`` in one place (``Engine.call``).

What runs measured corrects the estimate where it cannot see: a function's cost is
unknown until it has run, so its first call for given shapes goes to the pool and is
measured by the cost model; from then on that sum decides (:class:`Placement`). Two
consecutive inline runs more than four thresholds long (the function does work of its
own between ops, which the model cannot see) send those shapes back to the pool; one
call in :data:`RETRY_INLINE_EVERY` then runs inline again, and the shapes stay inline if
it is fast (the slow runs were contention, not the function).

A busy loop (``_loopload``) weighs what of a kernel runs without the GIL: for a single op
``_cost.gil_free_us``; for a program the sum over its steps (:func:`program_free_us`);
for a function the sum over the ops of its measured run, kept per shapes with its cost
(:meth:`Placement.free_us`). Each is net of the GIL's hand-overs (``_loopload.net_free_us``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from .._cost import GIL_FREE_ABOVE, OVERHEAD_NS, PER_BYTE, Spec, estimate_us, gil_free_us, out_spec
from .._loopload import net_free_us
from .._opdef import Cost
from ._recycler import Ref

if TYPE_CHECKING:
    from ._program import Program

__all__ = ["RETRY_INLINE_EVERY", "Placement", "Unknown", "program_cost", "program_free_us", "spec_of"]

_ndarray = np.ndarray


def program_cost(program: Program, leaves: list[Any], limit: float) -> float:
    """The estimated µs of ``program`` on ``leaves`` (tensors), ``inf`` past ``limit`` (0: never inline).

    Step by step through the cost model, each step's output sized from its inputs
    (``out_spec``), after the one-pass case of element-wise steps over leaves of one shape.
    """
    if not limit:
        return math.inf
    steps = program.steps
    # The common case first: element-wise and reduction steps over leaves of one shape.
    shape = leaves[0]._shape if leaves else None
    if shape is not None and all(t._shape == shape for t in leaves):
        est = _elementwise_cost(steps, shape, leaves)
        if est is not None:
            return est
    specs: list[Any] = [Spec(t._shape, t._dtype.itemsize) for t in leaves]
    total = 0.0
    for d, templates, kwargs, _, _ in steps:
        try:
            args = tuple(spec_of(t, specs) for t in templates)
        except Unknown:
            return math.inf
        total += estimate_us(d, args, kwargs, None)
        if total > limit:
            return math.inf
        specs.append(out_spec(d, args, kwargs))
    return total


def program_free_us(program: Program, leaves: list[Any], est: float) -> float:
    """What of ``program``'s estimate ``est`` (:func:`program_cost`) runs without the GIL, net of transfers.

    Step by step as :func:`program_cost` goes, each step's ``gil_free_us``; for
    element-wise steps over leaves of one shape, every step's loop runs over that shape:
    all of ``est`` but the steps' dispatch, or nothing. ``inf`` (the pool, as before)
    where a size is unknown.
    """
    steps = program.steps
    shape = leaves[0]._shape if leaves else None
    if (
        shape is not None
        and all(t._shape == shape for t in leaves)
        and _elementwise_cost(steps, shape, leaves) is not None
    ):
        if math.prod(shape) <= GIL_FREE_ABOVE:
            return 0.0
        return net_free_us(est - len(steps) * OVERHEAD_NS / 1000.0, len(steps))
    specs: list[Any] = [Spec(t._shape, t._dtype.itemsize) for t in leaves]
    free, releases = 0.0, 0
    for d, templates, kwargs, _, _ in steps:
        try:
            args = tuple(spec_of(t, specs) for t in templates)
        except Unknown:
            return math.inf
        step = gil_free_us(d, args, kwargs, estimate_us(d, args, kwargs, None))
        if step:
            free += step
            releases += 1
        specs.append(out_spec(d, args, kwargs))
    return net_free_us(free, releases)


_ELEMENTWISE_COSTS = (Cost.MEMORY, Cost.MATH, Cost.DIVMOD)
# Ops of those classes whose output may hold more items than their array input.
_GROWING = frozenset({"broadcast_to", "concat", "stack", "expand_dims"})


def _elementwise_cost(steps: list[Any], shape: tuple[int, ...], leaves: list[Any]) -> float | None:
    """The estimate of a program of element-wise and reduction steps over leaves of one shape, or None.

    No intermediate is larger than that shape, so a step touches at most its array
    arguments plus its output, each of that many items. Items are the leaves' own size
    when they are floats and every constant a plain number (numpy keeps a float dtype
    against python numbers), else 8 bytes. Anything else (products, indexing, ops whose
    output may outgrow their input, arrays among the constants) is None: the
    step-by-step estimate.
    """
    narrow = all(t._dtype.kind == "f" for t in leaves)
    arrays_per_byte = 0.0
    for d, templates, _, _, _ in steps:
        cost = d.cost
        if cost not in _ELEMENTWISE_COSTS or d.name in _GROWING:
            return None
        arrays = 1  # the output
        for t in templates:
            tt = type(t)
            if tt is Ref:
                arrays += 1
            elif tt is _ndarray:
                return None
            elif tt is list or tt is tuple:
                arrays += sum(1 for e in t if type(e) is Ref)
                narrow = False
            elif tt is not float and tt is not int and tt is not bool:
                narrow = False  # a dtype (astype), None, ...: the items may grow
        weight = getattr(d, "weight", None)  # a blocked run (_blocked): its ops' estimates summed
        arrays_per_byte += max(arrays, 2) * PER_BYTE[cost] if weight is None else weight
    itemsize = max(t._dtype.itemsize for t in leaves) if narrow else 8
    return (len(steps) * OVERHEAD_NS + itemsize * math.prod(shape) * arrays_per_byte) / 1000.0


def spec_of(template: Any, specs: list[Any]) -> Any:
    """A step's argument template with each reference replaced by its value's :class:`~aiotensor._cost.Spec`."""
    if type(template) is Ref:
        spec = specs[template.slot]
        if spec is None:
            raise Unknown
        return spec
    if type(template) in (list, tuple):
        return type(template)(spec_of(e, specs) for e in template)
    return template


class Unknown(Exception):
    """A size :func:`spec_of` cannot know before the run."""


#: A function sent back to the pool for its shapes tries inline again once in this many calls.
RETRY_INLINE_EVERY = 64


class Placement:
    """Where the runs of one function go, per key of argument shapes (see the module docstring).

    Shared by fused and batched functions: :meth:`estimate` is the ``est_us`` to run
    with (``None`` until a run has been measured: run on the pool, and measure the run),
    :meth:`record` learns from a run.
    """

    __slots__ = ("_free", "_model", "_strikes", "_struck", "_timings")

    def __init__(self) -> None:
        self._timings: dict[tuple[Any, ...], float] = {}
        self._free: dict[tuple[Any, ...], float] = {}  # the GIL-free µs of a run, net of transfers
        self._strikes: dict[tuple[Any, ...], int] = {}
        self._model: dict[tuple[Any, ...], float] = {}  # the cost model's µs, kept while struck
        self._struck: dict[tuple[Any, ...], int] = {}  # calls since the key was sent to the pool

    def estimate(self, key: tuple[Any, ...]) -> float | None:
        """The estimated µs of a run with these shapes (``inf``: on the pool), ``None`` before the first."""
        est = self._timings.get(key)
        if self._struck and key in self._struck:
            calls = self._struck[key] = self._struck[key] + 1
            if calls % RETRY_INLINE_EVERY == 0:
                return self._model[key]  # one run inline again: was it slow, or the machine?
        return est

    def free_us(self, key: tuple[Any, ...]) -> float:
        """The GIL-free µs of a run with these shapes, net of transfers (``inf`` before the first)."""
        return self._free.get(key, math.inf)

    def record(
        self, key: tuple[Any, ...], est: float, estimate: float, elapsed: float, limit: float, free: float = math.inf
    ) -> None:
        """Learn from a run made with ``est``: the cost model's ``estimate`` of it, its GIL-free µs, its ``elapsed`` µs.

        ``free``: what of ``estimate`` ran without the GIL, net of transfers (a measured
        run's ``Interpreter.free_us``).
        """
        if est > limit:
            if key not in self._timings:
                # First call for these shapes ran on the pool: from now on the cost model's
                # sum over the ops it ran decides, as for single ops.
                self._timings[key] = estimate
                self._free[key] = free
        elif elapsed > 4 * limit:
            # It ran inline and took far longer than the model said: a first run on this
            # thread may be cold once (BLAS warming up), but twice means the function does
            # work of its own between ops: back to the pool for these shapes. (Contention
            # can look the same: BLAS threads still spinning after a burst, the GIL; so
            # once in RETRY_INLINE_EVERY calls it runs inline again, and stays if fast.)
            strikes = self._strikes[key] = self._strikes.get(key, 0) + 1
            if strikes >= 2 and key not in self._struck:
                self._model[key] = self._timings[key]
                self._timings[key] = math.inf
                self._struck[key] = 0
        elif self._strikes:
            self._strikes.pop(key, None)  # only consecutive slow runs count (a GC pause is one)
            if key in self._struck:  # a retry ran fast: inline again
                self._timings[key] = self._model.pop(key)
                del self._struck[key]
