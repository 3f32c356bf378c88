"""aiotensor.web: sessions per request, error answers, disconnects and stats, in process and on a real uvicorn.

In-process tests drive the apps of ``tests/_web_app.py`` through ``httpx.ASGITransport``
or through hand-made ASGI ``receive``/``send`` callables (to disconnect at a chosen
moment), on both event loops (conftest). The server tests run ``uvicorn`` as a
subprocess on 127.0.0.1, on uvloop and on asyncio, with the FastAPI and the Starlette
app, and look at the server only through HTTP (``/log`` is the ``on_request`` hook's
record) and its log at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, MutableMapping
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import uvloop
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import aiotensor as at
from aiotensor import _defaults, web
from examples.web_service.server import RunningServer, serve
from tests import _web_app

T = TypeVar("T")
TESTS = Path(__file__).resolve().parent
APPS = {"fastapi": _web_app.make_fastapi_app, "starlette": _web_app.make_starlette_app}
NUMPY_WORDS = ("gufunc", "mismatch", "core dimension", "Traceback")


# -- helpers --------------------------------------------------------------------------
@pytest.fixture(params=sorted(APPS))
async def app(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    """Each test app, its lifespan entered (the app session open) for the test."""
    application = APPS[request.param]()
    async with application.router.lifespan_context(application):
        yield application
    assert application.state.handlers.sessions.in_flight == 0


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app, raise_app_exceptions=False), base_url="http://t")


def log_of(app: Any) -> list[dict[str, Any]]:
    log: list[dict[str, Any]] = app.state.handlers.log
    return log


def assert_closed_clean(entry: dict[str, Any]) -> None:
    """A request session after close: nothing live, everything it allocated freed."""
    assert entry["live_tensors"] == 0
    assert entry["allocated"] == entry["freed"]


class Connection:
    """Hand-made ASGI ``receive``/``send`` for one request: the test decides when the client leaves."""

    def __init__(self, body: bytes | None) -> None:
        self.messages: list[MutableMapping[str, Any]] = []
        self.gone = asyncio.Event()
        self.body = body
        self.receives = 0

    def scope(self, method: str, path: str) -> dict[str, Any]:
        headers = [] if self.body is None else [(b"content-length", str(len(self.body)).encode())]
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": headers,
            "scheme": "http",
            "server": ("t", 80),
            "client": ("c", 1),
            "root_path": "",
        }

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.receives == 1:
            return {"type": "http.request", "body": self.body or b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: MutableMapping[str, Any]) -> None:
        self.messages.append(message)


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.005)


# -- the package --------------------------------------------------------------------------
def test_importing_aiotensor_does_not_import_web() -> None:
    code = "import sys, aiotensor; print([m for m in ('aiotensor.web', 'starlette', 'fastapi') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


def test_public_names_have_docstrings() -> None:
    import aiotensor.web.fastapi as web_fastapi

    for name in web.__all__:
        if name != "Outcome":  # a Literal type alias: documented by its comment
            assert getattr(web, name).__doc__, name
    for name in ("get_request_session", "get_app_session"):
        assert getattr(web_fastapi, name).__doc__


# -- sessions ---------------------------------------------------------------------------
async def test_request_session_is_a_child_closed_after_the_response(app: Any) -> None:
    sessions = app.state.handlers.sessions
    app_before = sessions.app_session.stats()
    async with client(app) as c:
        r = await c.post("/matmul", json={"x": [[1, 2, 3], [4, 5, 6]]})
        assert r.status_code == 200
        np.testing.assert_array_equal(r.json()["y"], np.array([[1, 2, 3], [4, 5, 6]], np.float32) @ _web_app.W)
        health = await c.get("/health")
        assert health.json() == {"in_flight": 0}
    (entry,) = log_of(app)  # /health opened no session, so the hook saw one request
    assert entry["method"] == "POST"
    assert entry["path"] == "/matmul"
    assert entry["status"] == 200
    assert entry["outcome"] == "completed"
    assert entry["allocated"] == 2  # x and y; W was read from the app session in place
    assert entry["peak_bytes"] == 2 * 3 * 4 + 2 * 2 * 4
    assert entry["seconds"] > 0
    assert_closed_clean(entry)
    assert sessions.app_session.stats() == app_before
    assert sessions.opened == 1


async def test_request_session_is_made_once_per_request() -> None:
    seen: list[at.AsyncEagerSession] = []
    sessions = web.Sessions()

    async def twice(request: Request) -> Response:
        a, b = web.request_session(request), web.request_session(request)
        assert a is b
        assert web.app_session(request) is sessions.app_session
        seen.append(a)
        await a.ones(3)
        return Response()

    app = Starlette(routes=[Route("/", twice)], lifespan=sessions.lifespan)
    sessions.install(app)
    async with app.router.lifespan_context(app), client(app) as c:
        assert (await c.get("/")).status_code == 200
        assert (await c.get("/")).status_code == 200
        app_session = sessions.app_session
    assert len(seen) == 2
    assert seen[0] is not seen[1]
    assert all(s.closed for s in seen)
    assert app_session.closed  # the lifespan closed it
    with pytest.raises(RuntimeError, match="not open"):
        _ = sessions.app_session


async def test_lifespan_opens_once_and_closes_the_app_session() -> None:
    sessions = web.Sessions()
    async with sessions.open() as s:
        assert sessions.app_session is s
        await s.ones(4)
        with pytest.raises(RuntimeError, match="already open"):
            async with sessions.open():
                pass
    assert s.closed
    assert s.stats().live_tensors == 0
    # Served again (a second lifespan in one process): a new app session.
    async with sessions.open() as again:
        assert again is not s


async def test_without_the_middleware_request_session_says_what_to_do() -> None:
    async def handler(request: Request) -> Response:
        web.request_session(request)
        return Response()

    app = Starlette(routes=[Route("/", handler)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        with pytest.raises(RuntimeError, match=r"sessions.install\(app\)"):
            await c.get("/")


async def test_background_work_after_the_response_cannot_use_the_request_session() -> None:
    from starlette.background import BackgroundTask

    errors: list[BaseException] = []
    sessions = web.Sessions()
    used: list[at.AsyncEagerSession] = []

    async def later(request: Request) -> None:
        try:
            web.request_session(request)
        except RuntimeError as exc:
            errors.append(exc)

    async def after_response(request: Request) -> None:
        # The session this request had is closed once the response went out.
        with pytest.raises(at.SessionClosedError):
            await used[0].ones(2)

    async def handler(request: Request) -> Response:
        used.append(web.request_session(request))
        return Response(background=BackgroundTask(after_response, request))

    async def no_session(request: Request) -> Response:
        return Response(background=BackgroundTask(later, request))

    app = Starlette(routes=[Route("/", handler), Route("/none", no_session)], lifespan=sessions.lifespan)
    sessions.install(app)
    async with sessions.open(), client(app) as c:
        assert (await c.get("/")).status_code == 200
        assert (await c.get("/none")).status_code == 200
    assert len(errors) == 1
    assert "background" in str(errors[0])
    assert sessions.opened == 1


# -- errors ------------------------------------------------------------------------------
async def test_invalid_argument_is_a_422_naming_the_op_and_inputs(app: Any) -> None:
    async with client(app) as c:
        r = await c.post("/matmul", json={"x": [[1.0, 2.0]]})
    assert r.status_code == 422
    body = r.json()
    assert body["error"] == "invalid_argument"
    assert body["op"] == "matmul"
    assert body["inputs"] == [{"dtype": "float32", "shape": [1, 2]}, {"dtype": "float32", "shape": [3, 2]}]
    assert body["detail"] == "invalid arguments for matmul: float32[1, 2], float32[3, 2]"
    for word in NUMPY_WORDS:
        assert word not in r.text
    (entry,) = log_of(app)
    assert (entry["status"], entry["outcome"], entry["allocated"]) == (422, "completed", 1)
    assert_closed_clean(entry)


def test_an_invalid_argument_raised_before_a_kernel_keeps_its_message() -> None:
    response = web.error_response(at.InvalidArgumentError("inputs: rows of different lengths"))
    assert response.status_code == 422
    assert json.loads(bytes(response.body)) == {
        "error": "invalid_argument",
        "op": None,
        "inputs": [],
        "detail": "inputs: rows of different lengths",
        "errors": [],
    }


async def test_resource_exhausted_is_a_503_with_retry_after(app: Any) -> None:
    async with client(app) as c:
        r = await c.get("/oom")
    assert r.status_code == 503
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"] == "resource_exhausted"
    assert str(_web_app.REQUEST_LIMIT) not in r.text  # the limit is the server's business
    (entry,) = log_of(app)
    assert (entry["status"], entry["outcome"]) == (503, "completed")
    assert_closed_clean(entry)


async def test_other_aiotensor_errors_are_a_500_without_internals(app: Any, caplog: pytest.LogCaptureFixture) -> None:
    async with client(app) as c:
        r = await c.get("/kernel-error")
    assert r.status_code == 500
    assert r.json() == {"error": "internal", "detail": "internal server error", "op": None, "inputs": [], "errors": []}
    assert _web_app.SECRET not in r.text
    # ... but the operator sees it, with the traceback.
    (record,) = [rec for rec in caplog.records if rec.name == "aiotensor.web"]
    assert record.exc_info is not None
    assert _web_app.SECRET in caplog.text
    (entry,) = log_of(app)
    assert (entry["status"], entry["outcome"], entry["allocated"]) == (500, "completed", 1)
    assert_closed_clean(entry)


async def test_a_handler_raising_anything_else_still_closes_its_session(app: Any) -> None:
    async with client(app) as c:
        r = await c.get("/bug")
    assert r.status_code == 500  # Starlette's last-resort handler, with aiotensor's answer
    assert r.json() == {"error": "internal", "detail": "internal server error", "op": None, "inputs": [], "errors": []}
    assert "a bug in the handler" not in r.text
    (entry,) = log_of(app)
    assert (entry["status"], entry["outcome"], entry["allocated"]) == (None, "failed", 1)
    assert_closed_clean(entry)


def test_retry_after_is_configurable() -> None:
    sessions = web.Sessions(retry_after=7)
    app = Starlette()
    sessions.install(app)
    handler = app.exception_handlers[at.AioTensorError]
    assert handler is not None
    response = web.error_response(at.ResourceExhaustedError("x"), retry_after=7)
    assert response.headers["retry-after"] == "7"


# -- disconnects ---------------------------------------------------------------------------
@pytest.mark.parametrize(("method", "body"), [("POST", b'{"x": 1}'), ("GET", None)])
async def test_a_client_that_leaves_cancels_the_handler(app: Any, method: str, body: bytes | None) -> None:
    sessions = app.state.handlers.sessions
    conn = Connection(body)
    serving = asyncio.create_task(app(conn.scope(method, "/slow"), conn.receive, conn.send))
    await wait_until(lambda: sessions.in_flight == 1)
    await asyncio.sleep(0.05)  # the kernel is sleeping on the pool now
    conn.gone.set()
    async with asyncio.timeout(_web_app.SLOW_SECONDS / 2):  # well before the kernel ends
        await serving  # the middleware returns quietly: nobody is left to answer
    assert not serving.cancelled()
    assert conn.messages == []  # no response was started
    (entry,) = log_of(app)
    assert (entry["status"], entry["outcome"]) == (None, "disconnected")
    assert_closed_clean(entry)
    assert sessions.in_flight == 0
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0


async def test_without_cancel_on_disconnect_the_handler_runs_to_the_end() -> None:
    sessions = web.Sessions(cancel_on_disconnect=False)
    done: list[bool] = []

    async def handler(request: Request) -> Response:
        s = web.request_session(request)
        await s.apply(_web_app._sleep_kernel, await s.ones(2))
        done.append(True)
        return Response()

    app = Starlette(routes=[Route("/", handler)])
    sessions.install(app)
    async with sessions.open():
        conn = Connection(None)
        serving = asyncio.create_task(app(conn.scope("GET", "/"), conn.receive, conn.send))
        await wait_until(lambda: sessions.in_flight == 1)
        conn.gone.set()
        await serving
    assert done == [True]
    assert conn.receives == 0  # nothing watched the connection


async def test_server_shutdown_cancellation_is_not_swallowed(app: Any) -> None:
    sessions = app.state.handlers.sessions
    conn = Connection(None)
    serving = asyncio.create_task(app(conn.scope("GET", "/slow"), conn.receive, conn.send))
    await wait_until(lambda: sessions.in_flight == 1)
    serving.cancel()  # as a server cancels its request tasks, not a disconnect
    with pytest.raises(asyncio.CancelledError):
        await serving
    (entry,) = log_of(app)
    assert entry["outcome"] == "failed"
    assert_closed_clean(entry)


async def test_a_handler_that_swallows_the_cancellation_leaves_the_task_uncancelled() -> None:
    sessions = web.Sessions()
    states: list[int] = []

    async def handler(request: Request) -> Response:
        s = web.request_session(request)
        try:
            await s.apply(_web_app._sleep_kernel, await s.ones(2))
        except asyncio.CancelledError:
            pass  # bad manners, but it happens
        return Response()

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        await middleware(scope, receive, send)
        task = asyncio.current_task()
        assert task is not None
        states.append(task.cancelling())

    middleware = web.RequestSessionMiddleware(Starlette(routes=[Route("/", handler)]), sessions)
    async with sessions.open():
        conn = Connection(None)
        serving = asyncio.create_task(outer(conn.scope("GET", "/"), conn.receive, conn.send))
        await wait_until(lambda: sessions.in_flight == 1)
        conn.gone.set()
        await serving
    assert states == [0]


async def test_a_failing_stats_hook_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def hook(stats: web.RequestStats) -> None:
        raise ValueError("broken exporter")

    sessions = web.Sessions(on_request=hook)

    async def handler(request: Request) -> Response:
        await web.request_session(request).ones(2)
        return JSONResponse({"ok": True})

    app = Starlette(routes=[Route("/", handler)], lifespan=sessions.lifespan)
    sessions.install(app)
    async with app.router.lifespan_context(app), client(app) as c:
        r = await c.get("/")
    assert r.json() == {"ok": True}
    assert "on_request hook failed" in caplog.text
    assert "broken exporter" in caplog.text


def test_request_stats_as_dict() -> None:
    session = at.SessionStats(0, 0, 64, 0, allocated=3, freed=3, allocated_bytes=96, kernel_seconds=0.25)
    stats = web.RequestStats("GET", "/x", 200, "completed", 0.5, session)
    assert stats.allocated == 3
    assert stats.peak_bytes == 64
    assert stats.kernel_seconds == 0.25
    assert stats.as_dict() == {
        "method": "GET",
        "path": "/x",
        "status": 200,
        "outcome": "completed",
        "seconds": 0.5,
        "allocated": 3,
        "freed": 3,
        "allocated_bytes": 96,
        "peak_bytes": 64,
        "kernel_seconds": 0.25,
        "live_tensors": 0,
    }


# -- a real uvicorn server ---------------------------------------------------------------
def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run the client on a fresh uvloop loop (the server's loop is the parameter)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(fn())


@pytest.fixture(
    scope="module",
    params=[("fastapi", "uvloop"), ("starlette", "uvloop"), ("fastapi", "asyncio")],
    ids=lambda p: f"{p[0]}-{p[1]}",
)
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """``uvicorn --loop L tests._web_app:<kind>_app``; at shutdown, its lifespan closed the app session."""
    kind, loop = request.param
    with serve(f"_web_app:{kind}_app", app_dir=TESTS, loop=loop) as srv:
        yield srv
    assert srv.process.returncode == 0, srv.log
    assert "app session closed=True live_tensors=0" in srv.log
    assert "unclosed" not in srv.log, srv.log


async def log_from(c: httpx.AsyncClient) -> list[dict[str, Any]]:
    r = await c.get("/log")
    assert r.status_code == 200
    log: list[dict[str, Any]] = r.json()
    return log


@pytest.mark.slow
def test_server_answers_and_errors(server: RunningServer) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            before = len(await log_from(c))
            ok = await c.post("/matmul", json={"x": [[1, 0, 0]]})
            assert ok.status_code == 200
            assert ok.json() == {"y": [[0.0, 1.0]]}
            bad = await c.post("/matmul", json={"x": [[1, 0]]})
            assert bad.status_code == 422
            assert bad.json()["op"] == "matmul"
            assert bad.json()["inputs"][0] == {"dtype": "float32", "shape": [1, 2]}
            for word in NUMPY_WORDS:
                assert word not in bad.text
            oom = await c.get("/oom")
            assert (oom.status_code, oom.headers["retry-after"]) == (503, "1")
            internal = await c.get("/kernel-error")
            assert internal.status_code == 500
            assert _web_app.SECRET not in internal.text
            assert internal.json()["error"] == "internal"
            # uvicorn closes a connection whose app raised: a client of its own.
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as once:
                bug = await once.get("/bug")
            assert bug.status_code == 500
            assert (await c.get("/health")).json() == {"in_flight": 0}
            entries = (await log_from(c))[before:]
        assert [(e["path"], e["status"], e["outcome"]) for e in entries] == [
            ("/matmul", 200, "completed"),
            ("/matmul", 422, "completed"),
            ("/oom", 503, "completed"),
            ("/kernel-error", 500, "completed"),
            ("/bug", None, "failed"),
        ]
        for entry in entries:
            assert_closed_clean(entry)

    run(main)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["POST", "GET"])
def test_server_cancels_a_request_whose_client_left(server: RunningServer, method: str) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            before = len(await log_from(c))
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as impatient:
                kwargs: dict[str, Any] = {"json": {"x": 1}} if method == "POST" else {}
                leaving = asyncio.create_task(impatient.request(method, "/slow", **kwargs))
                async with asyncio.timeout(10):
                    while (await c.get("/health")).json()["in_flight"] == 0:
                        await asyncio.sleep(0.005)
                leaving.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await leaving
            # The closed connection ends the request before the kernel does.
            async with asyncio.timeout(_web_app.SLOW_SECONDS * 0.8):
                while len(entries := (await log_from(c))[before:]) == 0:
                    await asyncio.sleep(0.005)
            assert (await c.get("/health")).json() == {"in_flight": 0}
        (entry,) = entries
        assert (entry["path"], entry["status"], entry["outcome"]) == ("/slow", None, "disconnected")
        assert_closed_clean(entry)

    run(main)


async def test_requests_are_freed_without_the_garbage_collector() -> None:
    """A request's scope, its state and the server's callables are not left in reference cycles.

    (A cycle through the scope would make every request's body and server objects wait
    for the collector: measured as ~10% more loop time per request under uvicorn.)
    """
    import gc

    sessions = web.Sessions()

    async def handler(request: Request) -> Response:
        await request.body()
        await web.request_session(request).ones(2)  # a session, and so a disconnect watcher
        return Response(b"ok")

    app = web.RequestSessionMiddleware(Starlette(routes=[Route("/", handler, methods=["POST"])]), sessions)
    async with sessions.open():
        for _ in range(3):  # warm-up: module-level caches
            conn = Connection(b"{}")
            await app(conn.scope("POST", "/"), conn.receive, conn.send)
        await asyncio.sleep(0)
        gc.collect()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                conn = Connection(b"{}")
                await app(conn.scope("POST", "/"), conn.receive, conn.send)
                assert conn.messages[-1]["body"] == b"ok"
            del conn
            await asyncio.sleep(0)  # the cancelled watchers finish
            gc.collect()
            left = {type(o).__name__ for o in gc.garbage}
        finally:
            gc.garbage.clear()
            gc.set_debug(0)
            gc.enable()
    assert "_Request" not in left
    assert "Connection" not in left
    assert "Task" not in left


async def test_a_request_answered_without_suspending_frees_its_session_at_once() -> None:
    """A request that never suspended is not kept (with its closed session) until the loop's next pass.

    Its disconnect watcher would have started there; it needs none once the request is
    finished, so the request leaves the queue of watchers to start and its session goes
    with its last reference, not in a burst after the pass (which fed the garbage
    collector). A request that suspends is still watched (the disconnect tests above).
    """
    import weakref

    sessions = web.Sessions()
    refs: list[weakref.ref[at.AsyncEagerSession]] = []

    async def handler(request: Request) -> Response:
        await request.body()
        s = web.request_session(request)
        refs.append(weakref.ref(s))
        t = await s.add(await s.ones(2), 1.0)  # inline ops: nothing suspends
        return Response(json.dumps((await t.numpy()).tolist()).encode())

    app = web.RequestSessionMiddleware(Starlette(routes=[Route("/", handler, methods=["POST"])]), sessions)
    async with sessions.open():
        for _ in range(3):
            conn = Connection(b"{}")
            await app(conn.scope("POST", "/"), conn.receive, conn.send)
            assert conn.messages[-1]["body"] == b"[2.0, 2.0]"
            assert refs[-1]() is None  # freed before the loop ran anything else
            assert conn.receives == 1  # and no watcher read the connection
        await asyncio.sleep(0)  # the pass that would have started the watchers starts none
        assert conn.receives == 1
        assert sessions.in_flight == 0


# -- busy-loop placement: requests in flight are the loop's other callers -------------------
class FakeClocks:
    """A wall clock the handlers advance, and a CPU clock that keeps pace: a saturated loop."""

    def __init__(self) -> None:
        self.now = 100.0

    def tick(self) -> None:
        from aiotensor._loopload import WINDOW_S

        self.now += WINDOW_S


@pytest.fixture
def saturated() -> Iterator[FakeClocks]:
    """This thread's loop-load sensor on clocks that say the loop never waits (a fresh one after)."""
    from aiotensor import _loopload

    clocks = FakeClocks()
    _loopload._local.sensor = _loopload.Sensor(cpu=lambda: clocks.now, wall=lambda: clocks.now)
    yield clocks
    _loopload._local.sensor = _loopload.Sensor()


