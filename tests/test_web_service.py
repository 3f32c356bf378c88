"""The web-service example: child sessions, in-process error paths, and a real uvicorn server.

The server tests start ``uvicorn --loop uvloop`` as a subprocess on 127.0.0.1 and talk
to it with ``httpx.AsyncClient``; the server's own counters (``GET /stats``) are the
only window into its sessions, as they would be in production. Those tests are plain
functions running their client on one uvloop loop: the server is what is under test,
so running the client on both loops (as conftest does for async tests) would only
double the wall time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import uvloop
from fastapi import HTTPException

import aiotensor as at
from examples.web_service.app import SessionDep, create_app
from examples.web_service.model import CLASSES, DTYPE, IN_FEATURES, make_weights, numpy_forward
from examples.web_service.server import RunningServer, serve

T = TypeVar("T")

LAYERS = make_weights()
CONCURRENCY = 32
REQUESTS = 512
# Heavy requests: large enough that their kernels are still running when the client
# acts (/health, a disconnect), a few hundred ms of compute each.
HEAVY_ROWS = 2048
HEAVY_REQUESTS = 4
DISCONNECT_ROWS = 4096
# Tolerances for "equal to the NumPy reference": the server runs the same NumPy kernels
# on the same float32 values (JSON round-trips them exactly); BLAS may still block a
# product differently for different batch sizes and thread counts, which in float32
# moves probabilities by up to ~6e-7 (measured over batch sizes 1 to 2048), 4e-6 relative.
RTOL, ATOL = 2e-5, 2e-6


def reference(rows: list[list[float]]) -> np.ndarray[Any, Any]:
    return numpy_forward(LAYERS, np.asarray(rows, dtype=DTYPE))


# -- child sessions: reading the parent's tensors without copies ------------------------
async def test_child_session_reads_parent_tensors_without_copy(strategy: at.ResourceCleanupStrategy) -> None:
    async with at.AsyncEagerSession() as parent:
        w = await parent.constant(np.arange(12.0).reshape(3, 4), name="w")
        before = parent.stats()
        seen: list[Any] = []

        def kernel(a: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
            seen.append(a)
            return np.sum(a, axis=0)  # type: ignore[no-any-return]

        async with at.AsyncEagerSession(cleanup=strategy, parent=parent) as child:
            total = await child.apply(kernel, w)
            y = await child.matmul(await child.ones((2, 3)), w)
            assert isinstance(total, at.Tensor)
            assert total.session is child
            np.testing.assert_array_equal(await total.numpy(), np.arange(12.0).reshape(3, 4).sum(axis=0))
            np.testing.assert_array_equal(await y.numpy(), np.ones((2, 3)) @ np.arange(12.0).reshape(3, 4))
            # The kernel read the parent's buffer in place (a copy would share no memory),
            # and read-only, so a request cannot change the weights.
            assert np.shares_memory(seen[0], np.asarray(w))
            assert not seen[0].flags.writeable
            assert child.stats().allocated == 3  # total, ones, y: nothing for w
            assert parent.stats() == before
            # Reading goes one way: the parent cannot use the child's tensors.
            with pytest.raises(at.InvalidArgumentError, match="another session"):
                await parent.add(y, 1.0)
        assert child.stats().live_tensors == 0
        # Closing the child freed only its own buffers.
        assert parent.stats() == before
        np.testing.assert_array_equal(await w.numpy(), np.arange(12.0).reshape(3, 4))


async def test_sibling_session_cannot_read_tensors() -> None:
    async with at.AsyncEagerSession() as parent, at.AsyncEagerSession(parent=parent) as a:
        t = await a.ones(3)
        async with at.AsyncEagerSession(parent=parent) as b:
            with pytest.raises(at.InvalidArgumentError, match="another session"):
                await b.add(t, 1.0)


# -- the app in process: error paths, every strategy -----------------------------------
async def test_request_sessions_freed_when_handler_raises(strategy: at.ResourceCleanupStrategy) -> None:
    app = create_app(request_cleanup=strategy, forward="ops")

    @app.post("/boom")
    async def boom(s: SessionDep) -> None:
        # Allocate intermediates, then fail the way a bug would.
        await s.matmul(await s.ones((64, 64)), await s.ones((64, 64)))
        raise RuntimeError("bug in the handler")

    @app.post("/refuse")
    async def refuse(s: SessionDep) -> None:
        await s.ones((8, 8))
        raise HTTPException(status_code=409, detail="refused")

    rows = np.random.default_rng(1).standard_normal((5, IN_FEATURES)).tolist()
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        service = app.state.service
        app_before = service.session.stats()
        ok = await c.post("/predict", json={"inputs": rows})
        assert ok.status_code == 200
        np.testing.assert_allclose(ok.json()["probabilities"], reference(rows), rtol=RTOL, atol=ATOL)
        wrong_width = await c.post("/predict", json={"inputs": [[1.0, 2.0, 3.0]]})
        assert wrong_width.status_code == 422
        assert wrong_width.json()["detail"] == f"inputs[0]: 3 values, expected {IN_FEATURES}"
        ragged = await c.post("/predict", json={"inputs": [[1.0] * IN_FEATURES, [1.0]]})
        assert ragged.status_code == 422
        assert ragged.json()["detail"] == f"inputs[1]: 1 value, expected {IN_FEATURES}"
        assert (await c.post("/boom")).status_code == 500
        assert (await c.post("/refuse")).status_code == 409
        stats = (await c.get("/stats")).json()
        assert service.session.stats() == app_before
    requests = stats["requests"]
    assert requests["opened"] == requests["closed"] == 5
    assert requests["failed"] == 4
    assert requests["in_flight"] == requests["live_tensors"] == requests["live_bytes"] == 0
    assert requests["left_after_close"] == 0
    # 10 buffers for the good prediction, 3 and 1 in the raisers; bad rows are refused before any buffer.
    assert requests["allocated"] == requests["freed"] == 14
    assert stats["request_cleanup"] == strategy.name
    assert service.session.closed


async def test_fused_forward_matches_numpy() -> None:
    app = create_app(forward="fused")
    rows = np.random.default_rng(2).standard_normal((7, IN_FEATURES)).tolist()
    transport = httpx.ASGITransport(app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        app_before = app.state.service.session.stats()
        response = await c.post("/predict", json={"inputs": rows})
        assert response.status_code == 200
        np.testing.assert_allclose(response.json()["probabilities"], reference(rows), rtol=RTOL, atol=ATOL)
        stats = (await c.get("/stats")).json()
        assert app.state.service.session.stats() == app_before
    # Two buffers per request: the input and the probabilities.
    assert stats["requests"]["allocated"] == stats["requests"]["freed"] == 2
    assert stats["requests"]["live_tensors"] == 0


@pytest.mark.parametrize("strategy", list(at.ResourceCleanupStrategy))
async def test_batched_forward_coalesces_concurrent_requests(strategy: at.ResourceCleanupStrategy) -> None:
    app = create_app(request_cleanup=strategy)  # the default: batched
    rng = np.random.default_rng(3)
    batches = [rng.standard_normal((int(rng.integers(1, 17)), IN_FEATURES)).tolist() for _ in range(24)]
    transport = httpx.ASGITransport(app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://app") as c:
        service = app.state.service
        before = (await c.get("/stats")).json()
        responses = await asyncio.gather(*(c.post("/predict", json={"inputs": rows}) for rows in batches))
        wrong_width = await c.post("/predict", json={"inputs": [[1.0, 2.0, 3.0]]})
        after = (await c.get("/stats")).json()
        app_live = service.session.stats().live_bytes
    for rows, response in zip(batches, responses, strict=True):
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["probabilities"], reference(rows), rtol=RTOL, atol=ATOL)
    assert wrong_width.status_code == 422
    assert "64" in wrong_width.json()["detail"]
    calls = after["batching"]["calls"] - before["batching"]["calls"]
    kernels = after["batching"]["batches"] - before["batching"]["batches"]
    assert calls == len(batches)
    assert kernels < calls  # concurrent requests shared kernel calls
    requests = after["requests"]
    assert requests["in_flight"] == requests["live_tensors"] == requests["live_bytes"] == 0
    assert requests["allocated"] == requests["freed"]
    # Batches run in the app session; what they made is freed: only the weights stay.
    assert app_live == after["model_bytes"]


# -- the real server ---------------------------------------------------------------------
def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the client side on a fresh uvloop loop."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(fn())


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """``uvicorn --loop uvloop`` serving the example app; checked for a clean shutdown."""
    # One BLAS thread per server, as in production: concurrency comes from requests.
    blas = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    with serve("web_service.app:ops_app", env=blas) as srv:  # op by op: every buffer is counted below
        yield srv
    assert srv.process.returncode == 0, srv.log
    for bad in ("Traceback", "unclosed", "Error"):
        assert bad not in srv.log, srv.log


async def stats_of(c: httpx.AsyncClient) -> dict[str, Any]:
    response = await c.get("/stats")
    assert response.status_code == 200
    result: dict[str, Any] = response.json()
    return result


async def wait_for(c: httpx.AsyncClient, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll ``/stats`` until ``predicate`` holds (fails the test after 20 s)."""
    async with asyncio.timeout(20):
        while not predicate(stats := await stats_of(c)):
            await asyncio.sleep(0.005)
    return stats


