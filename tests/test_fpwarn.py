"""numpy's floating-point warnings raised by kernels name the user's line, inline and on the pool."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator
from typing import TypeAlias

import numpy as np
import pytest

import aiotensor as at
from aiotensor import _fpwarn

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
