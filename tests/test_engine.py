"""The engine (the op path): argument resolution, error mapping, and results that arrive after close."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._cost import HOLD_PER_OP_S, HOLD_THRESHOLDS
from aiotensor._kernels import BadOutputError, KernelResult, info, kernel_error
from aiotensor.testing import RecordingBackend


async def test_tensors_are_resolved_one_level_deep_and_data_is_left_alone(s: at.AsyncEagerSession) -> None:
    t = await s.constant([1.0, 2.0])
    nested = [[1.0, 2.0], [3.0, 4.0]]
    assert s._engine._seq(nested, "op") is nested  # plain data: not walked, not rebuilt
    resolved = s._engine._seq([t, 3.0], "op")
    assert resolved[0] is s._engine.buffer(t, "op")
    assert resolved[1] == 3.0
    both = await s.concat([t, np.array([5.0])])
    np.testing.assert_array_equal(await both.numpy(), [1.0, 2.0, 5.0])


@pytest.mark.parametrize(
    ("raised", "user_kernel", "expected"),
    [
        (ValueError("bad"), False, at.InvalidArgumentError),
        (TypeError("bad"), False, at.InvalidArgumentError),
        (FloatingPointError("bad"), False, at.InvalidArgumentError),
        (BadOutputError("bad"), True, at.InvalidArgumentError),
        (ValueError("bad"), True, at.KernelError),  # a user's function raising is its own failure
        (RuntimeError("bad"), False, at.KernelError),
        (MemoryError("bad"), True, at.ResourceExhaustedError),
    ],
)
def test_kernel_errors_are_mapped(raised: Exception, user_kernel: bool, expected: type[Exception]) -> None:
    error = kernel_error("matmul", (np.ones((2, 3)), 4), raised, user_kernel)
    assert type(error) is expected
    assert str(error).startswith("matmul(float64[2, 3], 4)")


async def test_a_result_adopted_after_close_is_released_not_registered() -> None:
    backend = RecordingBackend()
    s = at.AsyncEagerSession(backend=backend)
    await s.zeros(1)
    await s.close()
    before = sum(backend.released.values())
    s._engine._adopt(KernelResult([info(np.ones(2))], False))
    assert sum(backend.released.values()) == before + 1
    assert s.stats().live_tensors == 0


@pytest.mark.parametrize("kind", ["op", "fused", "expression"])
async def test_ops_after_a_run_of_inline_ops_still_let_other_tasks_run(s: at.AsyncEagerSession, kind: str) -> None:
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    x = await s.constant([1.0])
    inc = s.function(lambda ops, v: ops.add(v, 1.0))
    await inc(x)  # the first call of a shape runs on the pool (and suspends); later ones inline
    steps: dict[str, Callable[[at.Tensor], Awaitable[Any]]] = {
        "op": lambda v: s.add(v, 1.0),  # the lean path
        "fused": inc,  # Engine.call_inline
        "expression": lambda v: _awaited((v * 1.0) + 1.0),  # a program of two steps, inline
    }
    step = steps[kind]
    task = asyncio.create_task(other())
    # Small ops run inline; once they have held the loop for the budget, the next yields
    # once. Each counts at least HOLD_PER_OP_S, so this many spend it on any machine.
    n = math.ceil(HOLD_THRESHOLDS * s.config.inline_threshold_us / 1e6 / HOLD_PER_OP_S) + 2
    for _ in range(n):
        x = await step(x)
    assert ran.is_set()
    await task
    np.testing.assert_array_equal(await x.numpy(), [n + 1.0])


@pytest.mark.parametrize("path", ["lean", "general", "fused"])
async def test_a_loop_of_failing_inline_ops_still_lets_other_tasks_run(s: at.AsyncEagerSession, path: str) -> None:
    # An op that fails inline held the loop as one that succeeds: a service that retries
    # (or logs and goes on) in a loop must not starve the other tasks.
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    z = await s.constant(np.ones(3, dtype=np.complex128))
    a, b = await s.constant(np.ones(3)), await s.constant(np.ones(4))

    def checked(ops: at.FusedOps, x: Any, fail: bool) -> Any:
        if fail:
            raise ValueError("refused")
        return ops.add(x, 1.0)

    fused = s.function(checked)
    await fused(a, False)  # the first call of these shapes runs on the pool; later ones inline
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "lean": lambda: s.floor(z),  # same shapes: the lean path, whose kernel refuses complex
        "general": lambda: s.add(a, b),  # shapes differ: the general path, inline
        "fused": lambda: fused(a, True),
    }
    error = at.KernelError if path == "fused" else at.InvalidArgumentError
    task = asyncio.create_task(other())
    n = math.ceil(HOLD_THRESHOLDS * s.config.inline_threshold_us / 1e6 / HOLD_PER_OP_S) + 2
    for _ in range(n):
        with pytest.raises(error):
            await calls[path]()
    assert ran.is_set()
    await task


async def test_a_loop_of_small_fetches_still_lets_other_tasks_run(s: at.AsyncEagerSession) -> None:
    # A small fetch copies on the loop without suspending; each counts as an op does.
    ran = asyncio.Event()

    async def other() -> None:
        ran.set()

    x = await s.constant(np.arange(4.0))
    task = asyncio.create_task(other())
    n = math.ceil(HOLD_THRESHOLDS * s.config.inline_threshold_us / 1e6 / HOLD_PER_OP_S) + 2
    for _ in range(n):
        np.testing.assert_array_equal(await x.numpy(), np.arange(4.0))
    assert ran.is_set()
    await task


# -- the lean path of element-wise ops (Engine.op): the same results, errors and accounting as the general one


def _general(**config: Any) -> at.AsyncEagerSession:
    # A memory limit sends every op down the general path.
    return at.AsyncEagerSession(config=at.SessionConfig(memory_limit=1 << 40, **config))


@pytest.mark.parametrize(
    ("op", "args"),
    [
        ("add", (np.arange(6.0).reshape(2, 3), np.ones((2, 3)))),
        ("multiply", (np.arange(4, dtype=np.int32), 3)),
        ("divide", (np.arange(4, dtype=np.float32), 2.0)),
        ("add", (np.arange(3.0), np.ones((2, 3)))),  # shapes differ: broadcasting
        ("add", (np.float64(2.0), np.float64(3.0))),  # 0-d: numpy gives a scalar
        ("exp", (np.linspace(0, 1, 5, dtype=np.float32),)),
        ("where", (np.array([True, False]), np.ones(2), np.zeros(2))),
        ("maximum", (np.arange(3), 1.5)),
    ],
)
async def test_lean_and_general_paths_agree(
    strategy: at.ResourceCleanupStrategy, op: str, args: tuple[Any, ...]
) -> None:
    results = []
    make: Callable[[], at.AsyncEagerSession]
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            assert s._engine._lean is (make is not _general)
            tensors = [await s.constant(a) if isinstance(a, np.ndarray | np.generic) else a for a in args]
            before = s.stats()
            t = await getattr(s, op)(*tensors, name="r")
            after = s.stats()
            assert t.name == "r"
            assert (after.live_tensors, after.allocated) == (before.live_tensors + 1, before.allocated + 1)
            assert after.live_bytes == before.live_bytes + t.nbytes
            results.append(await t.numpy())
            del t
    expected = getattr(np, op)(*args) if op != "where" else np.where(*args)
    for got in results:
        np.testing.assert_array_equal(got, expected)
        assert got.dtype == np.asarray(expected).dtype


@pytest.mark.parametrize(
    ("op", "x", "p", "lean"),
    [
        ("subtract", np.arange(64, dtype=np.float32).reshape(2, 32), np.ones(32, np.float32), True),  # a row of rows
        ("divide", np.arange(6.0).reshape(2, 3), np.arange(1.0, 7.0).reshape(2, 3), True),  # one shape
        ("add", np.arange(3.0).reshape(3, 1), np.arange(4.0), False),  # both broadcast: the general path
        ("multiply", np.arange(6, dtype=np.int16).reshape(3, 2), np.float64(2.5), True),  # a 0-d parameter
    ],
)
async def test_arrays_and_broadcast_rows_are_owned_results(
    strategy: at.ResourceCleanupStrategy, op: str, x: np.ndarray[Any, Any], p: np.ndarray[Any, Any], lean: bool
) -> None:
    """A request's ndarray against a session's parameter: numpy's values in a fresh owned read-only buffer.

    Lean (the shorter shape ends the longer one) or general (any other broadcast), the
    result is the same, and the caller's array is neither kept nor made read-only.
    """
    from aiotensor._opdef import OPS

    expected = getattr(np, op)(x, p)
    make: Callable[[], at.AsyncEagerSession]
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            param = await s.constant(p)
            before = s.stats()
            t = await getattr(s, op)(x, param)
            after = s.stats()
            assert (after.live_tensors, after.allocated) == (before.live_tensors + 1, before.allocated + 1)
            assert after.live_bytes == before.live_bytes + t.nbytes
            assert (t.shape, t.dtype) == (expected.shape, expected.dtype)
            got = await t.numpy()
            np.testing.assert_array_equal(got, expected)
            view = np.asarray(t)
            assert not view.flags.writeable
            assert not np.shares_memory(view, x)
            assert x.flags.writeable
            took_lean = s._engine.lean(OPS[op], (x, param), None) is not None
            assert took_lean is (lean and make is not _general)


async def test_lean_path_refuses_arrays_that_are_not_numbers(s: at.AsyncEagerSession) -> None:
    ones = await s.constant(np.ones(2))
    with pytest.raises(at.InvalidArgumentError, match="not numeric"):
        await s.add(np.array(["a", "b"]), ones)
    with pytest.raises(at.InvalidArgumentError, match="not numeric"):
        await s.add(np.array([None, 1], dtype=object), ones)
    assert s.stats().allocated == 1


async def test_lean_path_errors_are_the_ops_own(s: at.AsyncEagerSession) -> None:
    i = await s.constant(np.arange(3))
    with pytest.raises(at.InvalidArgumentError, match="pow"):
        await s.pow(i, -1)  # numpy refuses integers to negative powers
    with pytest.raises(at.InvalidArgumentError, match="add"):
        await s.add(i, await s.constant(np.ones(4)))  # shapes that do not broadcast
    async with at.AsyncEagerSession() as other:
        foreign = await other.constant(np.arange(3))
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await s.add(i, foreign)
    assert s.stats().allocated == 2  # i and the ones(4): the failed ops allocated nothing


async def test_lean_path_respects_device_blocks_and_names(s: at.AsyncEagerSession) -> None:
    a = await s.constant(np.ones(2))
    with pytest.raises(at.InvalidArgumentError, match="name must be a str"):
        await s.add(a, a, name=3)  # type: ignore[arg-type]
    with pytest.raises(at.InvalidDeviceError), s.device("/gpu:7"):
        await s.add(a, a)
    t = await s.add(a, a)
    assert t.device == "/cpu:0"


# -- products on the lean path: numpy's shapes, dtypes and errors, the general path's results


_RNG = np.random.default_rng(3)


def _arr(shape: tuple[int, ...], dtype: Any) -> np.ndarray[Any, Any]:
    return (_RNG.standard_normal(shape) * 4).astype(dtype)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (_arr((16, 32), np.float32), _arr((32, 4), np.float32)),  # a request's rows by a model's weights
        (_arr((3, 5), np.int32), _arr((5, 2), np.float32)),  # dtypes promote as numpy's
        (_arr((4, 3), np.float64), _arr((3,), np.int64)),  # 2-d by 1-d
        (_arr((3,), np.float32), _arr((3, 2), np.float64)),  # 1-d by 2-d
        (_arr((5,), np.int16), _arr((5,), np.int16)),  # 1-d by 1-d: a 0-d result
        (_arr((2, 1, 3, 4), np.float32), _arr((5, 4, 2), np.float32)),  # batch dims broadcast
        (_arr((2, 3), np.complex64), _arr((3, 3), np.float32)),
    ],
)
@pytest.mark.parametrize("given", ["tensors", "an array"])
async def test_matmul_takes_the_lean_path_with_the_general_paths_results(
    strategy: at.ResourceCleanupStrategy, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], given: str
) -> None:
    from aiotensor._opdef import OPS

    expected = np.matmul(a, b)
    make: Callable[[], at.AsyncEagerSession]
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            x = a if given == "an array" else await s.constant(a)
            y = await s.constant(b)
            before = s.stats()
            t = await s.matmul(x, y, name="r")
            after = s.stats()
            assert t.name == "r"
            assert (after.live_tensors, after.allocated) == (before.live_tensors + 1, before.allocated + 1)
            assert after.live_bytes == before.live_bytes + t.nbytes
            assert (t.shape, t.dtype) == (np.shape(expected), np.asarray(expected).dtype)
            got = await t.numpy()
            np.testing.assert_array_equal(got, expected)
            assert got.dtype == np.asarray(expected).dtype
            if isinstance(x, at.Tensor):  # a one-node expression: the same
                e = await (x @ y)
                np.testing.assert_array_equal(await e.numpy(), expected)
            assert a.flags.writeable  # the caller's array: not kept, not frozen
            assert (s._engine.lean(OPS["matmul"], (x, y), None) is not None) is (make is not _general)


@pytest.mark.parametrize(
    ("a", "b", "match"),
    [
        (np.ones((2, 3)), np.ones((4, 5)), "matmul"),  # inner dimensions differ
        (np.ones((2, 2, 3)), np.ones((3, 3, 2)), "matmul"),  # batch dims that do not broadcast
        (np.ones(3), np.ones(4), "matmul"),  # 1-d of different lengths
        (np.float64(2.0), np.ones((2, 2)), "matmul"),  # a 0-d operand
        (np.array([True, False]), np.array([True, True]), None),  # bools: numpy's answer, whatever it is
    ],
)
async def test_matmul_errors_on_the_lean_path_are_the_general_paths(
    strategy: at.ResourceCleanupStrategy, a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], match: str | None
) -> None:
    outcomes: list[Any] = []
    make: Callable[[], at.AsyncEagerSession]
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            x, y = await s.constant(a), await s.constant(b)
            before = s.stats().allocated
            try:
                t = await s.matmul(x, y)
            except at.AioTensorError as exc:
                outcomes.append((type(exc), str(exc)))
                assert s.stats().allocated == before  # a failed op allocates nothing
            else:
                outcomes.append(await t.numpy())
    if match is None:
        np.testing.assert_array_equal(outcomes[0], outcomes[1])
    else:
        assert outcomes[0] == outcomes[1]
        assert outcomes[0][0] is at.InvalidArgumentError
        assert match in outcomes[0][1]


async def test_matmul_of_numbers_and_foreign_tensors_takes_the_general_path(s: at.AsyncEagerSession) -> None:
    from aiotensor._opdef import OPS

    m = await s.constant(np.ones((2, 2)))
    assert s._engine.lean(OPS["matmul"], (m, 2.0), None) is None  # numpy's error, from the general path
    with pytest.raises(at.InvalidArgumentError, match="matmul"):
        await s.matmul(m, 2.0)
    async with at.AsyncEagerSession() as other:
        foreign = await other.constant(np.ones((2, 2)))
        with pytest.raises(at.InvalidArgumentError, match="another session"):
            await s.matmul(m, foreign)
    with pytest.raises(at.InvalidDeviceError), s.device("/gpu:7"):
        await s.matmul(m, m)
    async with at.AsyncEagerSession(parent=s) as child:  # a parent's tensor: read, as on the general path
        t = await child.matmul(m, m)
        np.testing.assert_array_equal(await t.numpy(), np.full((2, 2), 2.0))


async def test_matmul_over_the_busy_band_asks_placement_like_the_general_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A product estimated above ``BUSY_INLINE_US``: lean only while the loop keeps it (``stays_inline``)."""
    from aiotensor._cost import estimate_us
    from aiotensor._engine import _lean
    from aiotensor._loopload import BUSY_INLINE_US
    from aiotensor._opdef import OPS

    a, b = np.ones((64, 128)), np.ones((128, 96))
    async with at.AsyncEagerSession() as s:
        assert BUSY_INLINE_US < estimate_us(OPS["matmul"], (a, b), None, None) <= s._engine.inline_us
        x, y = await s.constant(a), await s.constant(b)
        assert s._engine.lean(OPS["matmul"], (x, y), None) is not None  # an idle loop: inline
        monkeypatch.setattr(_lean, "stays_inline", lambda free_us=math.inf: False)
        assert s._engine.lean(OPS["matmul"], (x, y), None) is None  # busy: the general path decides
        small = await s.constant(np.ones((4, 4)))
        assert s._engine.lean(OPS["matmul"], (small, small), None) is not None  # below the band: never asked
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=1.0)) as s:
        x = await s.constant(np.ones((4, 4)))
        assert s._engine.lean(OPS["matmul"], (x, x), None) is None  # over the threshold: the pool


