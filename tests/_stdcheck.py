"""Checks for the Array API standard's ops: every surface of one op against one reference.

:func:`check_std` runs an op as a session method and a module function (``check_op``),
as ``ops.<name>`` inside a fused function, and as an expression node built from the op
table (as ``aiotensor.xp`` builds them), each result against the same reference (numpy,
or ``array_api_strict`` through :func:`strict`). Multi-output ops are compared result by
result, and their container type (list, tuple, named tuple) is checked too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import array_api_strict
import numpy as np
from array_api_strict._array_object import Array

import aiotensor as at
from aiotensor.testing import OPS

from ._opcheck import NUMPY_ARG_ERRORS, as_tensors, assert_same, check_op

#: ``(op name, args, kwargs, reference)`` rows, as the parity matrix takes them.
ParityCase = tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]


def strict(name: str) -> Callable[..., Any]:
    """The reference ``array_api_strict.<name>`` on numpy arguments, giving numpy results."""
    fn = getattr(array_api_strict, name)

    def convert(a: Any) -> Any:
        if isinstance(a, np.ndarray):
            return array_api_strict.asarray(a)
        if isinstance(a, list) and any(isinstance(e, np.ndarray) for e in a):
            return [convert(e) for e in a]
        return a

    def back(r: Any) -> Any:
        if isinstance(r, Array):
            return np.from_dlpack(r).copy()
        if isinstance(r, tuple) and hasattr(r, "_fields"):
            return type(r)(*[back(e) for e in r])
        if isinstance(r, list | tuple):
            return type(r)(back(e) for e in r)
        return r

    def reference(*args: Any, **kwargs: Any) -> Any:
        return back(fn(*[convert(a) for a in args], **{k: convert(v) for k, v in kwargs.items()}))

    reference.__name__ = f"array_api_strict.{name}"
    return reference


def _compare(got: Any, want: Any, where: str, *, exact: bool, rtol: float) -> None:
    if isinstance(want, list | tuple):
        assert isinstance(got, list | tuple), f"{where}: gave {type(got).__name__}, expected a sequence"
        assert len(got) == len(want), f"{where}: {len(got)} results, expected {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _compare(g, w, f"{where}[{i}]", exact=exact, rtol=rtol)
        return
    assert_same(got, want, where, exact=exact, rtol=rtol)


async def _values(x: Any) -> Any:
    if isinstance(x, at.Tensor):
        return await x.numpy()
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return type(x)(*[await _values(e) for e in x])
    if isinstance(x, list | tuple):
        return type(x)([await _values(e) for e in x])
    raise AssertionError(f"an op gave {type(x).__name__}")


async def check_std(
    s: at.AsyncEagerSession,
    name: str,
    reference: Callable[..., Any],
    *args: Any,
    exact: bool = False,
    rtol: float = 1e-6,
    container: type | None = None,
    **kwargs: Any,
) -> None:
    """``name(*args, **kwargs)`` equals ``reference`` on every surface (bad input: InvalidArgumentError).

    ``container``: the type a multi-output op returns (``list``, ``tuple``, a named tuple).
    """
    with np.errstate(all="ignore"):
        try:
            expected = reference(*args, **kwargs)
        except NUMPY_ARG_ERRORS:
            expected = None
    if expected is not None and not isinstance(expected, list | tuple):
        await check_op(s, name, reference, *args, exact=exact, rtol=rtol, **kwargs)
    d = OPS[name]
    targs = await as_tensors(s, args)
    where = f"{name}{tuple(a.shape if isinstance(a, np.ndarray) else a for a in args)}"

    def fused(ops: at.FusedOps, *xs: Any) -> Any:
        return getattr(ops, name)(*xs, **kwargs)

    with np.errstate(all="ignore"), s.as_default():
        surfaces: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
            ("session method", lambda: getattr(s, name)(*targs, **kwargs)),
            ("module function", lambda: getattr(at, name)(*targs, **kwargs)),
        ]
        if _has_tensor(targs, kwargs):  # an expression needs a tensor to find its session
            surfaces.append(("expression", lambda: _expression(d, targs, kwargs)))
        if all(not isinstance(a, list) for a in targs):  # fused functions take tensors and numbers
            surfaces.append(("fused ops", lambda: s.function(fused)(*targs)))
        for how, make in surfaces:
            label = f"{where} via {how}"
            if expected is None:
                try:
                    await make()
                except at.InvalidArgumentError:
                    continue
                raise AssertionError(f"{label}: the reference raised, the op did not")
            result = await make()
            if container is not None and how != "fused ops":  # a fused function returns a plain tuple
                assert type(result) is container, f"{label}: gave {type(result).__name__}"
            _compare(await _values(result), expected, label, exact=exact, rtol=rtol)


def _has_tensor(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    flat = [e for a in (*args, *kwargs.values()) for e in (a if isinstance(a, list | tuple) else (a,))]
    return any(isinstance(e, at.Tensor) for e in flat)


async def _expression(d: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    # An expression node of the op, as aiotensor.xp builds one, evaluated by await.
    return await at.Expr(d, *d.prepare(*args, **kwargs))


def to_numpy(a: Any) -> Any:
    """An array_api_strict result (an array, or a tuple of them) as numpy."""
    if isinstance(a, list | tuple):
        return type(a)(to_numpy(e) for e in a) if not hasattr(a, "_fields") else type(a)(*[to_numpy(e) for e in a])
    return np.from_dlpack(a).copy()


def run_sync(
    loop_session: tuple[asyncio.AbstractEventLoop, at.AsyncEagerSession],
    name: str,
    args: list[Any],
    kwargs: dict[str, Any] | None = None,
) -> Any:
    """``await session.<name>(*args, **kwargs)`` (ndarrays as tensors) on the fixture's loop, as numpy."""
    loop, session = loop_session

    async def run() -> Any:
        targs = [await session.constant(a) if isinstance(a, np.ndarray) else a for a in args]
        return await _values(await getattr(session, name)(*targs, **(kwargs or {})))

    return loop.run_until_complete(run())
