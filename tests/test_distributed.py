"""DaskBackend on a real LocalCluster: ops, the three strategies seen from the scheduler, failures.

One cluster (2 worker processes) serves the whole module, and one asynchronous client
on a module-scoped event loop. These tests run on the asyncio loop only: the client's
loop is shared by every test, so the conftest's per-test asyncio/uvloop
parametrization does not apply.
"""

from __future__ import annotations

import asyncio
import gc
import operator
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import cloudpickle
import dask
import numpy as np
import pytest
import pytest_asyncio
from distributed import Client, LocalCluster

import aiotensor as at
from aiotensor import xp
from aiotensor.distributed import DaskBackend
from aiotensor.distributed._remote import run_remote  # the task wrapper, unit-tested off a worker
from aiotensor.testing import OPS  # the op table: which ops must run on the cluster

from ._parity_cases import EXCLUDED, PARITY_CASES, Case
from ._results import one
from .test_parity import _check, _ids, _numpy, _Paths, _ulps, _want

pytestmark = pytest.mark.asyncio(loop_scope="module", loop_factories=["asyncio"])

# Workers cannot import this test module: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

STRATEGIES = list(at.ResourceCleanupStrategy)
PREFIX = "aiotensor-"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """Two single-threaded worker processes on 127.0.0.1; a task is retried once after a worker dies."""
    with (
        dask.config.set({"distributed.scheduler.allowed-failures": 1}),
        LocalCluster(
            n_workers=2,
            processes=True,
            threads_per_worker=1,
            host="127.0.0.1",
            dashboard_address=None,
            # The scheduler serves /health and /metrics even without a dashboard, on 8787
            # by default; another process on this machine may hold it (a warning = an error).
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},
        ) as cluster,
    ):
        yield cluster


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def client(cluster: LocalCluster) -> AsyncIterator[Client]:
    """The module's asynchronous client."""
    async with Client(cluster.scheduler_address, asynchronous=True, set_as_default=False) as c:
        await c.wait_for_workers(2)
        yield c


@pytest_asyncio.fixture(loop_scope="module")
async def backend(client: Client) -> AsyncIterator[DaskBackend]:
    """A backend on the module's client, checked to leave no key on the workers."""
    await client.wait_for_workers(2)
    await until(client, lambda keys: not keys)
    b = DaskBackend(client)
    yield b
    await b.aclose()
    await until(client, lambda keys: not keys)


async def held_keys(client: Client) -> list[str]:
    """The session keys the workers hold in memory, as the scheduler reports them."""
    has_what = await client.has_what()
    return [k for keys in has_what.values() for k in keys if str(k).startswith(PREFIX)]


async def until(client: Client, cond: Callable[[list[str]], bool], timeout: float = 5.0) -> list[str]:
    """Poll the scheduler until ``cond(held keys)``: releases reach it a few ms after they happen."""
    deadline = time.monotonic() + timeout
    while True:
        keys = await held_keys(client)
        if cond(keys):
            return keys
        if time.monotonic() > deadline:
            raise AssertionError(f"scheduler still reports {len(keys)} held keys: {keys[:5]}")
        await asyncio.sleep(0.01)


async def where(client: Client, key: str) -> list[str]:
    """The workers holding ``key`` (the metadata event can reach us before the scheduler records it)."""
    async with asyncio.timeout(5):
        while not (workers := list((await client.who_has()).get(key, ()))):
            await asyncio.sleep(0.01)
    return workers