@pytest.mark.parametrize("x", [np.linspace(-2, 2, 7, dtype=np.float32), np.arange(6).reshape(2, 3), np.float64(0.5)])
async def test_erf_takes_the_lean_path_with_the_general_paths_results(
    strategy: at.ResourceCleanupStrategy, x: np.ndarray[Any, Any]
) -> None:
    """A special function of numpy steps (``Cost.SPECIAL``): element-wise, so lean; its kernel's own output."""
    from aiotensor._opdef import OPS

    results = []
    make: Callable[[], at.AsyncEagerSession]
    for make in (lambda: at.AsyncEagerSession(cleanup=strategy), _general):
        async with make() as s:
            t = await s.constant(x)
            r = await s.erf(t)
            assert r.shape == np.shape(x)
            results.append(await r.numpy())
            assert (s._engine.lean(OPS["erf"], (t,), None) is not None) is (make is not _general)
    np.testing.assert_array_equal(results[0], results[1])
    assert results[0].dtype == results[1].dtype == (x.dtype if x.dtype.kind == "f" else np.float64)
    np.testing.assert_allclose(results[0], np.vectorize(math.erf)(x), rtol=1e-6)


# -- expressions a little over the inline threshold: on the loop, in slices


def _chain(t: Any) -> Any:  # on a tensor an expression, on an array numpy's values
    y = t * 2.0 + 1.0
    y = y * y - t
    return abs(y) / 3.0


