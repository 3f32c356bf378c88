"""A run on ``x - x.mean(axis=0)`` fused with that mean and ``x.std(axis=0)``: three passes over ``x``.

A standardization ``(x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8)`` is, op by op, a
mean (one pass over ``x``), a ``std`` (numpy's ``_var``: the mean again, ``x - mean``
into a full-size temporary, squared, summed), then ``x - mean`` once more and the
division. Its deviations ``x - mean`` are the same ufunc on the same operands in the
``std`` and in the run, so :class:`CenteredRun` computes them once: the mean
(``_blocked_var.mean_keepdims``, numpy's own steps), then block by block the
deviations into the result's buffer and their squares summed in a block
(``BlockedVar._blocked``), then the run's other ops with the deviations as an input,
in place in that buffer. Every value is the op-by-op one, bit for bit.

``_blocked.block_runs`` makes this step when a run reads ``subtract(x, m)`` with
``m = mean(x, axis=0)``, and ``var`` or ``std`` of ``x`` over axis 0, both read by the
run alone, and the run's ops up to the one reading the deviations read no other
array that could be sliced by rows (so writing its result over them is safe). When
``x`` does not block (``_blocked_var.blockable``: float32/float64, C-contiguous, two
or more rows...) or a floating-point flag is raised, the mean, the ``std``, the
subtraction and the run are numpy's calls in program order, with numpy's warnings.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

from .._kernels import kernel_error
from .._opdef import OpDef
from ._blocked_run import BlockedRun
from ._blocked_split import _OUT, IDLE_TIER
from ._blocked_var import BlockedVar, blockable, mean_keepdims

__all__ = ["CenteredRun"]

_ndarray = np.ndarray


class CenteredRun:
    """The kernel ``(x, *others)`` of a run on ``x - mean(x)`` with that mean and ``var``/``std`` of ``x``.

    ``sub`` is the ``subtract`` op, ``mean`` and ``var`` the ops with their keyword
    arguments; ``run`` takes its inputs in order with the deviations at ``where[0]``, the mean at
    ``where[1]`` and the variance at ``where[2]``; ``others`` are its remaining inputs
    in their order. ``var_first``: the ``var``/``std`` came before the subtraction in
    the program (the order numpy's warnings come in when the run falls back).
    """

    __slots__ = ("mean", "run", "sub", "var", "var_first", "where")

    def __init__(
        self,
        sub: OpDef,
        mean: tuple[OpDef, dict[str, Any]],
        var: tuple[OpDef, dict[str, Any]],
        run: BlockedRun,
        where: tuple[int, int, int],
        var_first: bool,
    ) -> None:
        self.sub = sub
        self.mean = mean
        self.var = var
        self.run = run
        self.where = where
        self.var_first = var_first

    def __reduce__(self) -> tuple[type[CenteredRun], tuple[Any, ...]]:
        return CenteredRun, (self.sub, self.mean, self.var, self.run, self.where, self.var_first)

    def __call__(self, xp: Any, x: Any, *others: Any) -> Any:
        found = self._fused(x)
        if found is None:
            found = self._op_by_op(x)
        dev, m, v = found

        def inputs(dev: Any) -> tuple[Any, ...]:
            args = list(others)
            for pos, value in sorted(zip(self.where, (dev, m, v), strict=True), key=lambda p: p[0]):
                if pos >= 0:  # (the mean is no input of the run when the subtraction alone read it)
                    args.insert(pos, value)
            return tuple(args)

        def again() -> tuple[Any, ...]:  # the deviations anew: the blocked attempt wrote over them
            with np.errstate(all="ignore"):  # (the subtraction's warnings were given the first time)
                return inputs(np.subtract(x, m))

        if x.shape[0] == 1:  # the mean and variance of one row may be sliced as rows: ops before could write first
            return self.run(xp, *inputs(dev))
        token = _OUT.set([dev])  # the run's result over the deviations (read by one op, see _blocked)
        tier = IDLE_TIER.set(False)  # (split from SPLIT_MIN_BYTES only: see IDLE_TIER)
        try:
            return self.run(xp, *inputs(dev), again=again)
        finally:
            IDLE_TIER.reset(tier)
            _OUT.reset(token)

    def _fused(self, x: Any) -> tuple[Any, Any, Any] | None:
        # The deviations, the mean and the variance in two passes over ``x``; None when
        # ``x`` does not block or a floating-point flag is raised.
        (_, mkw), (vd, vkw) = self.mean, self.var
        ddof = blockable(x, vkw)
        if ddof is None or x.shape[0] < 2 or set(mkw) - {"axis", "keepdims"} or mkw.get("axis") not in (0, (0,)):
            return None
        flagged: list[str] = []

        def record(kind: str, flag: int) -> None:
            flagged.append(kind)

        holder = _OUT.get()
        dev = holder[0] if holder else None
        if dev is not None and dev.shape == x.shape and dev.dtype == x.dtype:
            holder[0] = None  # type: ignore[index]
        else:
            dev = np.empty(x.shape, x.dtype)
        watch = {kind: ("ignore" if mode == "ignore" else "call") for kind, mode in np.geterr().items()}
        with np.errstate(call=record, **cast("Any", watch)):
            arrmean = mean_keepdims(x)
            v = BlockedVar(None, vd.name == "std")._blocked(x, ddof, bool(vkw.get("keepdims")), arrmean, dev)
        if flagged:
            return None
        return dev, arrmean if mkw.get("keepdims") else arrmean[0], v

    def _op_by_op(self, x: Any) -> tuple[Any, Any, Any]:
        # numpy's calls in program order: its values, warnings and errors.
        (md, mkw), (vd, vkw) = self.mean, self.var

        def call(d: OpDef, *args: Any, **kwargs: Any) -> Any:
            try:
                return d.kernel_for(np)(*args, **kwargs)
            except Exception as exc:
                error = kernel_error(d.name, args, exc, False)
                raise error from error.__cause__

        m = call(md, x, **mkw)
        v = call(vd, x, **vkw) if self.var_first else None
        dev = call(self.sub, x, m)
        if v is None:
            v = call(vd, x, **vkw)
        return dev, m, v