def _pairs(x: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    return x[::2] * 2, x[1::2].sum(keepdims=True)


def _boom(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    raise ValueError(f"boom on shape {x.shape}")


def _out_of_memory(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    raise MemoryError("remote")


def _slow_square(x: np.ndarray[Any, Any], seconds: float) -> np.ndarray[Any, Any]:
    time.sleep(seconds)
    squared: np.ndarray[Any, Any] = x * x
    return squared


def _die(x: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    os._exit(1)  # a crash that takes the worker process with it (a segfault, an OOM kill)


async def _subprocess(code: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        code,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


# -- import hygiene ----------------------------------------------------------------------
async def test_import_aiotensor_imports_no_dask() -> None:
    code = (
        "import sys, aiotensor\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))\n"
        "assert not bad, bad\n"
    )
    rc, out = await _subprocess(code)
    assert rc == 0, out


async def test_missing_extra_is_named() -> None:
    code = (
        "import sys\n"
        "sys.modules['distributed'] = None\n"
        "try:\n"
        "    import aiotensor.distributed\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    raise SystemExit('imported without distributed')\n"
    )
    rc, out = await _subprocess(code)
    assert rc == 0, out
    assert "aiotensor[distributed]" in out


# -- ops ---------------------------------------------------------------------------------
async def test_ops_match_numpy(backend: DaskBackend) -> None:
    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((4, 6)).astype(np.float32)
    b_np = rng.standard_normal((6, 3)).astype(np.float32)
    async with at.AsyncEagerSession(backend=backend) as s:
        a = await s.constant(a_np, name="a")
        b = await s.constant(b_np)
        assert (a.shape, a.dtype, a.nbytes) == ((4, 6), np.float32, a_np.nbytes)  # type: ignore[comparison-overlap]
        c = await s.matmul(a, b)
        d = await s.exp(await (a + 1.0))
        e = await s.sum(a, axis=1)
        parts = await s.split(a, 3, axis=1)
        pairs = await s.apply(_pairs, await s.reshape(a, (24,)))
        values = await s.run({"c": c, "d": d, "e": e, "parts": parts, "pairs": pairs})
    np.testing.assert_allclose(values["c"], a_np @ b_np, rtol=1e-5)
    np.testing.assert_allclose(values["d"], np.exp(a_np + 1.0), rtol=1e-6)
    np.testing.assert_allclose(values["e"], a_np.sum(axis=1), rtol=1e-5)
    for got, want in zip(values["parts"], np.split(a_np, 3, axis=1), strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(values["pairs"], _pairs(a_np.reshape(24)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6)
    assert all(v.flags.writeable for v in values["parts"])  # fetched copies belong to the caller


async def test_metadata_and_bytes_come_from_the_workers(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.zeros((250, 4), dtype="float32")
        parts = await s.split(x, 2)
        assert [(p.shape, p.dtype, p.nbytes) for p in parts] == [((125, 4), np.float32, 2000)] * 2  # type: ignore[comparison-overlap]
        # the split's own tuple is released once its two items exist
        keys = await until(client, lambda keys: sorted(k.count("-") for k in keys) == [2, 3, 3])
        reported = await client.nbytes(keys=keys, summary=False)
        assert s.stats().live_bytes == sum(reported.values()) == 8000
        assert sorted(k.rsplit("-", 1)[1] for k in keys if k.startswith(f"{PREFIX}split")) == ["0", "1"]


async def test_large_constant_is_scattered(backend: DaskBackend) -> None:
    big = np.arange(600_000, dtype=np.float64)  # 4.8 MB: past the scatter threshold
    async with at.AsyncEagerSession(backend=backend) as s:
        t = await s.constant(big)
        total = await s.sum(t)
        assert await total.numpy() == big.sum()
        np.testing.assert_array_equal(await t.numpy(), big)


async def test_numpy_protocol_says_to_await(backend: DaskBackend) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        t = await s.ones((2,))
        with pytest.raises(at.AioTensorError, match=r"await t\.numpy\(\)"):
            np.asarray(t)
        assert repr(t).startswith("Tensor(name=")  # metadata only: values would need a gather
        np.testing.assert_array_equal(await t.numpy(), [1.0, 1.0])


# -- cleanup strategies, seen from the scheduler -----------------------------------------
@pytest.mark.parametrize("strategy", STRATEGIES, ids=[s.name for s in STRATEGIES])
async def test_n_by_m_loop_held_keys(
    backend: DaskBackend, client: Client, strategy: at.ResourceCleanupStrategy
) -> None:
    n, m = 4, 5
    held: list[int] = []
    async with at.AsyncEagerSession(backend=backend, cleanup=strategy) as s:
        x = await s.constant(np.zeros(1000, dtype=np.float32))
        for _ in range(m):
            y = x
            for _ in range(n):
                y = await s.add(y, 1.0)  # drops the previous intermediate
            gc.collect()
            if strategy is at.ResourceCleanupStrategy.IN_BACKGROUND:
                # no further op: the background task alone must release the futures
                held.append(len(await until(client, lambda keys: len(keys) <= 2)))
            elif strategy is at.ResourceCleanupStrategy.ON_SAFE_POINTS:
                # the op's own safe point released all but x, y and the one it just read
                held.append(len(await until(client, lambda keys: len(keys) <= 3)))
            else:
                held.append(len(await held_keys(client)))
        np.testing.assert_array_equal(await y.numpy(), np.full(1000, n, dtype=np.float32))
        stats = s.stats()
        del y
    if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
        assert held == [1 + n * (i + 1) for i in range(m)]  # every intermediate is still on a worker
        assert stats.live_tensors == 1 + n * m
    else:
        assert max(held) <= 3  # flat: the workers never hold the loop's history
        assert stats.live_tensors <= 3
    await until(client, lambda keys: not keys)  # close released everything the session made
    assert s.stats().live_tensors == 0
    assert s.stats().live_bytes == 0


async def test_dropped_handle_releases_its_key(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        keep = await s.ones((10,))
        drop = await s.ones((10,))
        await until(client, lambda keys: len(keys) == 2)
        del drop
        gc.collect()
        keys = await until(client, lambda keys: len(keys) == 1)
        assert s.stats().live_tensors == 1
        assert keys == [backend_key_of(keep, s)]


def backend_key_of(t: at.Tensor, s: at.AsyncEagerSession) -> str:
    """The Dask key behind a tensor (test-only peek into the registry)."""
    return str(s._engine.buffer(t, "test").key)


async def test_child_session_reads_parent_buffers(backend: DaskBackend) -> None:
    async with at.AsyncEagerSession(backend=backend) as app:
        w = await app.constant([[1.0, 2.0], [3.0, 4.0]])
        async with at.AsyncEagerSession(parent=app) as request:
            y = await request.matmul(w, w)
            np.testing.assert_array_equal(await y.numpy(), [[7.0, 10.0], [15.0, 22.0]])
        assert request.stats().live_tensors == 0
        assert app.stats().live_tensors == 1


# -- devices -----------------------------------------------------------------------------
async def test_devices_pin_ops_to_workers(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        devices = s.list_devices()
        assert devices == ["/cpu:0", "/worker:0", "/worker:1"]
        for device in devices[1:]:
            with s.device(device):
                t = await s.ones((3,))
            assert t.device == device
            assert await where(client, backend_key_of(t, s)) == [backend.worker_address(device)]
        with pytest.raises(at.InvalidDeviceError, match="worker:7"), s.device("/worker:7"):
            await s.ones((3,))


async def test_soft_placement_falls_back_to_any_worker(backend: DaskBackend) -> None:
    config = at.SessionConfig(allow_soft_placement=True)
    async with at.AsyncEagerSession(backend=backend, config=config) as s:
        with s.device("/gpu:0"):
            t = await s.ones((3,))
        assert t.device == "/cpu:0"


# -- failures ----------------------------------------------------------------------------
async def test_remote_exception_names_op_and_message(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.ones((2, 3))
        with pytest.raises(at.KernelError, match=r"apply\(_boom\).*ValueError: boom on shape \(2, 3\)") as info:
            await s.apply(_boom, x)
        assert isinstance(info.value.__cause__, ValueError)
        # still usable, and the failed task's key is not left behind
        y = await (x * 2.0)
        np.testing.assert_array_equal(await y.numpy(), np.full((2, 3), 2.0))
        assert s.stats().live_tensors == 2
    await until(client, lambda keys: not keys)
    erred = await client.run_on_scheduler(
        lambda dask_scheduler: [k for k in dask_scheduler.tasks if str(k).startswith(f"{PREFIX}boom")]
    )
    assert erred == []


async def test_remote_error_types_map_like_local_ones(backend: DaskBackend) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.ones((2,))
        # a built-in kernel's ValueError is about its arguments (no built-in op fails
        # remotely on valid input, so dispatch a kernel the way the ops do)
        with pytest.raises(at.InvalidArgumentError, match=r"bad_op\(.*\): boom on shape \(2,\)"):
            await s._engine.call("bad_op", _boom, (s._engine.buffer(x, "bad_op"),), {}, (x,), user=False)
        with pytest.raises(at.ResourceExhaustedError, match=r"apply\(_out_of_memory\).*out of memory \(remote\)"):
            await s.apply(_out_of_memory, x)
        assert s.stats().live_tensors == 1


async def test_cancel_releases_the_running_task(backend: DaskBackend, client: Client) -> None:
    def scheduler_keys(dask_scheduler: Any) -> list[str]:
        return [str(k) for k in dask_scheduler.tasks if str(k).startswith(PREFIX)]

    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.ones((4,))
        task = asyncio.create_task(s.apply(_slow_square, x, 0.5))
        async with asyncio.timeout(5):
            while not any(
                str(k).startswith(f"{PREFIX}slow_square") for ks in (await client.processing()).values() for k in ks
            ):
                await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5):  # the scheduler forgets the task: nobody wants it
            while await client.run_on_scheduler(scheduler_keys) != [backend_key_of(x, s)]:
                await asyncio.sleep(0.01)
        assert s.stats().live_tensors == 1
        assert s.stats().in_flight == 0
        y = await s.add(x, x)  # the session keeps working
        np.testing.assert_array_equal(await y.numpy(), [2.0] * 4)


async def _kill_worker_running(client: Client, prefix: str) -> str:
    """SIGKILL the worker process that runs the task whose key starts with ``prefix``."""
    async with asyncio.timeout(10):
        while True:
            processing = await client.processing()
            busy: list[str] = [
                addr for addr, keys in processing.items() if any(str(k).startswith(prefix) for k in keys)
            ]
            if busy:
                break
            await asyncio.sleep(0.01)
    pids = await client.run(os.getpid, workers=busy)
    os.kill(pids[busy[0]], signal.SIGKILL)
    return busy[0]


@pytest.mark.slow
async def test_worker_killed_mid_run(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.arange(6.0))
        pending = asyncio.create_task(s.apply(_slow_square, x, 1.0))
        killed = await _kill_worker_running(client, f"{PREFIX}slow_square")
        # Dask reruns the task (and recomputes x if it was lost) on the other worker
        y = one(await pending)
        np.testing.assert_array_equal(await y.numpy(), np.arange(6.0) ** 2)
        z = await s.add(y, x)
        np.testing.assert_array_equal(await z.numpy(), np.arange(6.0) ** 2 + np.arange(6.0))
        assert killed not in await where(client, backend_key_of(z, s))
    await client.wait_for_workers(2)  # the nanny restarts the worker for the next tests


@pytest.mark.slow
async def test_task_that_kills_its_workers_fails_clearly(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.ones((3,))
        with pytest.raises(at.KernelError, match=r"apply\(_die\).*KilledWorker"):
            await s.apply(_die, x)
        await client.wait_for_workers(2)
        y = await s.add(x, x)  # usable again (x is recomputed if its worker died)
        np.testing.assert_array_equal(await y.numpy(), [2.0] * 3)
    await client.wait_for_workers(2)


# -- construction and lifecycle ----------------------------------------------------------
async def test_address_backend_owns_its_client(cluster: LocalCluster, client: Client) -> None:
    async with DaskBackend(cluster.scheduler_address) as b:
        own = b.client
        assert own is not client
        async with at.AsyncEagerSession(backend=b) as s:
            t = await s.full((2, 2), 3.0)
            np.testing.assert_array_equal(await (await s.matmul(t, t)).numpy(), np.full((2, 2), 18.0))
        async with at.AsyncEagerSession(backend=b, cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS) as s2:
            assert await (await s2.ones((1,))).numpy() == 1.0
    assert own.status == "closed"
    with pytest.raises(at.SessionClosedError):
        await s2.ones((1,))


async def test_closing_the_backend_fails_ops_in_flight(client: Client) -> None:
    b = DaskBackend(client)
    async with at.AsyncEagerSession(backend=b) as s:
        x = await s.ones((2,))
        op = asyncio.create_task(s.apply(_slow_square, x, 0.3))
        await asyncio.sleep(0.05)
        await b.aclose()
        with pytest.raises(at.BackendError, match="closed while the op ran"):
            await op
        with pytest.raises(at.BackendError, match="closed"):
            await s.ones((2,))
    await until(client, lambda keys: not keys)


async def test_closed_backend_refuses_kernels(client: Client) -> None:
    b = DaskBackend(client)
    await b.aclose()
    with pytest.raises(at.BackendError, match="closed"):
        async with at.AsyncEagerSession(backend=b) as s:
            await s.ones((1,))


async def test_memory_limit_applies_on_the_cluster(backend: DaskBackend) -> None:
    config = at.SessionConfig(memory_limit=10_000)
    async with at.AsyncEagerSession(backend=backend, config=config) as s:
        keep = await s.zeros((1000,), dtype="float32")  # 4000 bytes
        with pytest.raises(at.ResourceExhaustedError, match="memory_limit=10000"):
            await s.zeros((2000,), dtype="float32")
        assert s.stats().live_bytes == keep.nbytes


async def test_client_on_another_loop_is_refused(backend: DaskBackend) -> None:
    async def elsewhere() -> None:
        async with at.AsyncEagerSession(backend=backend) as s:
            await s.ones((1,))

    with pytest.raises(at.WrongEventLoopError, match="another event loop"):
        await asyncio.to_thread(asyncio.run, elsewhere())


async def test_sync_client_is_rejected(cluster: LocalCluster) -> None:
    sync_client = await asyncio.to_thread(Client, cluster.scheduler_address, set_as_default=False)
    try:
        with pytest.raises(at.InvalidArgumentError, match="asynchronous=True"):
            DaskBackend(sync_client)
    finally:
        await asyncio.to_thread(sync_client.close)


async def test_bad_clients_are_rejected() -> None:
    with pytest.raises(at.InvalidArgumentError, match="Client or a scheduler address"):
        DaskBackend(42)
    with pytest.raises(at.BackendError, match="no client yet"):
        _ = DaskBackend("tcp://127.0.0.1:1").client


# -- the example -------------------------------------------------------------------------
@pytest.mark.slow
async def test_example_runs_on_a_given_address(cluster: LocalCluster, client: Client) -> None:
    await until(client, lambda keys: not keys)
    example = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "distributed.py")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        example,
        cluster.scheduler_address,
        "-n",
        "3",
        "-m",
        "4",
        "--size",
        "1000",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    held = {
        m["strategy"]: [int(v) for v in m["held"].split(", ")]
        for m in re.finditer(r"(?P<strategy>\w+) +keys held per iteration \[(?P<held>[\d, ]+)\]", out.decode())
    }
    assert held["ON_SESSION_CLOSE"] == [4, 7, 10, 13]  # x plus every intermediate
    # flat: x, the last result and at most one intermediate not yet released
    assert max(held["IN_BACKGROUND"]) <= 3
    assert max(held["ON_SAFE_POINTS"]) <= 3
    assert out.decode().count("after close 0 keys") == 3
    # It says what the figures mean, before and after them.
    assert "Each strategy runs 3 adds per iteration for 4 iterations" in out.decode()
    assert "ON_SESSION_CLOSE keeps every one (it grows by 3 per iteration) until close" in out.decode()


@pytest.mark.slow
async def test_lost_scattered_input_gives_backend_error(backend: DaskBackend, client: Client) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        with s.device("/worker:0"):
            big = await s.constant(np.arange(300_000.0))  # 2.4 MB: scattered, so not recomputable
        small = await s.ones((3,))
        pids = await client.run(os.getpid)
        address = backend.worker_address("/worker:0")
        assert address is not None
        os.kill(pids[address], signal.SIGKILL)
        with pytest.raises(at.BackendError, match=r"cancelled task .*lost with its worker"):
            await s.add(big, 1.0)
        with pytest.raises(at.BackendError, match="gathering"):
            await big.numpy()
        y = await s.add(small, small)  # recomputed if it was on the dead worker
        np.testing.assert_array_equal(await y.numpy(), [2.0] * 3)
    await client.wait_for_workers(2)


@pytest.mark.asyncio(loop_scope="function", loop_factories=["uvloop"])
async def test_runs_on_uvloop(cluster: LocalCluster) -> None:
    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")
    async with (
        Client(cluster.scheduler_address, asynchronous=True, set_as_default=False) as c,
        DaskBackend(c) as b,
        at.AsyncEagerSession(backend=b, cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS) as s,
    ):
        x = await s.arange(5)
        np.testing.assert_array_equal(await (await (x * x)).numpy(), np.arange(5) ** 2)


async def test_a_bad_axis_raises_invalid_argument_on_every_path(backend: DaskBackend) -> None:
    # Issue 27 (11): a single op's AxisError came back from the worker without its .axis.
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.ones((2, 3)))
        call: Callable[[], Awaitable[Any]]
        for call in (
            lambda: s.sum(x, axis=5),
            lambda: s.mean(x, axis=-4),
            lambda: s.argmax(x, axis=2),
            lambda: s.softmax(x, axis=3),
            lambda: s.expand_dims(x, axis=7),
            lambda: s.permute_dims(x, (0, 5)),
            lambda: s.sum(x * 2.0, axis=5),
        ):
            with pytest.raises(at.InvalidArgumentError):
                await call()


# -- parity: the op table on the cluster -------------------------------------------------
#: Ops of the table that cannot run on the Dask backend, and why (the test checks both ways).
NOT_ON_DASK: dict[str, str] = {}
#: The parity matrix's paths run here: batched functions run on local backends only
#: (they refuse a Dask session with InvalidArgumentError), apply is the reference.
DASK_PATHS = ("method", "function", "expression", "eval", "run", "op given an expression", "fused")


def on_workers(result: Any, s: at.AsyncEagerSession) -> None:
    """Check that every tensor of an op's result is a future on the cluster, not a local array."""
    if isinstance(result, at.Tensor):
        assert backend_key_of(result, s).startswith(PREFIX)
    elif isinstance(result, list | tuple):
        for r in result:
            on_workers(r, s)


def _dask_cases() -> list[Case]:
    """The parity matrix's first case of every op, and its first bad-input case."""
    first: dict[str, Case] = {}
    bad: dict[str, Case] = {}
    for case in PARITY_CASES:
        name = case[0]
        if isinstance(_want(case), type):
            bad.setdefault(name, case)
        else:
            first.setdefault(name, case)
    return [*first.values(), *bad.values()]


async def _dask_case(s: at.AsyncEagerSession, local: at.AsyncEagerSession, case: Case, refused: set[str]) -> list[str]:
    """Run one case through :data:`DASK_PATHS` in ``s`` (bad input: in ``local`` too); the failures."""
    want = _want(case)
    failures: list[str] = []
    here = _Paths(local, case).all()
    for path, run in _Paths(s, case).all().items():
        if path not in DASK_PATHS:
            continue
        label = f"{_ids(case)} via {path} on dask"
        try:
            if case[0] in NOT_ON_DASK:
                with pytest.raises(at.InvalidArgumentError, match="Dask"):
                    await run()
                refused.add(case[0])
            elif isinstance(want, type):
                with pytest.raises(at.InvalidArgumentError) as remote:
                    await run()
                with pytest.raises(at.InvalidArgumentError) as locally:
                    await here[path]()
                # the same class (IndexOutOfRangeError is an IndexError too) and message
                assert (type(remote.value), str(remote.value)) == (type(locally.value), str(locally.value))
            else:
                result = await run()
                on_workers(result, s)
                _check(await _numpy(result), want, label, _ulps(case, path))
        except BaseException as exc:  # collected: one report for every op
            if not isinstance(exc, Exception | pytest.fail.Exception):
                raise
            failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
    return failures


async def test_every_op_of_the_table_runs_on_the_cluster_as_locally(backend: DaskBackend) -> None:
    # The parity matrix's Dask column: the same cases, references and tolerances.
    cases = _dask_cases()
    assert {c[0] for c in cases} | set(EXCLUDED) == set(OPS)  # every op with a case
    assert sum(isinstance(_want(c), type) for c in cases) > 50  # and bad input for most
    refused: set[str] = set()
    lanes = asyncio.Semaphore(8)  # cases in parallel: each op costs a Dask round trip

    async def one(case: Case) -> list[str]:
        async with lanes:
            return await _dask_case(s, local, case, refused)

    async with at.AsyncEagerSession(backend=backend) as s, at.AsyncEagerSession() as local:
        failures = [f for found in await asyncio.gather(*map(one, cases)) for f in found]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)
    assert refused == set(NOT_ON_DASK)


async def _xp_results(s: at.AsyncEagerSession, x_np: np.ndarray[Any, Any]) -> dict[str, Any]:
    """Multi-output and data-dependent-shape xp expressions, evaluated in ``s``."""
    x = await s.constant(x_np)
    sq = await s.constant(x_np[:3, :3])
    return {
        "unique_all": await s.run(xp.unique_all(x)),
        "svd": await s.run(xp.linalg.svd(sq)),
        "nonzero": await s.run(xp.nonzero(x > 0)),
        "mask": await (await (x[x > 0] * 2.0)).numpy(),  # a shape known only when it runs
        "mask_shape": (x[x > 0] * 2.0).shape,
        "split": await s.run(await s.split(x, 2, axis=1)),
        "unique_values": await (await xp.sort(xp.unique_values(x))).numpy(),
    }


def _same(got: Any, want: Any, where: str) -> None:
    assert type(got) is type(want), f"{where}: {type(got).__name__}, locally {type(want).__name__}"
    if isinstance(want, list | tuple):
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        np.testing.assert_array_equal(got, want, err_msg=where, strict=True)
    else:
        assert got == want, where


async def test_xp_multi_output_and_data_dependent_shapes_as_locally(backend: DaskBackend) -> None:
    x_np = np.array([[1.5, -2.0, 0.0, 3.0], [1.5, 4.0, -1.0, 0.0], [2.0, 0.5, 3.0, -3.0]])
    async with at.AsyncEagerSession() as local:
        want = await _xp_results(local, x_np)
    async with at.AsyncEagerSession(backend=backend) as s:
        got = await _xp_results(s, x_np)
        x = await s.constant(x_np)
        masked = await x[x > 0]
        assert masked.shape == (int((x_np > 0).sum()),)  # known once it ran, on a worker
        on_workers(masked, s)
        with s.as_default():  # an expression of no tensor: the default session, on the cluster
            on_workers(await xp.zeros(3), s)
    for name in want:
        _same(got[name], want[name], name)
    assert isinstance(got["unique_all"], xp.UniqueAllResult)
    assert isinstance(got["svd"], xp.linalg.SVDResult)
    assert isinstance(got["split"], list)
    assert len(got["split"]) == 2
    np.testing.assert_array_equal(got["mask"], x_np[x_np > 0] * 2.0)
    assert got["mask_shape"] == (None,)


async def test_concrete_values_of_a_remote_tensor_say_to_await(backend: DaskBackend) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        t = await s.constant(np.float64(1.5))
        converts: list[Callable[[Any], Any]] = [float, bool, int, complex, operator.index]
        converts += [lambda v: v.item(), lambda v: v.tolist(), lambda v: v.__dlpack__()]
        for convert in converts:
            with pytest.raises(TypeError, match=r"remote backend: await it first"):
                convert(t)
        assert float(await t.numpy()) == 1.5


async def test_a_large_array_inside_an_expression_is_scattered(backend: DaskBackend) -> None:
    # An expression keeps its ndarray operands in its program, not in the task's
    # arguments: the program was embedded in the graph (Dask's "Sending large graph"
    # warning, an error in this suite) instead of being scattered like a large constant.
    big = np.arange(2_000_000.0)  # 16 MB
    async with at.AsyncEagerSession(backend=backend) as s:
        y = await s.constant(big[:6].copy())
        head = await (xp.asarray(big)[:6] + y)
        np.testing.assert_array_equal(await head.numpy(), big[:6] * 2)
        whole = await ((await s.constant(big)) + big)
        on_workers(whole, s)
        assert await (await s.sum(whole)).numpy() == 2 * big.sum()


async def test_a_fused_function_is_one_task_and_a_batched_one_refuses_the_cluster(
    backend: DaskBackend, client: Client
) -> None:
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.arange(6.0).reshape(2, 3))
        w = await s.constant(np.ones((3, 2)))

        def layer(ops: Any, x: Any, w: Any) -> Any:
            h = ops.relu(x @ w - 4.0)
            return h, ops.sum(h, axis=1)

        h, total = await s.function(layer)(x, w)
        on_workers([h, total], s)
        want = np.maximum(np.arange(6.0).reshape(2, 3) @ np.ones((3, 2)) - 4.0, 0.0)
        np.testing.assert_array_equal(await h.numpy(), want)
        np.testing.assert_array_equal(await total.numpy(), want.sum(axis=1))
        # a tensor the function captures instead of taking it lives in the session here
        with pytest.raises(at.InvalidArgumentError, match="pass it as an argument"):
            await s.function(lambda ops, a: ops.add(a, w))(x)
        with pytest.raises(at.InvalidArgumentError, match="sum"):  # the op's own error, from the worker
            await s.function(lambda ops, a: ops.sum(a, axis=5))(x)
        # They stack concurrent callers' rows in this process.
        with pytest.raises(at.InvalidArgumentError, match="batched functions run on local backends only"):
            await at.batched(lambda ops, a: ops.exp(a))(x)


# -- numpy's floating-point errors and the kernel's inputs, as locally ---------------------
async def _fp_messages(s: at.AsyncEagerSession) -> tuple[list[str], list[str], str]:
    """Warnings of a method, an expression and a fused call dividing by zero; the error under "raise"."""
    x = await s.constant(np.array([1.0, 0.0]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await s.divide(x, 0.0)
        await (x / 0.0)
        await s.function(lambda ops, a: ops.log(a - 1.0))(x)
    with np.errstate(divide="raise"), pytest.raises(at.InvalidArgumentError) as raised:
        await s.divide(x, 0.0)
    return [str(w.message) for w in caught], [w.filename for w in caught], str(raised.value)


async def test_floating_point_errors_reach_the_caller_as_locally(backend: DaskBackend) -> None:
    # The caller's np.errstate goes with the task: warnings were printed on the worker
    # (lost to the caller) and errstate(divide="raise") did not raise.
    async with at.AsyncEagerSession() as local:
        want, _, want_raised = await _fp_messages(local)
    async with at.AsyncEagerSession(backend=backend) as s:
        got, files, raised = await _fp_messages(s)
    assert "divide by zero encountered in divide" in want
    assert "divide by zero encountered in function(<lambda>)" in want
    assert sorted(got) == sorted(want)
    assert set(files) == {__file__}  # at the user's line
    assert raised == want_raised


async def test_a_users_error_filter_raises_numpys_warning_as_locally(backend: DaskBackend) -> None:
    # warnings.simplefilter("error"): the RuntimeWarning itself, as on every local path
    # (tests/test_fpwarn.py), not an AioTensorError.
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.array([1.0, 0.0]))
        f = s.function(lambda ops, a: ops.divide(a, 0.0))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(RuntimeWarning, match=r"^divide by zero encountered in divide$"):
                await s.divide(x, 0.0)
            with pytest.raises(RuntimeWarning, match=r"^divide by zero encountered in function\(<lambda>\)$"):
                await f(x)


async def test_a_result_whose_warning_a_filter_raised_is_freed_at_once(backend: DaskBackend, client: Client) -> None:
    # The op's result exists on a worker when its warning is raised as an error: it is
    # freed then, not when the garbage collector frees the traceback that held it.
    gc.disable()
    try:
        async with at.AsyncEagerSession(backend=backend) as s:
            x = await s.constant(np.array([1.0, 0.0]))
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                with pytest.raises(RuntimeWarning):
                    await s.divide(x, 0.0)
            assert len(await until(client, lambda keys: len(keys) <= 1, timeout=2.0)) == 1  # x's buffer only
    finally:
        gc.enable()


async def test_a_kernel_on_a_worker_sees_read_only_views_of_its_inputs() -> None:
    # The one rule of kernel inputs (_kernels.read_only_view): the worker's stored
    # replica is left as it is, and a kernel returning its input gets a copy owned.
    replica = np.arange(3.0)
    seen: list[bool] = []

    def same(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        seen.append(a.flags.writeable)
        return a

    out = run_remote(same, (replica,), {}, "topic", "token")
    assert seen == [False]
    assert replica.flags.writeable  # (it was set read-only in place)
    assert not np.shares_memory(out, replica)
    np.testing.assert_array_equal(out, replica)


async def test_errstate_log_and_print_stay_on_the_worker(backend: DaskBackend) -> None:
    # "log" needs the caller's errcall object on the worker: the worker's default there,
    # never an AttributeError from numpy (as shipping the mode alone would give).
    async with at.AsyncEagerSession(backend=backend) as s:
        x = await s.constant(np.array([1.0, 0.0]))
        with np.errstate(divide="log", invalid="print"):
            got = await (await s.divide(x, 0.0)).numpy()
    np.testing.assert_array_equal(got[:1], [np.inf])