_V = np.linspace(-2.0, 2.0, 4096)


async def _estimate(e: Any) -> float:
    # What the engine estimates for this expression under the default threshold.
    from aiotensor._engine._expressions import _is_tensor
    from aiotensor._expr import Expr
    from aiotensor._programs._compile import compile_program
    from aiotensor._programs._placement import program_cost

    e._used = True
    async with at.AsyncEagerSession() as probe:
        program, leaves = compile_program([e], _is_tensor, "numpy", Expr)
        return program_cost(program, leaves, probe._engine.inline_us)


def _no_pool(s: at.AsyncEagerSession) -> list[Any]:
    # The kernels the session submitted (its backend is a RecordingBackend: _session_for).
    backend = s.backend
    assert isinstance(backend, RecordingBackend)
    return backend.submitted


def _every_step_a_slice(monkeypatch: pytest.MonkeyPatch, *, yields: bool = True) -> None:
    # A clock past every deadline: each step ends its slice. With ``yields``, sessions
    # made afterwards have no hold budget, so the loop runs other tasks after each slice.
    from aiotensor._engine import _core
    from aiotensor._programs import _interpreter

    monkeypatch.setattr(_interpreter, "_clock", lambda: math.inf)
    if yields:
        monkeypatch.setattr(_core, "HOLD_THRESHOLDS", 0)


