"""Helpers for the op-library tests: run an op both ways and compare it with numpy.

Every op is checked through the session method (``await s.add(a, b)``) and through the
module-level function (``await at.add(a, b)``, which finds the session from its tensor
arguments). The reference is numpy itself on the same inputs as plain arrays, so value,
shape and dtype (numpy's promotion, NEP 50) are all compared.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, NotRequired, TypedDict

import numpy as np
import pytest

import aiotensor as at


class Tolerance(TypedDict):
    """Comparison tolerances, spread into :func:`check_op` or ``np.testing.assert_allclose``."""

    rtol: float
    atol: NotRequired[float]


#: Errors numpy raises for bad arguments; our ops must turn each into InvalidArgumentError.
NUMPY_ARG_ERRORS = (TypeError, ValueError, IndexError)


def describe(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """A short readable form of op arguments for assertion messages."""

    def one(a: Any) -> str:
        if isinstance(a, np.ndarray):
            return f"{a.dtype}{list(a.shape)}"
        if isinstance(a, list):
            return "[" + ", ".join(one(e) for e in a) + "]"
        return repr(a)

    parts = [one(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
    return ", ".join(parts)


async def as_tensors(s: at.AsyncEagerSession, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Each ndarray (also inside lists) as a tensor of ``s``; everything else as it is."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, np.ndarray):
            out.append(await s.constant(a))
        elif isinstance(a, list) and any(isinstance(e, np.ndarray) for e in a):
            out.append([await s.constant(e) if isinstance(e, np.ndarray) else e for e in a])
        else:
            out.append(a)
    return tuple(out)


def assert_same(got: np.ndarray, expected: Any, where: str, *, exact: bool, rtol: float, atol: float = 0.0) -> None:
    """``got`` equals numpy's ``expected`` in dtype, shape and value."""
    want = np.asarray(expected)
    assert isinstance(got, np.ndarray), f"{where}: numpy() gave {type(got).__name__}"
    assert got.dtype == want.dtype, f"{where}: dtype {got.dtype}, numpy gives {want.dtype}"
    assert got.shape == want.shape, f"{where}: shape {got.shape}, numpy gives {want.shape}"
    if exact or want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=where, strict=True)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=where, strict=True)


async def check_op(
    s: at.AsyncEagerSession,
    name: str,
    reference: Callable[..., Any],
    /,
    *args: Any,
    exact: bool = False,
    rtol: float = 1e-6,
    atol: float = 0.0,
    **kwargs: Any,
) -> None:
    """``name(*args, **kwargs)`` as a session method and a module function equals ``reference``.

    ndarray arguments become tensors; python scalars stay python scalars (so numpy's
    weak-scalar promotion is exercised). If numpy raises a bad-argument error, both
    forms must raise :class:`at.InvalidArgumentError` naming the op.
    """
    where = f"{name}({describe(args, kwargs)})"
    # NaN/inf results are compared too; kernels follow the caller's errstate, so one
    # errstate silences numpy's warnings for both the reference and the op.
    with np.errstate(all="ignore"):
        await _check_op(s, name, where, reference, args, kwargs, exact=exact, rtol=rtol, atol=atol)


async def _check_op(
    s: at.AsyncEagerSession,
    name: str,
    where: str,
    reference: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    exact: bool,
    rtol: float,
    atol: float,
) -> None:
    try:
        expected = reference(*args, **kwargs)
        numpy_error: BaseException | None = None
    except NUMPY_ARG_ERRORS as exc:
        numpy_error = exc
    targs = await as_tensors(s, args)
    has_tensor = any(isinstance(a, at.Tensor) or (isinstance(a, list) and at.Tensor in map(type, a)) for a in targs)
    # Without a tensor argument the module function needs a default session.

    def default() -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext() if has_tensor else s.as_default()

    for how, fn in (("session method", getattr(s, name)), ("module function", getattr(at, name))):
        label = f"{where} via {how}"
        if numpy_error is not None:
            with pytest.raises(at.InvalidArgumentError) as info, default():
                await fn(*targs, **kwargs)
            assert name in str(info.value), f"{label}: message does not name the op: {info.value}"
            continue
        with default():
            result = await fn(*targs, **kwargs)
        assert isinstance(result, at.Tensor), f"{label}: returned {type(result).__name__}"
        assert result.session is s, f"{label}: result owned by another session"
        got = await result.numpy()
        assert result.shape == got.shape, f"{label}: metadata disagree with data"
        assert result.dtype == got.dtype, f"{label}: metadata disagree with data"
        assert_same(got, expected, label, exact=exact, rtol=rtol, atol=atol)


@contextlib.contextmanager
def nothing_allocated(s: at.AsyncEagerSession) -> Iterator[None]:
    """The block allocates no tensor in ``s`` (use with an ON_SESSION_CLOSE session: nothing is freed meanwhile)."""
    before = s.stats()
    yield
    after = s.stats()
    assert after.allocated == before.allocated, f"a failing op allocated: {before} -> {after}"
    assert after.live_tensors == before.live_tensors, f"{before} -> {after}"
    assert after.live_bytes == before.live_bytes, f"{before} -> {after}"


async def assert_invalid(
    s: at.AsyncEagerSession, call: Callable[..., Awaitable[Any]], op: str, *fragments: str
) -> at.InvalidArgumentError:
    """``call()`` raises InvalidArgumentError naming ``op`` and each fragment, allocating nothing."""
    with nothing_allocated(s), pytest.raises(at.InvalidArgumentError) as info:
        await call()
    message = str(info.value)
    for part in (op, *fragments):
        assert part in message, f"{part!r} not in the error message {message!r}"
    return info.value


@contextlib.contextmanager
def running_session() -> Iterator[tuple[asyncio.Runner, at.AsyncEagerSession]]:
    """An event loop and an open session on it, for synchronous (hypothesis) tests: ``loop.run(s.op(...))``."""
    loop = asyncio.Runner()
    session = at.AsyncEagerSession()
    loop.run(session.__aenter__())
    try:
        yield loop, session
    finally:
        loop.run(session.__aexit__(None, None, None))
        loop.close()