def band_app(clocks: FakeClocks, release: asyncio.Event | None) -> tuple[web.Sessions, Any]:
    """A middleware-wrapped app whose handler adds two (230, 230) float64 arrays (an op in the busy band)."""
    sessions = web.Sessions()
    a = np.random.default_rng(0).standard_normal((230, 230))

    async def handler(request: Request) -> Response:
        s = web.request_session(request)
        x = await s.constant(a)
        if release is not None:
            await release.wait()  # all requests in flight at once
        clocks.tick()
        y = await s.add(x, x)
        np.testing.assert_array_equal(await y.numpy(), a + a)
        return Response(b"ok")

    return sessions, web.RequestSessionMiddleware(Starlette(routes=[Route("/", handler)]), sessions)


async def test_a_saturated_loop_serving_requests_at_once_sends_their_kernels_to_the_pool(saturated: FakeClocks) -> None:
    release = asyncio.Event()
    sessions, app = band_app(saturated, release)
    async with sessions.open(), httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as c:
        for _ in range(3):  # one at a time: the loop saturates, but nobody else is served
            saturated.tick()
            release.set()
            assert (await c.get("/")).text == "ok"
        load = at.loop_load()
        assert (load.saturated, load.callers, load.offloaded) == (True, 1, 0)
        release.clear()
        gets = [asyncio.create_task(c.get("/")) for _ in range(4)]
        await wait_until(lambda: at.loop_load().requests == 4)
        release.set()
        assert [r.text for r in await asyncio.gather(*gets)] == ["ok"] * 4
    load = at.loop_load()
    assert load.requests == 0
    assert load.callers >= 4  # shown as the loop's input
    assert load.offloaded >= 3  # (every one, but the first may have asked before the window closed)
    assert load.kept_alone >= 2  # the serial requests' kernels, kept inline on the saturated loop


