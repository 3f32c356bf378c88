"""numpy's floating-point warnings raised by kernels name the user's line, inline and on the pool."""

from __future__ import annotations

import inspect
import re
import traceback
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeAlias

import numpy as np
import pytest

import aiotensor as at
import aiotensor.xp as xp
from aiotensor import _fpwarn
from aiotensor._programs import _blocked_run

Log: TypeAlias = list[warnings.WarningMessage]


@pytest.fixture
def shown() -> Iterator[list[warnings.WarningMessage]]:
    """The warnings shown for this module's lines (aiotensor's own lines fall through to its filter)."""
    with warnings.catch_warnings(record=True) as log:
        warnings.filterwarnings("always", category=RuntimeWarning, module=r"(?!aiotensor\.)")
        yield log


def next_line() -> int:
    """The line after the caller's."""
    frame = inspect.currentframe()
    assert frame is not None
    assert frame.f_back is not None
    return frame.f_back.f_lineno + 1


def where(log: list[warnings.WarningMessage]) -> list[tuple[str, str, int]]:
    return [(str(w.message), w.filename, w.lineno) for w in log]


async def test_an_inline_kernels_warning_names_the_callers_line(s: at.AsyncEagerSession, shown: Log) -> None:
    a = await s.constant(np.full(4, 100.0, np.float32))
    line = next_line()
    y = await s.exp(a)
    assert where(shown) == [("overflow encountered in exp", __file__, line)]
    assert np.isposinf(await y.numpy()).all()  # the result is numpy's, as before
    line = next_line()
    z = await s.divide(a, 0.0)
    assert where(shown)[1:] == [("divide by zero encountered in divide", __file__, line)]
    assert np.isposinf(await z.numpy()).all()


@pytest.mark.parametrize("lean", [True, False], ids=["lean path", "op path"])
async def test_the_engines_own_filter_reaches_each_inline_kernel_call(lean: bool) -> None:
    # pytest's "error" filter makes every RuntimeWarning an exception, which would hide a
    # module of the engine that its filter (_fpwarn.install) misses: here that filter alone
    # decides, as in a plain interpreter (a miss shows the warning at the engine's line).
    config = at.SessionConfig() if lean else at.SessionConfig(memory_limit=1 << 20)  # a limit: not lean
    async with at.AsyncEagerSession(config=config) as s:
        a = await s.constant(np.full(4, 100.0, np.float32))
        with warnings.catch_warnings(record=True) as log:
            warnings.resetwarnings()
            _fpwarn.install()
            warnings.simplefilter("always", append=True)
            line = next_line()
            y = await s.exp(a)
        assert np.isposinf(await y.numpy()).all()
    assert where(log) == [("overflow encountered in exp", __file__, line)]


async def test_a_pool_kernels_warning_names_the_callers_line(shown: Log) -> None:
    config = at.SessionConfig(inline_threshold_us=0)  # every kernel on the pool
    async with at.AsyncEagerSession(config=config) as s:
        a = await s.constant(np.full(1 << 16, 100.0, np.float32))
        line = next_line()
        y = await s.exp(a)
        assert np.isposinf(await y.numpy()).all()
    assert where(shown) == [("overflow encountered in exp", __file__, line)]


async def test_each_line_warns_not_only_the_first(s: at.AsyncEagerSession, shown: Log) -> None:
    a = await s.constant(np.full(4, 100.0, np.float32))
    await s.exp(a)
    await s.exp(a)
    assert len({w.lineno for w in shown}) == 2


async def test_the_callers_errstate_still_decides(s: at.AsyncEagerSession, shown: Log) -> None:
    a = await s.constant(np.full(4, 100.0, np.float32))
    with np.errstate(over="ignore"):
        await s.exp(a)
    assert shown == []
    with np.errstate(over="raise"), pytest.raises(at.AioTensorError, match="overflow"):
        await s.exp(a)


def collected_state() -> dict[str, str] | None:
    """The error modes inside ``collecting()``'s state (``None``: nothing warns), after checking it is left again."""
    from aiotensor import _fpwarn

    before = np.geterr()
    state = _fpwarn.collecting()
    if state is None:
        return None
    errstate, collector = state
    with errstate:
        inside = {k: str(v) for k, v in np.geterr().items()}
        assert np.geterrcall() is collector
    assert np.geterr() == before
    return inside


def test_the_collecting_state_follows_every_change_of_the_callers_errstate() -> None:
    # (the categories that warn are cached per error state: each change must be seen)
    default = collected_state()
    assert default is not None
    assert {k for k, v in default.items() if v == "call"} == {k for k, v in np.geterr().items() if v == "warn"}
    with np.errstate(over="ignore"):
        inside = collected_state()
        assert inside is not None
        assert inside["over"] == "ignore"
        assert inside["divide"] == "call"
    with np.errstate(all="ignore"):
        assert collected_state() is None
    old = np.seterr(divide="raise")
    try:
        inside = collected_state()
        assert inside is not None
        assert (inside["divide"], inside["over"]) == ("raise", "call")
    finally:
        np.seterr(**old)
    assert collected_state() == default


