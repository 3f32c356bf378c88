"""Expressions: what operators and tensor methods return, awaited, evaluated, fetched and accounted."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from benchmarks.bench_blocked import chain
from tests._in_flight import request_in_flight
from tests._moved_loop import NEW_LOOPS, moved_session

from ._results import one
from .conftest import settle


async def test_the_tf1_pattern(session: at.AsyncEagerSession) -> None:
    s = session
    a = await s.constant([1.0, 2.0], name="a")
    b = await s.constant([2.0, 3.0], name="b")
    result = a + b  # an expression: nothing runs yet
    assert isinstance(result, at.Expr)
    assert s.stats().allocated == 2
    with s.as_default():
        np.testing.assert_array_equal(await result.eval(), [3.0, 5.0])
    np.testing.assert_array_equal(await s.run(result), [3.0, 5.0])
    np.testing.assert_array_equal(await result.eval(session=s), [3.0, 5.0])
    # eval and run leave nothing behind, whatever the strategy
    assert s.stats().live_tensors == 2
    t = await result
    assert isinstance(t, at.Tensor)
    np.testing.assert_array_equal(await t.numpy(), [3.0, 5.0])
    del a, b, t


async def test_composed_expression_is_one_registered_tensor(session: at.AsyncEagerSession) -> None:
    s = session
    x = await s.random_normal((512, 64), seed=0)
    before = s.stats()
    z = await ((x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8))
    after = s.stats()
    assert after.live_tensors == before.live_tensors + 1  # only the result has a handle
    assert after.live_bytes == before.live_bytes + z.nbytes
    xv = await x.numpy()
    np.testing.assert_allclose(await z.numpy(), (xv - xv.mean(0)) / (xv.std(0) + 1e-8), rtol=1e-6)
    del x, z


@pytest.mark.parametrize("size", [16, 65536])  # inline on the loop, and on the pool
async def test_every_operator_and_method_matches_numpy(s: at.AsyncEagerSession, size: int) -> None:
    rng = np.random.default_rng(1)
    av = rng.uniform(1, 2, size).astype(np.float32)
    bv = rng.uniform(1, 2, size).astype(np.float32)
    a, b = await s.constant(av), await s.constant(bv)
    m = await s.constant(av.reshape(-1, 8))
    cases: list[tuple[Any, Any]] = [
        (a + b, av + bv),
        (a - 1.0, av - 1.0),
        (2.0 - a, 2.0 - av),
        (a * b, av * bv),
        (a / b, av / bv),
        (1.0 / a, 1.0 / av),
        (a // b, av // bv),
        (a % b, av % bv),
        (a**2.0, av**2.0),
        (2.0**a, 2.0**av),
        (-a, -av),
        (abs(-a), np.abs(-av)),
        (a[1:5], av[1:5]),
        (m @ m.T, av.reshape(-1, 8) @ av.reshape(-1, 8).T),
        (a.sum(), av.sum()),
        (m.mean(axis=0), av.reshape(-1, 8).mean(axis=0)),
        (m.max(axis=1, keepdims=True), av.reshape(-1, 8).max(axis=1, keepdims=True)),
        (m.min(axis=0), av.reshape(-1, 8).min(axis=0)),
        (a[:8].prod(), np.prod(av[:8])),
        (m.std(axis=0), av.reshape(-1, 8).std(axis=0)),
        (m.var(), av.reshape(-1, 8).var()),
        (m.argmax(axis=1), av.reshape(-1, 8).argmax(axis=1)),
        (m.argmin(), av.reshape(-1, 8).argmin()),
        (a.reshape((-1, 4)), av.reshape((-1, 4))),
        (a.astype("float64"), av.astype("float64")),
        (m.transpose((1, 0)), av.reshape(-1, 8).transpose((1, 0))),
        (m.T, av.reshape(-1, 8).T),
        (a.clip(1.2, 1.8), av.clip(1.2, 1.8)),
        (a.reshape((1, -1)).squeeze(0), av),
        ((a * 2.0 + 1.0).sum(axis=0), (av * 2.0 + 1.0).sum(axis=0)),
    ]
    for expr, expected in cases:
        assert isinstance(expr, at.Expr)
        value = await expr.eval()
        assert value.dtype == np.asarray(expected).dtype, expr
        np.testing.assert_allclose(value, expected, rtol=2e-6, err_msg=repr(expr))
    assert s.stats().live_tensors == 3


async def test_operators_chain_and_ops_take_expressions(session: at.AsyncEagerSession) -> None:
    s = session
    a = await s.constant([1.0, 2.0])
    y = await s.exp(a * 2.0)  # a session method with an expression argument
    np.testing.assert_allclose(await y.numpy(), np.exp([2.0, 4.0]))
    z = await at.maximum(a - 1.5, (a * 0.0).sum())  # module-level ops too
    np.testing.assert_allclose(await z.numpy(), [0.0, 0.5])
    parts = await s.split(a + 1.0, 2)
    assert [await p.numpy() for p in parts] == [[2.0], [3.0]]
    both = await s.concat([a * 2.0, a])
    np.testing.assert_array_equal(await both.numpy(), [2.0, 4.0, 1.0, 2.0])
    out = await s.run({"e": [a + 1.0, (a * a).sum()], "t": a, "n": (a,)})
    np.testing.assert_array_equal(out["e"][0], [2.0, 3.0])
    assert out["e"][1] == 5.0
    assert s.stats().live_tensors == 1 + 1 + 1 + 2 + 1  # a, y, z, the two parts, both
    del a, y, z, parts, both


async def test_an_expression_is_computed_anew_each_time(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0])
    e = a + 1.0
    t1, t2 = await e, await e
    assert t1 is not t2
    assert s._engine.buffer(t1, "t") is not s._engine.buffer(t2, "t")
    np.testing.assert_array_equal(await t2.numpy(), [2.0])


async def test_common_subexpressions_are_computed_once(s: at.AsyncEagerSession) -> None:
    calls = 0

    def counting(v: Any) -> Any:
        nonlocal calls
        calls += 1
        return v * 2

    a = await s.constant(np.arange(4.0))
    shared = s.apply(counting, a)  # an op awaited on its own: not part of the check
    t = one(await shared)
    m1, m2 = t.mean(axis=0), t.mean(axis=0)  # structurally equal: one node
    program, _ = _compile([(t - m1) / (m2 + 1.0)])
    assert sorted(step[0].name for step in program.steps) == ["add", "divide", "mean", "subtract"]
    e = t * 2.0
    program, _ = _compile([e + e, e * 3.0])  # one run, two roots, e once
    assert sorted(step[0].name for step in program.steps) == ["add", "multiply", "multiply"]
    values = await s.run([e + e, e * 3.0])
    np.testing.assert_array_equal(values[0], np.arange(4.0) * 8)
    assert calls == 1


def _compile(roots: list[at.Expr]) -> Any:
    from aiotensor._programs._compile import compile_program

    for r in roots:
        r._used = True
    return compile_program(roots, lambda x: isinstance(x, at.Tensor), "numpy", at.Expr)


async def test_intermediates_are_dropped_after_their_last_use(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(4))
    b = a + 1.0  # read by c only
    c = b * 2.0
    program, _ = _compile([c + a])
    # slot 0 is the leaf a; b (slot 1) goes after c reads it, c (slot 2) after the add
    assert [step[4] for step in program.steps] == [(), (1,), (2,)]


async def test_intermediates_count_against_the_memory_limit() -> None:
    config = at.SessionConfig(memory_limit=40_000)
    async with at.AsyncEagerSession(config=config) as s:
        x = await s.zeros(1000)  # 8000 bytes
        ok = await ((x + 1.0) * 2.0 + 3.0)  # at most two 8000-byte values at once
        np.testing.assert_array_equal(await ok.numpy(), np.full(1000, 5.0))
        before = s.stats()
        with pytest.raises(at.ResourceExhaustedError, match="inside an expression"):
            wide = x + 1.0
            await (wide + wide * 2.0 + wide * 3.0 + (x + 2.0) * (x + 3.0))
        assert s.stats().live_tensors == before.live_tensors  # nothing left allocated
        assert s.stats().peak_bytes <= 40_000
        del x, ok


async def test_a_failing_node_raises_its_own_error(session: at.AsyncEagerSession) -> None:
    s = session
    a = await s.constant(np.ones((2, 3)))
    b = await s.constant(np.ones((4, 5)))
    before = s.stats()
    with pytest.raises(at.InvalidArgumentError, match=r"matmul\(float64\[2, 3\], float64\[4, 5\]\)"):
        await ((a + 1.0) @ b * 2.0)
    await settle(s)
    assert s.stats().live_tensors == before.live_tensors
    assert s.stats().live_bytes == before.live_bytes
    del a, b


async def test_tensors_of_unrelated_sessions_in_one_expression() -> None:
    async with at.AsyncEagerSession() as s1, at.AsyncEagerSession() as s2:
        a, b = await s1.constant([1.0]), await s2.constant([2.0])
        with pytest.raises(at.InvalidArgumentError, match=r"unrelated sessions|another session"):
            await (a + b)
        with pytest.raises(at.InvalidArgumentError):
            await ((a * 2.0) + (b * 2.0))


async def test_a_child_session_evaluates_parent_tensors() -> None:
    async with at.AsyncEagerSession() as app:
        w = await app.constant([1.0, 2.0])
        async with at.AsyncEagerSession(parent=app) as request:
            x = await request.constant([3.0, 4.0])
            y = await (x * w + w)  # the child may read both: it owns the result
            assert y.session is request
            np.testing.assert_array_equal(await y.numpy(), [4.0, 10.0])
            with request.as_default():
                z = await (w * 2.0)  # only the parent's tensor: the default child owns it
            assert z.session is request
            del x, y, z


async def test_cancelling_an_evaluation_leaks_nothing(strategy: at.ResourceCleanupStrategy) -> None:
    started, release = threading.Event(), threading.Event()

    def slow(v: Any) -> Any:
        started.set()
        release.wait(5)
        return v + 1

    async with at.AsyncEagerSession(cleanup=strategy, config=at.SessionConfig(max_workers=2)) as s:
        a = await s.constant(np.ones(1 << 18))  # large enough to go to the pool, not in slices
        blocker = asyncio.create_task(s.apply(slow, a))
        await asyncio.to_thread(started.wait, 5)
        pending = asyncio.create_task(_eval((a + 1.0) * 2.0 - a))
        await asyncio.sleep(0.01)
        pending.cancel()
        blocker.cancel()
        release.set()
        for t in (pending, blocker):
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await asyncio.sleep(0.05)
    assert s.stats().live_tensors == 0
    assert s.stats().live_bytes == 0


async def _eval(e: at.Expr) -> Any:
    return await e


async def test_an_expression_never_evaluated_warns(s: at.AsyncEagerSession) -> None:
    a = await s.constant([1.0])
    with pytest.warns(RuntimeWarning, match="never evaluated"):
        e = a + 1.0
        del e
        gc.collect()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        inner = a * 2.0
        outer = inner + 1.0  # inner is part of outer: only outer is owed an evaluation
        await outer
        del inner, outer
        gc.collect()


async def test_equality_is_element_wise_and_hash_by_identity(s: at.AsyncEagerSession) -> None:
    # Issue 28 reversed the identity semantics of ==: it compares element-wise, as numpy's.
    a = await s.constant([1.0, 2.0])
    b = await s.constant([1.0, 3.0])
    eq, ne = a == b, a != b
    assert isinstance(eq, at.Expr)
    assert isinstance(ne, at.Expr)
    np.testing.assert_array_equal(await s.run([eq, ne]), [[True, False], [False, True]])
    assert {a: 1, b: 2}[a] == 1  # hash stays by identity: tensors still key dicts
    assert hash(a) != hash(b)
    with pytest.raises(TypeError, match="await it first"):
        bool(a + 1.0)  # type: ignore[unused-ignore]


async def test_session_methods_stay_coroutine_functions(s: at.AsyncEagerSession) -> None:
    import inspect

    a = await s.constant([1.0])
    coro = s.add(a, a)
    assert asyncio.iscoroutine(coro)
    t = await asyncio.create_task(coro)
    np.testing.assert_array_equal(await t.numpy(), [2.0])
    for fn in (s.add, at.add, s.apply, s.run, s.close, s.aclose, a.numpy, (a + 1.0).eval):
        assert inspect.iscoroutinefunction(fn), fn
    await (a + 1.0)


async def test_numpy_functions_on_tensors_still_give_numpy_results(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.arange(6.0).reshape(2, 3))
    assert np.mean(a) == 2.5
    np.testing.assert_array_equal(np.sum(a, axis=0), [3.0, 5.0, 7.0])
    np.testing.assert_array_equal(np.clip(a, 1, 2), np.clip(np.arange(6.0).reshape(2, 3), 1, 2))


async def test_expressions_on_the_dask_backend_are_one_task() -> None:
    pytest.importorskip("distributed")
    from distributed import Client, LocalCluster

    from aiotensor.distributed import DaskBackend

    async with (
        LocalCluster(
            n_workers=1,
            threads_per_worker=1,
            processes=False,
            asynchronous=True,
            dashboard_address=None,
            # The scheduler serves /health and /metrics on 8787 even without a dashboard;
            # another process may hold that port (as in test_distributed).
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as c,
        Client(c, asynchronous=True) as client,
    ):
        backend = DaskBackend(client)
        async with at.AsyncEagerSession(backend=backend) as s:
            x = await s.constant(np.arange(4.0))
            submitted: list[str] = []
            original = client.submit

            def spy(fn: Any, *args: Any, **kwargs: Any) -> Any:
                submitted.append(str(kwargs.get("key")))
                return original(fn, *args, **kwargs)

            client.submit = spy
            y = await ((x - x.mean()) * 2.0 + 1.0)
            client.submit = original
            assert len(submitted) == 1, submitted
            np.testing.assert_allclose(await y.numpy(), (np.arange(4.0) - 1.5) * 2.0 + 1.0)
            del x, y
        await backend.aclose()


async def test_nested_async_with_is_refused_and_the_session_stays_open() -> None:
    s = at.AsyncEagerSession()
    async with s:
        with pytest.raises(RuntimeError, match="already open"):
            async with s:
                pass
        t = await s.constant([1.0])  # still open and usable
        np.testing.assert_array_equal(await t.numpy(), [1.0])
        del t
    async with contextlib.aclosing(at.AsyncEagerSession()) as other:  # aclose() is close()
        await other.zeros(1)
    assert other.closed


# -- metadata, REPL display, several results, forgotten awaits (issue 28) -----------------


async def test_metadata_is_known_before_running(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.zeros((4, 3), np.float32))
    big = await s.zeros((1000, 300), dtype="int8")
    n = await s.constant([1, 0, 2, 0])
    cases: list[tuple[at.Expr, Any, Any]] = [
        (x + 1.0, (4, 3), np.float32),
        (x + n[:, None], (4, 3), np.float64),
        (x == 0.0, (4, 3), np.bool_),
        (x.sum(axis=0), (3,), np.float32),
        (x.mean(axis=1, keepdims=True), (4, 1), np.float32),
        (x.argmax(axis=1), (4,), np.int64),
        (x.T @ x, (3, 3), np.float32),
        (x[1:, None, 0], (3, 1), np.float32),
        (x[n > 0], (None, 3), np.float32),
        (big.sum(axis=1), (1000,), np.int64),
        (big[big > 0], (None,), np.int8),
        (big.reshape((-1, 100)), (3000, 100), np.int8),
        (big.astype("float32").T, (300, 1000), np.float32),
        (at.xp.concat([big, big], axis=1), (1000, 600), np.int8),
        (at.xp.concat([big, big], axis=None), (600000,), np.int8),  # type: ignore[arg-type]
        (at.xp.stack([big, big], axis=-1), (1000, 300, 2), np.int8),
        (at.xp.where(big > 0, big, 1.5), (1000, 300), np.float64),
        (at.xp.clip(big, 0, 2), (1000, 300), np.int8),
        (at.xp.expand_dims(big, axis=-1), (1000, 300, 1), np.int8),
        (at.xp.squeeze(at.xp.expand_dims(big, axis=0), axis=0), (1000, 300), np.int8),
        (at.xp.take(big, n, axis=0), (4, 300), np.int8),
        (big @ big.T, (1000, 1000), np.int8),
        (at.xp.broadcast_to(big[:, :1], (1000, 7)), (1000, 7), np.int8),
        (at.xp.round(big.astype("float32")), (1000, 300), np.float32),
    ]
    for expr, shape, dtype in cases:
        assert expr.shape == shape, expr
        assert expr.dtype == np.dtype(dtype), expr
        assert expr.ndim == len(shape)
        if None not in shape:
            assert expr.size == int(np.prod(shape))
            value = await s.run(expr)
            assert value.shape == shape
            assert value.dtype == dtype
        else:
            assert expr.size is None
            value = await s.run(expr)
            assert value.ndim == len(shape)


async def test_repr_shows_op_shape_and_dtype_and_counts_as_seen(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.zeros((2, 3)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # echoing an expression is not dropping it unevaluated
        e = x * 2.0
        assert repr(e) == "Expr(multiply('constant:0', 2.0), shape=(2, 3), dtype=float64)"
        assert (x + 1.0).shape == (2, 3)  # looking at its metadata is not dropping it either
        del e
        gc.collect()
    with pytest.warns(RuntimeWarning, match="never evaluated"):
        x - 1.0  # dropped without a look: still warns
        gc.collect()


async def test_several_results_are_computed_once(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.arange(12.0).reshape(2, 6))
    whole = at.Expr(at._opdef.OPS["split"], *at._opdef.OPS["split"].spec(x, 3, axis=1))
    parts = whole.results()
    assert [p.shape for p in parts] == [(2, 2)] * 3
    values = await s.run(parts)
    for got, expected in zip(values, np.split(np.arange(12.0).reshape(2, 6), 3, axis=1), strict=True):
        np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(await s.run(parts[1] + parts[2]), [[6.0, 8.0], [18.0, 20.0]])
    np.testing.assert_array_equal((await parts[0]).shape, (2, 2))


async def test_a_forgotten_await_is_named(s: at.AsyncEagerSession) -> None:
    x = await s.constant([1.0, -2.0])
    with pytest.raises(TypeError, match=r"'x2' is a coroutine.*forgotten `await`"):
        x + s.exp(x)
    with pytest.raises(at.InvalidArgumentError, match=r"'x' is a coroutine.*forgotten `await`"):
        await s.sum(s.exp(x))
    with pytest.raises(TypeError, match=r"coroutine.*forgotten `await`"):
        await at.astype(at.greater(x, 0), np.int64)  # no tensor at all: the coroutine is the reason


async def test_expressions_refuse_concrete_values_until_awaited(s: at.AsyncEagerSession) -> None:
    import operator

    e = (await s.constant(2.0)) + 1.0
    for convert in (bool, int, float, complex, operator.index):
        with pytest.raises(TypeError, match="await"):
            convert(e)
    for method in (e.item, e.tolist, e.__dlpack__, e.__dlpack_device__):
        with pytest.raises(TypeError, match="await"):
            method()
    with pytest.raises(TypeError, match="not iterable"):
        list(e)
    assert float(await e) == 3.0


async def test_metadata_runs_no_kernel_on_the_data(s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch) -> None:
    from aiotensor._opdef import OpDef

    x = await s.zeros((2000, 500), dtype="float32")
    lab = await s.constant(np.arange(2000) % 3)
    sizes: list[int] = []
    real = OpDef.kernel_for

    def watched(self: OpDef, namespace: Any) -> Any:
        kernel = real(self, namespace)

        def run(*args: Any, **kwargs: Any) -> Any:
            sizes.extend(int(np.size(a)) for a in args if isinstance(a, np.ndarray))
            return kernel(*args, **kwargs)

        return run

    before = s.stats()
    e = ((x * 2.0 + 1.0).sum(axis=1)[:, None] - x[lab == 0].mean()).T
    with monkeypatch.context() as m:
        m.setattr(OpDef, "kernel_for", watched)
        assert e.shape == (1, 2000)
        assert e.dtype == np.float32
    # Kernels ran only on stand-ins, bounded in size (the data has 1,000,000 elements).
    assert max(sizes, default=0) <= 4096
    after = s.stats()
    assert (after.allocated, after.kernel_seconds) == (before.allocated, before.kernel_seconds)
    assert (await s.run(e)).shape == (1, 2000)


async def test_cached_programs_keep_complex_signed_zeros_apart(s: at.AsyncEagerSession) -> None:
    # Issue 27 (1): each formula evaluated alone, one after the other (the program cache).
    x = await s.constant(np.array([1.0, 2.0]))
    for c in (complex(-0.0, 0.0), 0j, complex(-0.0, -0.0), complex(0.0, -0.0), complex(-0.0, 0.0)):
        got = await ((x * c) * 1.0).eval()
        want = (np.array([1.0, 2.0]) * c) * 1.0
        np.testing.assert_array_equal(np.signbit(got.real), np.signbit(want.real))
        np.testing.assert_array_equal(np.signbit(got.imag), np.signbit(want.imag))


@pytest.mark.parametrize(
    "scalar",
    [np.longdouble(2), np.clongdouble(2 + 1j), np.complex64(1j), np.bool_(True), np.uint8(3), np.float16(-0.0)],
)
async def test_numpy_scalars_of_any_kind_are_constants(s: at.AsyncEagerSession, scalar: Any) -> None:
    # Issue 27 (3): np.longdouble recursed in the value key (its .item() is itself).
    x = await s.constant(np.array([1.0, 2.0]))
    want = np.array([1.0, 2.0]) * scalar
    for _ in range(2):  # compiled, then from the cache
        got = await (x * scalar * 1).eval()
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


async def test_numpy_scalar_constants_keep_their_type_in_the_cache(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.ones(2, dtype=np.float32))
    assert (await (x * np.float32(2) * 1).eval()).dtype == np.float32
    assert (await (x * np.float64(2) * 1).eval()).dtype == np.float64
    assert np.signbit(await (x * np.float32(-0.0) * 1).eval()).all()
    assert not np.signbit(await (x * np.float32(0.0) * 1).eval()).any()


async def test_methods_take_the_keywords_of_their_op(s: at.AsyncEagerSession) -> None:
    # Issue 27 (10): t.std(correction=1) and t.sum(dtype=...) build expressions as s.std does.
    v = np.arange(12.0).reshape(3, 4)
    t = await s.constant(v)
    for e, want in [
        (t.std(axis=0, correction=1), np.std(v, axis=0, ddof=1)),
        (t.var(axis=1, correction=1, keepdims=True), np.var(v, axis=1, ddof=1, keepdims=True)),
        ((t * 2.0).var(correction=1), np.var(v * 2.0, ddof=1)),
        (t.sum(dtype=np.float32), np.sum(v, dtype=np.float32)),
        (t.sum(axis=0, dtype="int64"), np.sum(v, axis=0, dtype="int64")),
    ]:
        assert isinstance(e, at.Expr)
        got = await e.eval()
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want)
    np.testing.assert_allclose(await (await s.std(t, correction=1)).numpy(), np.std(v, ddof=1))
    assert np.std(t, ddof=1) == np.std(v, ddof=1)  # numpy's own keywords: numpy's answer, as before


# -- which session evaluates: one rule (docs/semantics.md) --------------------------------


async def test_every_front_end_evaluates_in_the_same_session() -> None:
    # Issue 27 (4): (w + y).eval() with w a parent's tensor, y a child's, the child as default.
    async with at.AsyncEagerSession() as parent, at.AsyncEagerSession(parent=parent) as child:
        w = await parent.constant(np.ones(3))
        y = await child.constant(np.arange(3.0))
        want = np.arange(3.0) + 1.0
        for default in (None, child):
            with child.as_default() if default is not None else contextlib.nullcontext():
                for e in (w + y, y + w, (w * 1.0) + (y * 1.0)):
                    np.testing.assert_array_equal(await e.eval(), want)
                    t = await e
                    assert t.session is child
                    np.testing.assert_array_equal(await child.run(e), want)
                    assert (await at.add(e, 0.0)).session is child
                    assert one(await at.function(lambda ops, a: a)(e)).session is child
                    assert one(await at.batched(lambda ops, a: a)(e)).session is child
                    np.testing.assert_array_equal(await e.eval(session=child), want)
                    with pytest.raises(at.InvalidArgumentError, match="another session"):
                        await e.eval(session=parent)  # named: the parent cannot read y
        # Only the parent's tensors: the parent, unless the child is the default.
        assert (await (w * 2.0)).session is parent
        with child.as_default():
            assert (await (w * 2.0)).session is child
            assert (await (w * 2.0 + 1.0)).session is child
            np.testing.assert_array_equal(await (w * 2.0 + 1.0).eval(), np.full(3, 3.0))


def _zeros(n: int) -> at.Expr:
    from aiotensor._opdef import OPS  # (the lazy namespace of issue 28 will build these publicly)

    d = OPS["zeros"]
    return at.Expr(d, *d.spec(n))


async def test_an_expression_without_tensors_evaluates_in_the_default_or_named_session() -> None:
    e = _zeros(3) + 1.0
    with pytest.raises(at.NoSessionError, match="as_default"):
        await e
    with pytest.raises(at.NoSessionError, match="session="):
        await e.eval()
    async with at.AsyncEagerSession() as s, at.AsyncEagerSession() as other:
        np.testing.assert_array_equal(await s.run(e), np.ones(3))
        np.testing.assert_array_equal(await e.eval(session=other), np.ones(3))
        with s.as_default():
            t = await e
            assert t.session is s
            np.testing.assert_array_equal(await e.eval(), np.ones(3))
            assert (await _zeros(2)).session is s  # one node: the op path, same rule
        with other.as_default():
            assert (await e).session is other


async def test_numpy_refuses_an_expression_rather_than_wrap_it(s: at.AsyncEagerSession) -> None:
    # np.asarray(e) used to give a 0-d object array: assert_allclose(x + 1, ...) compared garbage.
    x = await s.constant([1.0, 2.0])
    e = x + 1.0
    for convert in (np.asarray, lambda a: np.array([a, a]), lambda a: np.testing.assert_allclose(a, [2.0, 3.0])):
        with pytest.raises(TypeError, match="await"):
            convert(e)
    np.testing.assert_allclose(await e.eval(), [2.0, 3.0])


async def test_len_of_an_expression_is_its_first_size(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.zeros((4, 3)))
    assert len(x + 1.0) == len(x) == 4
    with pytest.raises(TypeError, match="0-d"):
        len(x.sum())
    with pytest.raises(TypeError, match="await"):
        len(x[x[:, 0] > 0])  # known only when it runs
    await s.run([x.sum(), x[x[:, 0] > 0]])


async def test_metadata_of_an_invalid_index_is_unknown_not_wrong(s: at.AsyncEagerSession) -> None:
    x = await s.constant(np.zeros((3, 4)))
    e = x[x]  # a float index: the kernel refuses it
    assert e.shape is None
    assert e.dtype is None
    with pytest.raises(at.InvalidArgumentError, match="integer"):
        await e


async def test_numpy_ufuncs_of_tensors_build_expressions(s: at.AsyncEagerSession) -> None:
    # np.exp(t) raised numpy's "operand 'Tensor' does not support ufuncs (__array_ufunc__=None)".
    v = np.array([0.5, 2.0, -3.0])
    t = await s.constant(v)
    cases: list[tuple[Any, Any]] = [
        (np.exp(t), np.exp(v)),
        (np.log1p(np.abs(t) + 1.0), np.log1p(np.abs(v) + 1.0)),
        (np.maximum(t, 0.0), np.maximum(v, 0.0)),
        (np.arctan2(t, np.ones(3)), np.arctan2(v, np.ones(3))),
        (np.array([10.0, 20.0, 30.0]) + t, np.array([10.0, 20.0, 30.0]) + v),
        (np.array([7.0, 7.0, 7.0]) // t, np.array([7.0, 7.0, 7.0]) // v),
        (np.float32(2.0) ** t, np.float32(2.0) ** v),
        (np.arange(3) < t, np.arange(3) < v),
        (np.eye(3) @ t, np.eye(3) @ v),
        (np.sqrt(t * t), np.sqrt(v * v)),
    ]
    for expr, expected in cases:
        assert isinstance(expr, at.Expr)
        got = await s.run(expr)
        assert got.dtype == expected.dtype
        np.testing.assert_array_equal(got, expected)
    refused: list[Callable[[], object]] = [
        lambda: np.add.reduce(t),
        lambda: np.exp(t, out=np.empty(3)),
        lambda: np.fmod(t, 2.0),
    ]
    for call in refused:
        with pytest.raises(TypeError, match=r"aiotensor\.xp"):
            call()


async def test_chained_comparisons_say_to_use_element_wise_and(s: at.AsyncEagerSession) -> None:
    x = await s.constant([0.5, 2.0])
    with pytest.raises(TypeError, match=r"\(0 < x\) & \(x < 1\)"):
        0 < x < 1  # noqa: B015 -- Python's `and` asks bool() of the first comparison
    np.testing.assert_array_equal(await s.run((x > 0) & (x < 1)), [True, False])


async def test_a_refused_conversion_does_not_warn_again_when_dropped(s: at.AsyncEagerSession) -> None:
    # float(e), bool(e), ... raise "await it first": the expression was seen, not silently dropped.
    x = await s.constant([1.0, 2.0])
    refusals: list[Callable[[at.Expr], object]] = [float, bool, int, lambda e: e.item(), np.asarray]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for refuse in refusals:
            e = x.sum() + 1.0
            with pytest.raises(TypeError, match="await"):
                refuse(e)
            del e
            gc.collect()
    assert [str(w.message) for w in seen if "never evaluated" in str(w.message)] == []


async def test_a_binary_node_has_the_signature_of_the_general_construction(s: at.AsyncEagerSession) -> None:
    # Expr.__init__ builds two-argument nodes without keywords in one pass; with keywords
    # (an empty dict) it takes the general loop: both must give the same signature, tensors
    # read and node count, for every kind of argument the fast pass takes or leaves.
    from aiotensor._expr import Expr
    from aiotensor._opdef import OPS

    a = await s.constant(np.ones(3, np.float32))
    b = await s.constant(np.ones(3, np.float32))
    inner = a * 2.0
    inner._used = True
    unkeyed = a + np.ones(3, np.float32)  # holds an array: no signature
    unkeyed._used = True
    values: list[Any] = [a, b, inner, unkeyed, 2, True, 2.5, 0.0, -0.0, float("nan"), np.float32(2.0), "x", None]
    add = OPS["add"]
    for x in values:
        for y in values:
            fast = Expr(add, (x, y), None, None)
            general = Expr(add, (x, y), {}, None)
            fast._used = general._used = True
            assert fast._sig == general._sig, (x, y)
            assert [id(t) for t in fast._lv] == [id(t) for t in general._lv], (x, y)
            assert fast._n == general._n, (x, y)
            assert fast._kwargs is None


_UNSEEN = itertools.count()


def _spy_general_path(engine: Any, monkeypatch: pytest.MonkeyPatch) -> list[object]:
    # The calls of the general path (``Engine._run_expr``) from now on, recorded.
    general: list[object] = []
    real = engine._run_expr

    def spy(*args: Any) -> Any:
        general.append(args)
        return real(*args)

    monkeypatch.setattr(engine, "_run_expr", spy)
    return general


async def test_an_expression_awaited_with_the_hold_budget_spent_yields_once_then_runs_inline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A program that ran inline before, awaited once the run of inline work has spent
    # its hold budget: another task gets the loop once, then the program runs on the
    # inline path (call_inline), not the general one, and the budget starts over.
    async with at.AsyncEagerSession() as s:
        engine = s._engine
        x = await s.constant(np.arange(12, dtype=np.float32))
        first = await ((x * 2.0 + 1.0) * x)  # compiles it and caches its cost (inline)
        general = _spy_general_path(engine, monkeypatch)
        ran: list[bool] = []
        other = asyncio.get_running_loop().call_soon(ran.append, True)
        engine._held = engine._hold_s
        t = await ((x * 2.0 + 1.0) * x)
        assert ran == [True]  # the loop ran the other callback before the program
        assert general == []  # the inline path ran it
        assert 0.0 < engine._held < engine._hold_s  # the yield reset the budget; the run counted
        expected = (np.arange(12, dtype=np.float32) * 2.0 + 1.0) * np.arange(12, dtype=np.float32)
        np.testing.assert_array_equal(await t.numpy(), expected)
        np.testing.assert_array_equal(await first.numpy(), expected)
        other.cancel()
        # A program whose cost is not known yet (compiled programs are cached across
        # sessions: a shape no other run used): the general path, which yields the same way.
        n = 40 + next(_UNSEEN)
        y = await s.constant(np.arange(n, dtype=np.float32))
        engine._held = engine._hold_s
        u = await ((y + 1.0) * 3.0)
        assert len(general) == 1
        assert engine._held < engine._hold_s
        np.testing.assert_array_equal(await u.numpy(), (np.arange(n, dtype=np.float32) + 1.0) * 3.0)
        del u, y
        del first, t


# The benchmarks' 10-op chain: on 256x256 float32, one blocked step estimated in the
# busy band (above BUSY_INLINE_US, within the default inline threshold).
_chain10 = chain


async def test_an_awaited_program_in_the_busy_band_follows_the_busy_loop_rule() -> None:
    # ``await expr`` decides inline as ``call_inline`` does (its checks written out in
    # _expressions._inline): kept inline on an idle loop, sent to the pool by a busy,
    # contended one. On test clocks: a wall clock this test advances, a CPU clock that
    # follows it while "busy".
    from aiotensor import _loopload
    from aiotensor._loopload import WINDOW_S, Sensor

    clock = {"wall": 100.0, "cpu": 1.0, "busy": 0.0}

    def tick() -> None:
        clock["wall"] += 2 * WINDOW_S
        clock["cpu"] += 2 * WINDOW_S * clock["busy"]

    previous = _loopload._local.sensor
    _loopload._local.sensor = Sensor(cpu=lambda: clock["cpu"], wall=lambda: clock["wall"])
    v = np.random.default_rng(8).standard_normal((256, 256)).astype(np.float32)
    want = _chain10(v)
    try:
        async with at.AsyncEagerSession() as s:
            x = await s.constant(v)
            for _ in range(3):  # idle: inline, each counted as kept
                tick()
                np.testing.assert_array_equal(await (await _chain10(x)).numpy(), want)
            load = at.loop_load()
            assert (load.kept_inline, load.offloaded) == (3, 0)

            async def contended() -> None:  # another caller in flight: the loop is contended
                clock["busy"] = 1.0
                for _ in range(12):
                    tick()
                    np.testing.assert_array_equal(await (await _chain10(x)).numpy(), want)

            await request_in_flight(contended)
            load = at.loop_load()
            assert load.busy
            assert load.offloaded >= 3  # once the average says saturated: the pool
    finally:
        _loopload._local.sensor = previous


async def test_an_expression_awaited_in_a_device_scope_takes_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # A device scope places the kernel: the inline path (_expressions._inline) leaves it to the general one.
    async with at.AsyncEagerSession() as s:
        engine = s._engine
        x = await s.constant(np.arange(6, dtype=np.float32))
        general = _spy_general_path(engine, monkeypatch)
        t = await (x * 2.0 + 1.0)
        assert general == []  # no scope: inline
        with s.device("/cpu:0"):
            u = await (x * 2.0 + 1.0)
        assert len(general) == 1
        np.testing.assert_array_equal(await u.numpy(), await t.numpy())
        assert u.device == t.device == "/cpu:0"
        del t, u


@pytest.mark.parametrize("new_loop", list(NEW_LOOPS.values()), ids=list(NEW_LOOPS))
def test_an_expression_awaited_on_another_loop_is_refused_even_in_the_thread_that_opened_its_session(
    new_loop: Callable[[], asyncio.AbstractEventLoop],
) -> None:
    # The inline path knows its loop by the thread running it (asyncio) or by asking
    # (uvloop). The session's loop first ran in this thread, then runs in another one,
    # and this thread runs a loop of its own (and then a second one in turn): awaiting
    # an expression of its tensor here is the wrong loop, on every path.
    with moved_session(new_loop) as (s, t, loop):

        async def evaluate() -> Any:
            return await ((t * 2.0 + 1.0) * t)  # (the await itself refuses: no tensor made)

        async def value() -> Any:
            return await (await evaluate()).numpy()

        with pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
            asyncio.run(evaluate())
        with asyncio.Runner() as other, pytest.raises(at.WrongEventLoopError, match="bound to the event loop"):
            other.run(evaluate())
        got = asyncio.run_coroutine_threadsafe(value(), loop).result(10)  # its own loop, elsewhere
        np.testing.assert_array_equal(got, (np.arange(3.0) * 2.0 + 1.0) * np.arange(3.0))

        async def live() -> int:
            return s.stats().live_tensors

        assert asyncio.run_coroutine_threadsafe(live(), loop).result(10) == 1  # t alone: nothing made by a refusal
        asyncio.run_coroutine_threadsafe(s.close(), loop).result(10)