def assert_clean(before: dict[str, Any], after: dict[str, Any]) -> None:
    """No request session open or holding anything; the app session exactly as before."""
    requests = after["requests"]
    assert requests["opened"] == requests["closed"]
    assert requests["in_flight"] == requests["live_tensors"] == requests["live_bytes"] == 0
    assert requests["left_after_close"] == 0
    assert requests["allocated"] == requests["freed"]
    # Weights are read, never copied: the app session allocated nothing per request.
    assert after["app"]["allocated"] == before["app"]["allocated"]
    assert after["app"]["live_bytes"] == before["app"]["live_bytes"] == after["model_bytes"]
    assert after["app"]["live_tensors"] == before["app"]["live_tensors"]


def heavy_body(n: int = HEAVY_ROWS) -> bytes:
    rows = np.random.default_rng(7).standard_normal((n, IN_FEATURES))
    return json.dumps({"inputs": rows.tolist()}).encode()


HEAVY_HEADERS = {"content-type": "application/json"}


@pytest.mark.slow
def test_concurrent_predictions_match_numpy(server: RunningServer) -> None:
    rng = np.random.default_rng(0)
    batches = [rng.standard_normal((int(rng.integers(1, 17)), IN_FEATURES)).tolist() for _ in range(REQUESTS)]

    async def main() -> tuple[dict[str, Any], dict[str, Any], list[httpx.Response]]:
        limits = httpx.Limits(max_connections=CONCURRENCY)
        async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=30) as c:
            before = await stats_of(c)
            queue = iter(enumerate(batches))
            responses: list[httpx.Response | None] = [None] * REQUESTS

            async def worker() -> None:
                for i, rows in queue:
                    responses[i] = await c.post("/predict", json={"inputs": rows})

            async with asyncio.TaskGroup() as tg:
                for _ in range(CONCURRENCY):
                    tg.create_task(worker())
            after = await stats_of(c)
        return before, after, [r for r in responses if r is not None]

    before, after, responses = run(main)
    assert len(responses) == REQUESTS
    for rows, response in zip(batches, responses, strict=True):
        assert response.status_code == 200, response.text
        probs = np.asarray(response.json()["probabilities"])
        assert probs.shape == (len(rows), CLASSES)
        np.testing.assert_allclose(probs, reference(rows), rtol=RTOL, atol=ATOL)
    # Sessions close before the response is sent, so the counters are final already.
    assert after["requests"]["opened"] - before["requests"]["opened"] == REQUESTS
    assert after["requests"]["failed"] == before["requests"]["failed"]
    # 10 buffers per request: the input, 3 per layer, and the softmax.
    assert after["requests"]["allocated"] - before["requests"]["allocated"] == 10 * REQUESTS
    assert_clean(before, after)


