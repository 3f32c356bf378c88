"""The parity matrix: every op of the table through every path that can run it, against numpy.

Paths: the session method, the module function, the expression awaited, evaluated
(``e.eval()``) and run (``s.run(e)``), the op given an expression, ``apply`` with the
numpy reference as its kernel, a fused function, a batched function (row-wise ops),
each in a session that runs kernels inline and one that sends them all to the pool;
large element-wise ops also through the pool's split. The cleanup strategy rotates
over the cases (a sample, not the cartesian product, to stay fast). Each path must
give numpy's dtype, shape and values, bit for bit (the kernels are numpy's on the
same inputs), or, for bad input, ``InvalidArgumentError``.

The cases are plain tuples in ``tests/_parity_cases.py`` (other modules' cases are
appended there).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor.testing import OPS  # the op table: which ops the matrix must cover

from ._parity_cases import EXCLUDED, FAMILY_ROWS, PARITY_CASES, Case, arr

#: One event loop is enough here: the loops are tested elsewhere, the paths here.
on_asyncio = pytest.mark.asyncio(loop_factories=["asyncio"])
STRATEGIES = list(at.ResourceCleanupStrategy)
_BAD = (TypeError, ValueError, IndexError)
#: Ops whose result keeps the rows of its first argument along axis 0 when its axis is the last.
_ROW_WISE_WITH_LAST_AXIS = frozenset({"softmax", "log_softmax"})


def _want(case: Case) -> Any:
    """numpy's result, or the exception class it raised (a bad-input case)."""
    _, args, kwargs, ref = case
    try:
        with np.errstate(all="ignore"):
            return ref(*args, **kwargs)
    except _BAD as exc:
        return type(exc)


async def _numpy(result: Any) -> Any:
    if isinstance(result, at.Tensor):
        return await result.numpy()
    if isinstance(result, list | tuple):
        return [await _numpy(r) for r in result]
    return result


def _check(got: Any, want: Any, where: str, ulps: int = 0) -> None:
    if isinstance(want, list | tuple):  # several results (a named tuple of the standard's too)
        assert isinstance(got, list), f"{where}: got {type(got).__name__}, numpy gives {type(want).__name__}"
        assert len(got) == len(want), where
        for g, w in zip(got, want, strict=True):
            _check(g, w, where, ulps)
        return
    w = np.asarray(want)
    assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}"
    assert got.dtype == w.dtype, f"{where}: dtype {got.dtype}, numpy gives {w.dtype}"
    assert got.shape == w.shape, f"{where}: shape {got.shape}, numpy gives {w.shape}"
    if ulps and w.dtype.kind in "fc":
        # within ``ulps`` units of the dtype's precision, relative to the largest value
        # (an fft's or a product's near-zero entries carry the rounding of the large ones)
        eps = float(np.finfo(w.dtype).eps) * ulps
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        np.testing.assert_allclose(got, w, rtol=eps, atol=eps * scale, err_msg=where)
        return
    np.testing.assert_array_equal(got, w, err_msg=where, strict=True)


def _ulps(case: Case, path: str) -> int:
    # Bit for bit, except: a family row of a transcendental or product op against its
    # reference (another formula: see FAMILY_ROWS), and a batch, which stacks callers'
    # rows, where numpy's SIMD exp/log may round a row differently at another array
    # length (seen: 1 ulp in silu).
    if OPS[case[0]].cost.name in ("MEMORY", "DIVMOD", "INDEX", "CREATE"):
        return 0
    if id(case) in FAMILY_ROWS:
        return 64 if OPS[case[0]].cost.name == "PRODUCT" else 8
    return 2 if path == "batched" else 0


