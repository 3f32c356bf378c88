"""The step executor of multi-op kernels: every op of an expression, a fused or a batched function is applied here.

Two kinds of driver feed it. An expression compiled to a step list
(:class:`~aiotensor._programs._program.Program`) runs :func:`run_steps` over its plan; a fused or
batched function runs its author's Python eagerly (Python control flow keeps working),
and its ``ops`` object, a subclass of :class:`Interpreter`, applies each op as the
Python reaches it. A blocked run (``_blocked``) is one step of a program like any other.
Either way this module owns, once:

* the numeric checks of an op's data arguments (:func:`checked`), and an exception of a
  kernel turned into the op's own error (``kernel_error``);
* the ``out=`` buffer: a dead intermediate of the output's shape and dtype (``_recycler``).
  Death is known statically (a program's step is the last use of a slot:
  ``into_slots``, ``writable_into``) or dynamically (a fused value's reference count
  when it is dropped: ``Recycler.keep``, then ``Recycler.take`` of the one
  :data:`RECYCLER`);
* the run's memory :class:`Budget`: every value a run makes counts until it dies;
* the kernel call, and what a measured run's ops cost by the cost model (``_cost``), and
  how much of that runs without the GIL (what busy-loop placement weighs: ``_loopload``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from .._cost import estimate_us, gil_free_us
from .._errors import ResourceExhaustedError
from .._kernels import NUMERIC_KINDS, SEQUENCES, as_numeric, kernel_error
from .._loopload import net_free_us
from .._opdef import OPS, OpDef
from .._ops._elementwise import relu_into
from ._recycler import MIN_BYTES, SPECS, SPECS_MAX, WANTED, Recycler, Ref, writable_into

if TYPE_CHECKING:
    from .._types import NDArray

__all__ = ["RECYCLER", "Budget", "Interpreter", "Pause", "checked", "run_one", "run_steps"]

_ndarray = np.ndarray
_ufunc = np.ufunc
_new = object.__new__
_clock = time.perf_counter
_getrefcount = sys.getrefcount
_RELU = OPS["relu"]
_NUMERIC = NUMERIC_KINDS


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


def checked(args: tuple[Any, ...] | list[Any], n: int) -> tuple[Any, ...]:
    """``args`` with the first ``n`` (an op's data arguments) checked numeric, as ``as_numeric`` does."""
    return (
        *[a if type(a) is _ndarray and a.dtype.kind in _NUMERIC else as_numeric(a) for a in args[:n]],
        *args[n:],
    )


# -- ops applied as a function's Python reaches them -------------------------------------


class Interpreter:
    """Applies the ops of one run of a fused or batched function, one at a time, as its Python calls them.

    The driver (``_fusion``'s ``FusedOps``) gives it the op and its arguments' arrays;
    values come back wrapped in the driver's value types (:attr:`_made_type` for a value
    the run made, whose ``__del__`` calls :meth:`_dead`; :attr:`_view_type` for a view
    or an input returned as is). ``measure``: sum the cost model over the ops (the first
    run for its shapes); ``recycle``: outputs from, and dead values to, the
    :class:`Recycler` (batched kernels: their intermediates are large).
    """

    __slots__ = ("_big", "_blas", "_budget", "_estimate", "_fast", "_free", "_keeps", "_recycle", "_releases", "_xp")

    #: The driver's value types (set by ``_fusion._fused_ops``).
    _made_type: ClassVar[type[Any]]
    _view_type: ClassVar[type[Any]]

    def __init__(self, budget: Budget, xp: Any, measure: bool = True, recycle: bool = False) -> None:
        # (FusedOps.__init__ writes this out: keep the two alike)
        self._budget = budget
        self._xp = xp
        # The cost model's µs for the ops run so far (as for single ops), when measured, of
        # which so many ran without the GIL, in so many loops that released it.
        self._estimate: float | None = 0.0 if measure else None
        self._free = 0.0
        self._releases = 0
        self._recycle: Recycler | None = RECYCLER if recycle else None
        # Whether plain ops on values and numbers may take :meth:`_plain` (numpy kernels,
        # nothing to estimate, nothing to recycle).
        self._fast = not measure and not recycle and xp is np
        # Whether plain ops on values and numbers may take :meth:`_kept` (numpy kernels,
        # nothing to estimate, outputs from the recycler: a batch's kernel).
        self._keeps = not measure and recycle and xp is np
        #: Whether an op called BLAS, and an output worth recycling was made or served.
        self._blas = False
        self._big = False

    def _step(self, d: OpDef, label: str, vals: tuple[Any, ...], kw: dict[str, Any] | None, described: Any) -> Any:
        """``d``'s kernel on ``vals`` (arrays and plain values) and ``kw``: its raw output, or the op's error."""
        if self._estimate is not None:
            est = estimate_us(d, vals, kw, None)
            self._estimate += est
            free = gil_free_us(d, vals, kw, est)
            if free:
                self._free += free
                self._releases += 1
        if d.blas:
            self._blas = True
        xp = self._xp
        kernel = d._np_kernel if xp is np else None
        if kernel is None:
            kernel = d.kernel_for(xp)
        try:
            n = d.data
            call = checked(vals, n) if n else vals
            if self._recycle is not None and not kw and xp is np:
                return self._recycled(d, kernel, call)
            return kernel(*call, **kw) if kw else kernel(*call)
        except Exception as exc:  # the same errors as the op would raise outside
            error = kernel_error(label, described, exc, d.user)
            raise error from error.__cause__

    @property
    def free_us(self) -> float:
        """The measured run's GIL-free µs by the cost model, net of transfers (``_loopload.net_free_us``)."""
        return net_free_us(self._free, self._releases)

    def _recycled(self, d: OpDef, kernel: Callable[..., Any], args: tuple[Any, ...]) -> Any:
        # The kernel with a kept buffer as out= when one fits: only element-wise ufuncs
        # with one output, and relu, on arrays of at least one dimension (a Python or 0-d
        # scalar may pick the result dtype under numpy 1.x), the output's shape and dtype
        # learned from a first call with the same argument shapes and dtypes.
        relu = d is _RELU
        if not (relu or (type(kernel) is _ufunc and kernel.nout == 1)):
            return kernel(*args)
        key: tuple[Any, ...] = (d.name,)
        for a in args:
            if type(a) is not _ndarray or not a.ndim:
                return kernel(*args)
            key += (a.shape, a.dtype)
        spec = SPECS.get(key)
        if spec is not None:
            self._big = True
            buf = RECYCLER.take(*spec)
            if buf is None:
                return kernel(*args)
            if relu:
                return relu_into(args[0], buf)
            return kernel(*args, out=buf)
        out = kernel(*args)
        if type(out) is _ndarray and out.nbytes >= MIN_BYTES:
            if len(SPECS) >= SPECS_MAX:
                SPECS.clear()
            SPECS[key] = (out.shape, out.dtype)
            WANTED.add((out.shape, out.dtype))
            self._big = True
        return out

    def _plain(self, d: OpDef, vals: tuple[Any, ...]) -> Any:
        # The hot path of a plain op (no spec) on values and Python numbers (``vals``,
        # the values' arrays) when ``_fast``: :meth:`_step` and :meth:`_made` without
        # what they would not do here.
        kernel = d._np_kernel
        try:
            out = kernel(*vals)  # type: ignore[misc]
        except Exception as exc:
            error = kernel_error(d.name, vals, exc, d.user)  # (arrays describe as values do)
            raise error from error.__cause__
        # A ufunc's output (called without out=) is always a fresh array: no need to ask.
        if type(out) is _ndarray and (type(kernel) is _ufunc or (out.base is None and out.flags.writeable)):
            out.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
            budget = self._budget  # Budget.made, inline: this is most ops of a short function
            live = budget.live + out.nbytes
            if budget.limit is not None and live > budget.limit:
                budget.made(out.nbytes, d.name)  # raises ResourceExhaustedError
            budget.count += 1
            budget.live = live
            if live > budget.peak:
                budget.peak = live
            value = _new(self._made_type)  # _made_type(out, self), without the call
            value._arr = out
            value._ops = self
            return value
        if type(out) is _ndarray:
            return self._view_type(out, self)
        return self._made(np.asarray(out), d.name)

    def _kept(self, d: OpDef, vals: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        # The path of a plain op (no spec) on values and Python numbers (``vals``, the
        # values' arrays; ``args``, as given) when ``_keeps`` (a batch kernel: one call per
        # op of a batch, so :meth:`_made` is called, not written out as in :meth:`_plain`):
        # :meth:`_step` and :meth:`_recycled` without what they would not do here.
        if d.blas:
            self._blas = True
        try:
            out = self._recycled(d, d._np_kernel, vals)  # type: ignore[arg-type]
        except Exception as exc:
            error = kernel_error(d.name, vals, exc, d.user)  # (arrays describe as values do)
            raise error from error.__cause__
        return self._made(out if type(out) is _ndarray else np.asarray(out), d.name, args)

    def _made(self, arr: NDArray, op: str, args: tuple[Any, ...] = ()) -> Any:
        # A value the run made: a fresh array counts in the budget until the value dies.
        if arr.base is None and arr.flags.writeable:
            arr.setflags(False)  # type: ignore[call-arg]  # (positional: cheaper; numpy accepts it)
            self._budget.made(arr.nbytes, op)
            return self._made_type(arr, self)
        # A view (or an input returned as is): no new memory to account for, but a view
        # keeps the value it views (and so its bytes in the budget) while it lives.
        view_type = self._view_type
        value = view_type(arr, self)
        base = arr.base
        if base is not None:
            for a in args:
                if isinstance(a, view_type) and (a._arr is base or a._arr.base is base):
                    value._keep = a
                    break
        return value

    def _dead(self, arr: NDArray) -> None:
        # A value made in this run was dropped (its __del__ does this itself when fast).
        self._budget.live -= arr.nbytes
        recycler = self._recycle
        if recycler is not None:
            recycler.keep(arr)


def _alone() -> int:
    # The reference count Recycler.keep sees for an array held by nothing but the dying
    # value, measured through the same call path as a fused value's __del__ (it differs
    # between Python versions).
    seen: list[int] = []

    class Probe(Recycler):
        def keep(self, arr: NDArray) -> None:
            seen.append(_getrefcount(arr))

    class Value:
        __slots__ = ("_arr", "_ops")
        _arr: NDArray
        _ops: Interpreter

        def __del__(self) -> None:  # as _fusion._fused_value._MadeValue.__del__
            ops = self._ops
            if ops._fast:
                ops._budget.live -= self._arr.nbytes
            else:
                ops._dead(self._arr)

    probe = Interpreter(Budget("probe"), np, measure=True)
    probe._recycle = Probe(0)
    value = Value()
    value._arr = np.empty(1)
    value._ops = probe
    del value
    return seen[0]


_ALONE = _alone()
#: The recycler (its free lists are per thread; what it learned of outputs is shared).
RECYCLER = Recycler(_ALONE)


# -- a program's step list ----------------------------------------------------------------


class Pause:
    """What :func:`run_steps` returns when it stopped at its deadline: the next step to run."""

    __slots__ = ("next",)

    def __init__(self, next_step: int) -> None:
        self.next = next_step


def _resolve(template: Any, vals: list[Any]) -> Any:
    if type(template) is Ref:
        return vals[template.slot]
    if type(template) in (list, tuple) and any(type(e) is Ref for e in template):
        return type(template)(vals[e.slot] if type(e) is Ref else e for e in template)
    return template


def run_steps(
    budget: Budget,
    nleaves: int,
    roots: list[int],
    steps: list[Any],
    vals: list[Any],
    sizes: list[int],
    first: int,
    deadline: float,
) -> Any:
    """Steps ``first``.. of a program's plan on ``vals`` (leaves, then outputs, then constants).

    Returns the program's results, or a :class:`Pause` at the first step that ends past
    ``deadline`` (0: none). Each plan step is (op, kernel, slots of its arguments or
    None, templates, kwargs, checked, slots dropped after it, arity, into): ``arity``
    1 or 2 is the hot case ``kernel(vals[i])`` / ``kernel(vals[i], vals[j])``, 3 or 4
    the same writing into the statically dying intermediate at slot ``into``
    (``_recycler.into_slots``), 0 the general case. What :class:`Interpreter` does per op,
    unrolled for a step list: the budget's :meth:`Budget.made` inline.
    """
    limit = budget.limit
    slot = nleaves + first
    count = budget.count
    live = budget.live
    peak = budget.peak
    for d, kernel, idx, templates, kwargs, checks, drop, arity, into in steps if not first else steps[first:]:
        try:
            if arity == 2:
                out = kernel(vals[idx[0]], vals[idx[1]])
            elif arity == 1:
                out = kernel(vals[idx[0]])
            elif arity == 4:
                a, b = vals[idx[0]], vals[idx[1]]
                y = vals[into]
                if writable_into(y, b if a is y else a):
                    out = kernel(a, b, out=y)
                    live, sizes[into], count = live - sizes[into], 0, count - 1  # no new buffer
                else:
                    out = kernel(a, b)
            elif arity == 3:
                y = vals[into]
                if writable_into(y, y):
                    out = kernel(y, out=y)
                    live, sizes[into], count = live - sizes[into], 0, count - 1  # no new buffer
                else:
                    out = kernel(y)
            else:
                args = [vals[i] for i in idx] if idx is not None else [_resolve(t, vals) for t in templates]
                if checks:
                    args = list(checked(args, checks))
                out = kernel(*args, **{k: _resolve(v, vals) for k, v in kwargs.items()}) if kwargs else kernel(*args)
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
        if deadline and _clock() >= deadline and slot < nleaves + len(steps):
            budget.count, budget.live, budget.peak = count, live, peak
            return Pause(slot - nleaves)
    budget.count, budget.live, budget.peak = count, live, peak
    if len(roots) == 1 and not isinstance(vals[roots[0]], SEQUENCES):
        budget.escaped = 1 if sizes[roots[0]] else 0
        return vals[roots[0]]  # one buffer: a backend keeps it as it is (one Dask task)
    results: list[Any] = []
    budget.escaped = sum(1 for r in set(roots) if sizes[r])
    for r in roots:  # a multi-output root (split) gives several buffers
        v = vals[r]
        if isinstance(v, SEQUENCES):
            results.extend(v)
        else:
            results.append(v)
    return results


def run_one(budget: Budget, d: OpDef, kernel: Callable[..., Any], idx: tuple[int, ...], leaves: tuple[Any, ...]) -> Any:
    """A program of one step reading leaves alone (``kernel(leaves[i])`` or of two): what :func:`run_steps` does for it.

    The 256x256 chain is one blocked step: this skips the step list (its value list,
    sizes and loop), ~1 µs of its ~32 µs kernel. The same error and the same budget.
    """
    try:
        out = kernel(leaves[idx[0]]) if len(idx) == 1 else kernel(leaves[idx[0]], leaves[idx[1]])
    except Exception as exc:
        error = kernel_error(d.name, tuple([leaves[i] for i in idx]), exc, d.user)
        raise error from error.__cause__
    array = type(out) is _ndarray
    if array:
        nbytes = out.nbytes if out.base is None else 0  # (a view of a leaf: no new memory, no intermediate held)
    else:  # a numpy scalar (a reduction) counts; a list (split) does not
        nbytes = getattr(out, "nbytes", 0) if getattr(out, "base", None) is None else 0
    live = budget.live + nbytes
    if budget.limit is not None and live > budget.limit:
        budget.made(nbytes, d.name)  # raises
    budget.count += 1
    budget.live = live
    if live > budget.peak:
        budget.peak = live
    budget.escaped = 1 if nbytes else 0
    if not array and isinstance(out, SEQUENCES):  # a multi-output root (split) gives several buffers
        return list(out)
    return out


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