@pytest.mark.parametrize("strategy", list(at.ResourceCleanupStrategy), ids=lambda s: s.name)
async def test_a_request_session_closes_at_the_response_and_a_failed_close_leaves_no_request_in_flight(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = web.Sessions(request_cleanup=strategy)
    seen: list[at.AsyncEagerSession] = []

    async def handler(request: Request) -> Response:
        s = web.request_session(request)
        seen.append(s)
        x = await s.constant(np.ones(3))
        y = await s.add(x, x)
        del x  # dropped before close: IN_BACKGROUND's task is running when the session closes
        await asyncio.sleep(0)
        return Response(json.dumps((await y.numpy()).tolist()).encode())

    app = web.RequestSessionMiddleware(Starlette(routes=[Route("/", handler)]), sessions)
    transport = httpx.ASGITransport(app, raise_app_exceptions=False)
    async with sessions.open(), httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        assert (await c.get("/")).json() == [2.0, 2.0, 2.0]
        assert seen[0].closed
        stats = seen[0].stats()
        assert (stats.live_tensors, stats.live_bytes, stats.allocated, stats.freed) == (0, 0, 2, 2)
        assert sessions.in_flight == 0

        replace = _defaults.replace_interactive
        app_session = sessions.app_session

        def failing_at_the_end_of_close(old: object, new: object) -> object:
            if old is not app_session:  # a request session's close fails (everything freed)
                raise RuntimeError("close failed")
            return replace(old, new)

        monkeypatch.setattr(_defaults, "replace_interactive", failing_at_the_end_of_close)
        await c.get("/")  # (the close fails at the last body chunk, after the status went out)
        assert len(seen) == 2
        assert seen[1].closed
        assert sessions.in_flight == 0  # the failed close still took the request out