async def _session_for(estimate: float, factor: float, strategy: at.ResourceCleanupStrategy, **config: Any) -> Any:
    # A session whose threshold puts an expression of ``estimate`` µs at ``factor`` thresholds.
    return at.AsyncEagerSession(
        cleanup=strategy,
        config=at.SessionConfig(inline_threshold_us=estimate / factor, **config),
        backend=RecordingBackend(),
    )


class _Ticks:
    """A task that counts the turns of the loop it gets (``n``), until ``stop()``."""

    def __init__(self) -> None:
        self.n = 0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            self.n += 1
            await asyncio.sleep(0)

    def stop(self) -> None:
        self._task.cancel()


@pytest.mark.parametrize(("factor", "where"), [(0.5, "inline"), (2.0, "sliced"), (6.0, "pool")])
async def test_where_an_expression_runs_follows_its_estimate(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch, factor: float, where: str
) -> None:
    est = await _estimate(_chain(await _probe_tensor()))
    _every_step_a_slice(monkeypatch, yields=where == "sliced")  # (no budget: inline work would yield first)
    async with await _session_for(est, factor, strategy) as s:
        submitted = _no_pool(s)
        a = await s.constant(_V)
        ticks = _Ticks()
        await asyncio.sleep(0)
        before = ticks.n
        t = await _chain(a)
        during = ticks.n - before
        ticks.stop()
        np.testing.assert_allclose(await t.numpy(), _chain(_V))
        assert len(submitted) == (1 if where == "pool" else 0)
        if where == "sliced":
            assert during >= 4  # the loop ran other tasks between the five steps
        if where == "inline":
            assert during == 0  # one inline kernel: nothing else ran meanwhile
        del t, a
    assert s.stats().live_tensors == 0