def test_a_collector_is_freed_with_its_kernel() -> None:
    import sys

    from aiotensor import _fpwarn

    state = _fpwarn.collecting()
    assert state is not None
    with state[0]:
        pass
    collector = state[1]
    del state
    # Only this name holds it (and getrefcount's argument): reference counting frees it,
    # there is no cycle through numpy's error state for the garbage collector to find.
    assert sys.getrefcount(collector) == 2


#: Every path a kernel can take: its session's config, and the call made once per session
#: (a fused function is made once: its first call runs on the pool, later ones inline),
#: and the op its warning names (the call's label).
Call: TypeAlias = Callable[[at.Tensor], Awaitable[Any]]
LIMIT = at.SessionConfig(memory_limit=1 << 30)  # not the lean path
POOL = at.SessionConfig(inline_threshold_us=0)  # every kernel on the pool
CALLS: dict[str, tuple[at.SessionConfig | None, Callable[[at.AsyncEagerSession], Call], str]] = {
    "lean op": (None, lambda s: lambda t: s.divide(t, 0.0), "divide"),
    "op path": (LIMIT, lambda s: lambda t: s.divide(t, 0.0), "divide"),
    "pool": (POOL, lambda s: lambda t: s.divide(t, 0.0), "divide"),
    "expression": (None, lambda s: lambda t: t / 0.0, "divide"),
    "expressions": (None, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "expressions, op path": (LIMIT, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "expressions, pool": (POOL, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "blocked": (None, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "blocked, op path": (LIMIT, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "blocked, pool": (POOL, lambda s: lambda t: (t * 2.0) / 0.0, "divide"),
    "xp": (LIMIT, lambda s: lambda t: xp.divide(t, 0.0), "divide"),
    "fused": (None, lambda s: s.function(lambda ops, a: ops.divide(a, 0.0)), "function(<lambda>)"),
    "fused, op path": (LIMIT, lambda s: s.function(lambda ops, a: ops.divide(a, 0.0)), "function(<lambda>)"),
    "fused, pool": (POOL, lambda s: s.function(lambda ops, a: ops.divide(a, 0.0)), "function(<lambda>)"),
    "batched": (None, lambda s: at.batched(lambda ops, a: ops.divide(a, 0.0)), "batched(<lambda>)"),
    "apply": (None, lambda s: lambda t: s.apply(np.divide, t, 0.0), "apply(divide)"),
    "apply, op path": (LIMIT, lambda s: lambda t: s.apply(np.divide, t, 0.0), "apply(divide)"),
}


def items(name: str) -> int:
    """The size of the input: blocked runs start at ``_blocked_run.MIN_ITEMS``."""
    return _blocked_run.MIN_ITEMS * 2 if name.startswith("blocked") else 1 << 10


async def raised(name: str) -> list[BaseException | None]:
    """What ``CALLS[name]`` raises on a zero division in each of three calls (a fused one runs inline once known)."""
    config, make, _ = CALLS[name]
    async with at.AsyncEagerSession(config=config) as s:
        t = await s.constant(np.ones(items(name), np.float32))
        call = make(s)
        errors: list[BaseException | None] = []
        for _ in range(3):
            try:
                await call(t)
                errors.append(None)
            except BaseException as exc:
                errors.append(exc)
        return errors


@pytest.mark.parametrize("name", list(CALLS))
async def test_a_users_error_filter_raises_numpys_runtime_warning_on_every_path(name: str) -> None:
    # numpy raises its RuntimeWarning itself under warnings.simplefilter("error"): so does
    # every path, not an AioTensorError, with the message of the warning reissued at the
    # user's line (the one the pool path shows without the filter).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        errors = await raised(name)
    assert [type(e) for e in errors] == [RuntimeWarning] * 3
    assert {str(e) for e in errors} == {f"divide by zero encountered in {CALLS[name][2]}"}


@pytest.mark.parametrize("name", list(CALLS))
async def test_a_users_error_filter_sees_the_warning_at_the_users_line(name: str) -> None:
    # "error" for the line that awaited the op and for aiotensor's lines (what a blanket
    # "error" filter does there), "always" elsewhere: the exception must be the warning
    # reissued at the user's line (_fpwarn.reissue), as numpy's is at its caller's, not
    # one raised at aiotensor's line, nor a warning reissued elsewhere and only shown.
    config, make, _ = CALLS[name]
    async with at.AsyncEagerSession(config=config) as s:
        t = await s.constant(np.ones(items(name), np.float32))
        call = make(s)
        for _ in range(3):  # (fused functions run inline once known)
            with warnings.catch_warnings(record=True) as log:
                warnings.resetwarnings()
                warnings.filterwarnings("error", category=RuntimeWarning, module=r"aiotensor\.")
                warnings.simplefilter("always", append=True)
                line = next_line() + 2
                warnings.filterwarnings("error", category=RuntimeWarning, module=re.escape(__name__), lineno=line)
                with pytest.raises(RuntimeWarning, match="divide by zero") as info:
                    await call(t)
            assert log == []
            innermost = traceback.extract_tb(info.value.__traceback__)[-1]
            assert (innermost.filename, innermost.name) == (_fpwarn.__file__, "reissue")