class _Paths:
    """The ways of running one case in one session, each giving the op's result."""

    def __init__(self, s: at.AsyncEagerSession, case: Case) -> None:
        self.s = s
        self.name, self.args, self.kwargs, self.ref = case
        self.d = OPS[self.name]

    async def tensors(self, *, data_as_exprs: bool = False) -> tuple[Any, ...]:
        # ndarrays as tensors (one level into lists); the op's data arguments optionally
        # as expressions reading them (t[...]: a view, so programs meet views too).
        out: list[Any] = []
        for i, a in enumerate(self.args):
            expr = data_as_exprs and (i < self.d.data or (self.d.data == 0 and isinstance(a, list)))
            out.append(await self._tensor(a, expr))
        return tuple(out)

    async def _tensor(self, a: Any, expr: bool) -> Any:
        if isinstance(a, np.ndarray):
            t = await self.s.constant(a)
            return t[...] if expr else t
        if isinstance(a, list) and any(isinstance(e, np.ndarray) for e in a):
            return [await self._tensor(e, expr) for e in a]
        return a

    def has_tensor(self) -> bool:
        return any(
            isinstance(a, np.ndarray) or (isinstance(a, list) and isinstance(a[0], np.ndarray)) for a in self.args
        )

    def expression(self, args: tuple[Any, ...]) -> at.Expr:
        d = self.d
        if d.plain:  # (no spec to run: the arguments as they are)
            return at.Expr(d, args, self.kwargs or None, None)
        return at.Expr(d, *d.spec(*args, **self.kwargs))

    def all(self) -> dict[str, Callable[[], Awaitable[Any]]]:
        s, name, kw = self.s, self.name, self.kwargs
        paths: dict[str, Callable[[], Awaitable[Any]]] = {
            "method": lambda: self._method(),
            "function": lambda: self._function(),
            "expression": lambda: self._expression(),
            "eval": lambda: self._eval(),
            "run": lambda: self._run(),
            "fused": lambda: self._fused(),
        }
        if self.has_tensor():
            paths["op given an expression"] = lambda: self._op_on_expr()
        if isinstance(_want((name, self.args, kw, self.ref)), type):
            return paths
        paths["apply"] = lambda: self._apply()
        if self._row_wise():
            paths["batched"] = lambda: self._batched()
        del s
        return paths

    def _row_wise(self) -> bool:
        first = self.args[0] if self.args else None
        if not isinstance(first, np.ndarray) or not first.ndim:
            return False
        if not (self.d.elementwise or (self.name in _ROW_WISE_WITH_LAST_AXIS and self.kwargs.get("axis") == -1)):
            return False
        want = np.asarray(_want((self.name, self.args, self.kwargs, self.ref)))
        return want.ndim == first.ndim and want.shape[0] == first.shape[0]

    async def _method(self) -> Any:
        return await getattr(self.s, self.name)(*await self.tensors(), **self.kwargs)

    async def _function(self) -> Any:
        with self.s.as_default():  # (ops without tensors: the default session)
            return await getattr(at, self.name)(*await self.tensors(), **self.kwargs)

    async def _expression(self) -> Any:
        args = await self.tensors(data_as_exprs=True)
        with self.s.as_default():
            return await self.expression(args)

    async def _eval(self) -> Any:
        args = await self.tensors(data_as_exprs=True)
        with self.s.as_default():
            return await self.expression(args).eval()

    async def _run(self) -> Any:
        args = await self.tensors(data_as_exprs=True)
        return await self.s.run(self.expression(args))

    async def _op_on_expr(self) -> Any:
        return await getattr(self.s, self.name)(*await self.tensors(data_as_exprs=True), **self.kwargs)

    async def _apply(self) -> Any:
        ref, kw = self.ref, self.kwargs
        result = await self.s.apply(lambda *a: ref(*a, **kw), *await self.tensors())
        return list(result) if isinstance(result, tuple) else result

    async def _fused(self) -> Any:
        name, kw = self.name, self.kwargs
        result = await self.s.function(lambda ops, *a: getattr(ops, name)(*a, **kw))(*await self.tensors())
        return list(result) if isinstance(result, tuple) else result

    async def _batched(self) -> Any:
        name, kw = self.name, self.kwargs
        x, *params = await self.tensors()
        return await at.batched(lambda ops, x, *p: getattr(ops, name)(x, *p, **kw))(x, *params)


def _ids(case: Case) -> str:
    name, args, kwargs, _ = case
    parts = [f"{a.dtype}{list(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__ for a in args]
    return f"{name}({','.join(parts)}{',' if kwargs else ''}{','.join(kwargs)})"


# The cases, split over the three strategies: each case runs under one (a sample).
_BY_STRATEGY = [[c for i, c in enumerate(PARITY_CASES) if i % 3 == k] for k in range(3)]


@on_asyncio
@pytest.mark.parametrize("k", [0, 1, 2], ids=[s.name for s in STRATEGIES])
async def test_every_op_through_every_path_matches_numpy(k: int) -> None:
    strategy = STRATEGIES[k]
    failures: list[str] = []
    async with (
        at.AsyncEagerSession(cleanup=strategy) as inline,
        at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(inline_threshold_us=0)) as pool,
    ):
        for case in _BY_STRATEGY[k]:
            want = _want(case)
            first: Any = None  # the session method's result: tolerant rows' paths agree with it exactly
            for where, s in (("inline", inline), ("pool", pool)):
                for path, run in _Paths(s, case).all().items():
                    label = f"{_ids(case)} via {path} ({where}, {strategy.name})"
                    try:
                        if isinstance(want, type):
                            with pytest.raises(at.InvalidArgumentError):
                                await run()
                        else:
                            got = await _numpy(await run())
                            _check(got, want, label, _ulps(case, path))
                            if id(case) in FAMILY_ROWS and path not in ("apply", "batched"):
                                if first is None:
                                    first = got
                                else:
                                    _check(got, first, f"{label} against the method")
                    except BaseException as exc:  # collected: one report for the whole matrix
                        if not isinstance(exc, Exception | pytest.fail.Exception):
                            raise
                        failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