async def test_a_sliced_run_yields_only_once_the_hold_budget_is_spent(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slices count towards the same budget as inline ops: within it the loop is held
    # (as by a run of inline ops), past it the run yields at its next slice boundary.
    est = await _estimate(_chain(await _probe_tensor()))
    _every_step_a_slice(monkeypatch, yields=False)
    async with await _session_for(est, 2.0, strategy) as s:
        submitted = _no_pool(s)
        engine = s._engine
        # A budget that five small slices cannot spend even on a loaded machine (16
        # thresholds of this session are ~0.2 ms): whether the run yields is up to what
        # the test says was held before it.
        engine._hold_s = 1.0
        a = await s.constant(_V)
        ticks = _Ticks()
        await asyncio.sleep(0)
        engine._held = 0.0
        before = ticks.n
        t = await _chain(a)
        assert ticks.n == before  # five slices, no yield: the budget was not spent
        assert engine._held > 0.0  # the slices' time counts
        engine._held = engine._hold_s  # spent: the run yields after its first slice
        before = ticks.n
        u = await _chain(a)
        assert ticks.n > before
        assert engine._held < engine._hold_s  # the yield reset it
        ticks.stop()
        assert submitted == []
        for r in (t, u):
            np.testing.assert_allclose(await r.numpy(), _chain(_V))
        del t, u, a
    assert s.stats().live_tensors == 0


async def _probe_tensor() -> Any:
    async with at.AsyncEagerSession() as probe:
        return await probe.constant(_V)


async def test_a_sliced_run_cancelled_between_slices_leaks_nothing(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    est = await _estimate(_chain(await _probe_tensor()))
    _every_step_a_slice(monkeypatch)
    async with await _session_for(est, 2.0, strategy) as s:
        a = await s.constant(_V)
        before = s.stats()
        task = asyncio.create_task(_awaited(_chain(a)))
        for _ in range(3):  # into its second slice
            await asyncio.sleep(0)
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        after = s.stats()
        assert after.live_tensors == before.live_tensors
        assert after.live_bytes == before.live_bytes
        np.testing.assert_allclose(await _chain(a).eval(), _chain(_V))  # and the next run is whole
        del a


async def test_a_session_closed_between_slices_stops_the_run(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    est = await _estimate(_chain(await _probe_tensor()))
    _every_step_a_slice(monkeypatch)
    s = await _session_for(est, 2.0, strategy)
    async with s:
        a = await s.constant(_V)
        task = asyncio.create_task(_awaited(_chain(a)))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    with pytest.raises(at.SessionClosedError, match="closed while"):
        await task
    assert s.stats().live_tensors == 0
    assert s.stats().live_bytes == 0


async def test_a_sliced_run_fails_as_the_op_would_and_keeps_the_memory_limit(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    est = await _estimate(_chain(await _probe_tensor()))
    _every_step_a_slice(monkeypatch)
    # Room for the leaf and one more array: the chain's second live intermediate does not fit.
    limit = 2 * _V.nbytes + 1000
    async with await _session_for(est, 2.0, strategy, memory_limit=limit) as s:
        a = await s.constant(_V)
        with pytest.raises(at.ResourceExhaustedError, match="inside an expression"):
            await ((a * 2.0) * (a * 3.0))  # two intermediates alive at once
        m = await s.constant(np.ones((4, 4)))
        with pytest.raises(at.InvalidArgumentError, match="matmul"):
            await (((a * 2.0) + 1.0) @ m)  # the failing step is in a later slice
        assert s.stats().live_tensors == 2
        del a, m


async def _awaited(e: Any) -> Any:
    return await e


async def test_an_expression_that_runs_inline_needs_no_coroutine_and_the_others_take_the_general_path(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Expr.__await__ gets an inline program's result at once from Engine.evaluate_expr; a
    # session that is not lean, or a program over the inline threshold, awaits the
    # general path (_run_program), on the program compiled once.
    from aiotensor._engine import _expressions
    from aiotensor._engine._core import Engine
    from aiotensor._programs import _compile

    general: list[Any] = []
    original = Engine._run_program
    compiles: list[Any] = []
    compiled = _compile.compiled

    async def counted(self: Engine, *args: Any) -> Any:
        general.append(args)
        return await original(self, *args)

    def counted_compile(*args: Any) -> Any:
        compiles.append(args)
        return compiled(*args)

    monkeypatch.setattr(Engine, "_run_program", counted)
    monkeypatch.setattr(_expressions, "compiled", counted_compile)
    v = np.arange(6.0)
    configs: list[tuple[at.SessionConfig, bool]] = [
        (at.SessionConfig(), True),
        (at.SessionConfig(memory_limit=1 << 20), False),  # a limit to fit results under: not lean
        (at.SessionConfig(inline_threshold_us=0.001), False),  # over the threshold: the pool
    ]
    for config, inline in configs:
        general.clear()
        compiles.clear()
        async with at.AsyncEagerSession(cleanup=strategy, config=config) as s:
            a = await s.constant(v)
            t = await ((a * 2.0 + 1.0) / 4.0)
            np.testing.assert_array_equal(await t.numpy(), (v * 2.0 + 1.0) / 4.0)
            assert len(general) == (0 if inline else 1), config
            assert len(compiles) == 1
            assert s.stats().live_tensors == 2  # a and the result: no intermediate registered
            del t, a
        assert s.stats().live_tensors == 0


async def test_adopt_owns_a_fresh_array_without_a_copy_and_refuses_anything_else() -> None:
    async with at.AsyncEagerSession() as s:
        await s.constant(0.0)  # opened on this loop
        x = np.array([[0, 1, 2], [3, 4, 5]], dtype=np.float32)
        t = s._engine.adopt(x, "rows")
        assert t is not None
        assert s._engine.buffer(t, "test") is x  # the array itself, now read-only
        assert not x.flags.writeable
        assert (t.name, t.shape, t.dtype) == ("rows", (2, 3), np.dtype(np.float32))
        assert t.session is s
        np.testing.assert_array_equal(await t.numpy(), np.arange(6).reshape(2, 3))
        # What someone else may hold or write, not C-ordered, or not numeric: refused, for an op to copy.
        base = np.zeros(4)
        assert s._engine.adopt(base[1:], None) is None
        assert s._engine.adopt(x, None) is None  # read-only
        assert s._engine.adopt(np.array(["a"]), None) is None
        assert s._engine.adopt([1.0, 2.0], None) is None
        assert s._engine.adopt(np.ones((3, 2), order="F"), None) is None  # constant would make it C-ordered
        allocated = s.stats().allocated
    assert s.stats().live_tensors == 0
    assert allocated == 2
    # A session with a memory limit (its bytes must be fitted first) or not open here takes the op.
    async with at.AsyncEagerSession(config=at.SessionConfig(memory_limit=1 << 20)) as limited:
        await limited.constant(0.0)
        assert limited._engine.adopt(np.ones(3), None) is None
    assert at.AsyncEagerSession()._engine.adopt(np.ones(3), None) is None


async def test_a_sliced_run_under_a_users_error_filter_raises_numpys_warning_at_the_users_line(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As every other path (tests/test_fpwarn.py): the RuntimeWarning itself, reissued at
    # the line that awaited the expression (the program run again, collecting).
    import traceback
    import warnings

    from aiotensor import _fpwarn
    from aiotensor._engine._core import Engine

    def divided(t: Any) -> Any:
        return (_chain(t) + 1.0) / 0.0  # (positive: only a division by zero)

    est = await _estimate(divided(await _probe_tensor()))
    _every_step_a_slice(monkeypatch, yields=False)
    sliced: list[str] = []
    real = Engine._run_sliced

    async def spy(self: Any, label: str, *args: Any) -> Any:
        sliced.append(label)
        return await real(self, label, *args)

    monkeypatch.setattr(Engine, "_run_sliced", spy)
    async with await _session_for(est, 2.0, strategy) as s:
        submitted = _no_pool(s)
        a = await s.constant(_V)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match=r"^divide by zero encountered in divide$") as info:
                await divided(a)
        assert sliced
        assert submitted == []
        innermost = traceback.extract_tb(info.value.__traceback__)[-1]
        assert (innermost.filename, innermost.name) == (_fpwarn.__file__, "reissue")
        del a


async def test_close_now_closes_an_idle_session_without_suspending(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession() as parent:
        s = at.AsyncEagerSession(cleanup=strategy, parent=parent)
        assert s._engine.close_now() is False  # unopened: close() does it
        assert s._engine.open_now()
        kept = await s.constant(np.ones(4))
        dropped = await s.add(kept, 1.0)
        del dropped  # a pending buffer (IN_BACKGROUND: its cleanup task is spawned by the drop)
        await asyncio.sleep(0)
        done = s._engine.close_now()
        assert done is True or isinstance(done, asyncio.Task)
        if done is not True:
            await asyncio.wait([done])
        assert s.closed
        stats = s.stats()
        assert (stats.live_tensors, stats.live_bytes, stats.pending) == (0, 0, 0)
        assert stats.freed == stats.allocated == 2
        with pytest.raises(at.SessionClosedError):
            await kept.numpy()
        assert s._engine.close_now() is False  # closed: nothing more to do
        await s.close()  # idempotent after it


async def test_close_now_leaves_a_session_with_a_kernel_in_flight_to_close() -> None:
    release = threading.Event()

    def held(x: Any) -> Any:
        release.wait(10)
        return x + 1

    async with at.AsyncEagerSession() as s:
        pending = asyncio.ensure_future(s.apply(held, np.ones(3)))
        while not s._engine.inflight:
            await asyncio.sleep(0)
        assert s._engine.close_now() is False
        assert not s.closed
        release.set()
        result = await pending
        assert isinstance(result, at.Tensor)
        np.testing.assert_array_equal(await result.numpy(), [2.0, 2.0, 2.0])


async def test_on_loop_says_whether_the_loop_runs_on_this_thread() -> None:
    from aiotensor._engine._lifecycle import on_loop

    loop = asyncio.get_running_loop()
    assert on_loop(loop)
    other = type(loop)() if not isinstance(loop, asyncio.BaseEventLoop) else asyncio.new_event_loop()
    try:
        assert not on_loop(other)  # another loop, not running
    finally:
        other.close()
    seen: list[bool] = []

    def elsewhere() -> None:  # this loop, from a thread that runs a loop of its own
        async def check() -> None:
            seen.append(on_loop(loop))

        asyncio.run(check())

    thread = threading.Thread(target=elsewhere)
    thread.start()
    await asyncio.to_thread(thread.join)
    assert seen == [False]