@pytest.mark.slow
def test_health_answered_while_heavy_predictions_run(server: RunningServer) -> None:
    body = heavy_body()
    expected = reference(json.loads(body)["inputs"])

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            before = await stats_of(c)
            async with asyncio.TaskGroup() as tg:
                heavy = [
                    tg.create_task(c.post("/predict", content=body, headers=HEAVY_HEADERS))
                    for _ in range(HEAVY_REQUESTS)
                ]
                await wait_for(c, lambda st: st["requests"]["in_flight"] > 0)
                health = await c.get("/health")
                # Ordering, not timing: /health came back while predictions were still running.
                still_running = sum(not t.done() for t in heavy)
                assert health.status_code == 200
                assert health.json()["requests_in_flight"] > 0
                assert still_running > 0
            for t in heavy:
                assert t.result().status_code == 200
                np.testing.assert_allclose(t.result().json()["probabilities"], expected, rtol=RTOL, atol=ATOL)
            assert_clean(before, await stats_of(c))

    run(main)


@pytest.mark.slow
def test_disconnects_and_errors_leak_nothing(server: RunningServer) -> None:
    body = heavy_body(DISCONNECT_ROWS)

    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as c:
            before = await stats_of(c)
            # A client that gives up mid-request: its connection closes while the server computes.
            async with httpx.AsyncClient(base_url=server.url, timeout=60) as impatient:
                request = asyncio.create_task(impatient.post("/predict", content=body, headers=HEAVY_HEADERS))
                await wait_for(c, lambda st: st["requests"]["in_flight"] > 0)
                request.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await request
            after = await wait_for(c, lambda st: st["requests"]["in_flight"] == 0)
            assert after["requests"]["disconnected"] - before["requests"]["disconnected"] == 1
            assert after["requests"]["opened"] - before["requests"]["opened"] == 1
            assert_clean(before, after)
            # Refused input: a wrong width, ragged rows, NaN, a number float32 cannot hold.
            before = after
            row = [0.5] * IN_FEATURES
            bad = [
                json.dumps({"inputs": [[0.5] * (IN_FEATURES + 1)] * 3}),
                json.dumps({"inputs": [row, [0.5]]}),
                json.dumps({"inputs": [row, [*row[:-1], float("nan")]]}),
                json.dumps({"inputs": [[*row[:-1], 1e39]]}),
            ]
            answers = [await c.post("/predict", content=b, headers=HEAVY_HEADERS) for b in bad]
            assert [a.status_code for a in answers] == [422] * 4
            assert [a.json()["detail"] for a in answers] == [
                f"inputs[0]: {IN_FEATURES + 1} values, expected {IN_FEATURES}",
                f"inputs[1]: 1 value, expected {IN_FEATURES}",
                f"inputs[1][{IN_FEATURES - 1}]: NaN is not allowed (non-finite)",
                f"inputs[0][{IN_FEATURES - 1}]: 1e+39 overflows float32",
            ]
            after = await stats_of(c)
            assert after["requests"]["failed"] - before["requests"]["failed"] == 4
            assert after["requests"]["allocated"] == before["requests"]["allocated"]  # refused before any op
            assert_clean(before, after)

    run(main)