#: Element-wise ops through the pool's split (inputs above _chunked.CHUNK_MIN_BYTES).
_LARGE = 1 << 20  # float64 items: 8 MiB
#: Element-wise ops whose domain is (-1, 1) (the sample is in [0.5, 3]).
_UNIT_DOMAIN = frozenset({"acos", "asin", "atanh"})


@on_asyncio
async def test_large_elementwise_ops_split_on_the_pool_match_numpy() -> None:
    big = arr((_LARGE,), "float64", low=0.5, high=3.0)
    other = arr((_LARGE,), "float64", low=0.5, high=3.0)
    cond = big > 1.5
    failures: list[str] = []
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0)) as s:
        a, b, c = await s.constant(big), await s.constant(other), await s.constant(cond)
        unit = big * 0.3
        u = await s.constant(unit)
        whole = (big * 2.5).astype(np.int64)
        w = await s.constant(whole)
        for d in OPS.values():
            if not d.elementwise:
                continue
            n = d.data
            tensors: tuple[at.Tensor, ...]
            if d.name in _UNIT_DOMAIN:  # defined on (-1, 1): the sample scaled into it
                inputs, tensors = (unit,), (u,)
            elif d.name == "acosh":  # defined on [1, inf)
                inputs, tensors = (big + 1.0,), (await s.constant(big + 1.0),)
            elif d.name.startswith("bitwise_"):  # integers only (shifts by 0 to 7)
                inputs = (whole,) * n
                tensors = (w,) * n
            else:
                inputs = {1: (big,), 2: (big, other), 3: (cond, big, other)}[n]
                tensors = {1: (a,), 2: (a, b), 3: (c, a, b)}[n]
            ref = next(ref for name, _, _, ref in PARITY_CASES if name == d.name)
            with np.errstate(all="ignore"):
                want = ref(*inputs)
            got = await (await getattr(s, d.name)(*tensors)).numpy()
            try:
                _check(got, want, f"{d.name} split")
            except AssertionError as exc:
                failures.append(str(exc)[:300])
    assert not failures, "\n".join(failures)


def test_every_op_has_a_case_or_a_reason() -> None:
    covered = {name for name, _, _, _ in PARITY_CASES}
    missing = sorted(set(OPS) - covered - set(EXCLUDED))
    assert not missing, f"ops without a parity case or an exclusion reason: {missing}"
    assert not set(EXCLUDED) & covered, "an excluded op has cases: drop its exclusion"
    assert all(reason.strip() for reason in EXCLUDED.values())
    for name, args, kwargs, ref in PARITY_CASES:
        assert name in OPS, f"a case for an unknown op {name!r}"
        assert isinstance(args, tuple)
        assert isinstance(kwargs, dict)
        assert callable(ref)
        inspect.signature(OPS[name].spec).bind(*args, **kwargs)  # the op's own signature takes it


def test_the_sample_covers_dtypes_shapes_and_layouts() -> None:
    seen_dtypes: set[str] = set()
    zero_d = non_contiguous = broadcasting = bad = 0
    for name, args, kwargs, ref in PARITY_CASES:
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        seen_dtypes |= {a.dtype.name for a in arrays}
        zero_d += any(a.ndim == 0 for a in arrays)
        non_contiguous += any(not a.flags.c_contiguous for a in arrays)
        broadcasting += len({a.shape for a in arrays}) > 1 and OPS[name].elementwise
        bad += isinstance(_want((name, args, kwargs, ref)), type)
    assert {"bool", "int32", "int64", "float32", "float64"} <= seen_dtypes
    assert zero_d
    assert non_contiguous
    assert broadcasting
    assert bad