@pytest.mark.slow
def test_the_default_app_serves_batched_predictions() -> None:
    blas = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    rng = np.random.default_rng(5)
    batches = [rng.standard_normal((int(rng.integers(1, 17)), IN_FEATURES)).tolist() for _ in range(128)]

    async def main(url: str) -> tuple[dict[str, Any], dict[str, Any], list[httpx.Response]]:
        async with httpx.AsyncClient(base_url=url, limits=httpx.Limits(max_connections=CONCURRENCY), timeout=30) as c:
            before = await stats_of(c)
            responses = await asyncio.gather(*(c.post("/predict", json={"inputs": rows}) for rows in batches))
            return before, await stats_of(c), list(responses)

    with serve("web_service.app:app", env=blas) as srv:
        before, after, responses = run(lambda: main(srv.url))
    assert srv.process.returncode == 0, srv.log
    for rows, response in zip(batches, responses, strict=True):
        assert response.status_code == 200, response.text
        np.testing.assert_allclose(response.json()["probabilities"], reference(rows), rtol=RTOL, atol=ATOL)
    assert after["batching"]["calls"] - before["batching"]["calls"] == len(batches)
    requests = after["requests"]
    assert requests["opened"] == requests["closed"]
    assert requests["in_flight"] == requests["live_tensors"] == requests["live_bytes"] == 0
    assert after["app"]["live_bytes"] == after["model_bytes"]
