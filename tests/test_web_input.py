"""Bad input to a service: ``web.parse_rows``/``read_rows``, the body limits and the one error shape.

Every kind of bad body (NaN, inf, a number that overflows float32, ragged rows,
non-numeric values, an empty body, invalid JSON, a flat list, no rows, too many rows,
a huge body) is sent to the apps of ``tests/_web_app.py``: in process through
``httpx.ASGITransport`` and to a real uvicorn on 127.0.0.1. Each answer must have its
documented status and the one :data:`aiotensor.web.ErrorBody` shape, and nothing may be
left in any session afterwards.

A large body is parsed on the request session's pool: where the parse runs (by size,
by the request sessions' threshold, by ``offload=``), every bad body refused alike from
the pool, the parsed array owned by the request session and gone when it closes, and a
request cancelled during its parse leaving nothing.
"""

from __future__ import annotations

import asyncio
import json
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
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
from aiotensor import web
from examples.web_service.server import RunningServer, serve
from tests import _web_app

T = TypeVar("T")
TESTS = Path(__file__).resolve().parent
APPS = {"fastapi": _web_app.make_fastapi_app, "starlette": _web_app.make_starlette_app}
KEYS = {"error", "detail", "op", "inputs", "errors"}
JSON = {"content-type": "application/json"}


def rows_body(n: int, width: int = 3) -> bytes:
    return json.dumps({"inputs": [[0.5] * width] * n}).encode()


#: name: (body, status, error code, a fragment of the detail)
BAD: dict[str, tuple[bytes, int, str, str]] = {
    "nan": (b'{"inputs": [[1, 2, 3], [1, NaN, 3]]}', 422, "invalid_input", "inputs[1][1]: NaN is not allowed"),
    "inf": (b'{"inputs": [[1, 2, -Infinity]]}', 422, "invalid_input", "inputs[0][2]: -Infinity is not allowed"),
    "overflow": (b'{"inputs": [[1, 1e39, 3]]}', 422, "invalid_input", "inputs[0][1]: 1e+39 overflows float32"),
    "ragged": (b'{"inputs": [[1, 2, 3], [1, 2]]}', 422, "invalid_input", "inputs[1]: 2 values, expected 3"),
    "non-numeric": (b'{"inputs": [[1, "two", 3]]}', 422, "invalid_input", 'inputs[0][1]: "two" is not a number'),
    "boolean": (b'{"inputs": [[1, true, 3]]}', 422, "invalid_input", "inputs[0][1]: true is not a number"),
    "empty body": (b"", 422, "invalid_input", "the body is not valid JSON"),
    "invalid json": (b'{"inputs": [[1, 2', 422, "invalid_input", "the body is not valid JSON"),
    "flat list": (b'{"inputs": [1, 2, 3]}', 422, "invalid_input", "inputs[0]: expected a row of 3 numbers"),
    "no rows": (b'{"inputs": []}', 422, "invalid_input", "inputs: no rows"),
    "no key": (b'{"rows": [[1, 2, 3]]}', 422, "invalid_input", "expected an object with 'inputs'"),
    "too many rows": (rows_body(_web_app.MAX_ROWS + 1), 413, "too_large", f"more than {_web_app.MAX_ROWS} rows"),
    "huge body": (rows_body(_web_app.MAX_BYTES // 10), 413, "too_large", f"at most {_web_app.MAX_BYTES}"),
}


def assert_error(r: httpx.Response, status: int, code: str, fragment: str) -> dict[str, Any]:
    """The documented status, the one shape, the code, and a detail that says what was wrong."""
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert set(body) == KEYS, body
    assert body["error"] == code
    assert fragment in body["detail"], body
    assert isinstance(body["errors"], list)
    for item in body["errors"]:
        assert set(item) == {"loc", "msg", "type"}
    assert "Traceback" not in r.text
    return body


# -- parse_rows, the pure part ----------------------------------------------------------
def test_parse_rows_gives_a_fresh_array_of_the_dtype() -> None:
    x = web.parse_rows(b'{"inputs": [[1, 2.5, -3e2], [0, 0, 1]]}', width=3)
    np.testing.assert_array_equal(x, np.array([[1, 2.5, -300], [0, 0, 1]], dtype=np.float32))
    assert x.dtype == np.float32
    y = web.parse_rows(b"[[1, 2]]", width=2, dtype=np.float64, key=None)
    assert (y.dtype, y.shape) == (np.float64, (1, 2))
    # Other keys (strings among them) take the checked path and give the same array.
    z = web.parse_rows(b'{"id": "a[b", "inputs": [[1, 2.5, -3e2], [0, 0, 1]]}', width=3)
    np.testing.assert_array_equal(z, x)


@pytest.mark.parametrize("name", sorted(set(BAD) - {"huge body"}))
def test_parse_rows_refuses_bad_rows_saying_where(name: str) -> None:
    body, status, code, fragment = BAD[name]
    with pytest.raises(web.RequestRejected) as info:
        web.parse_rows(body, width=3, max_rows=_web_app.MAX_ROWS)
    assert info.value.status_code == status
    assert info.value.body["error"] == code
    assert fragment in info.value.body["detail"]


def test_a_refusal_lists_the_first_bad_rows_with_their_place() -> None:
    with pytest.raises(web.RequestRejected) as info:
        web.parse_rows(b'{"inputs": [[1, 2, 3], [1], [1, 2, 3], [4, 5]]}', width=3)
    assert [e["loc"] for e in info.value.errors] == [["body", "inputs", 1], ["body", "inputs", 3]]
    assert info.value.detail == "inputs[1]: 1 value, expected 3"


def test_nonfinite_values_pass_when_allowed() -> None:
    x = web.parse_rows(b'{"inputs": [[NaN, Infinity, 1e39]]}', width=3, allow_nonfinite=True)
    assert np.isnan(x[0, 0])
    assert np.isposinf(x[0, 1:]).all()


def test_parse_rows_wants_a_floating_dtype() -> None:
    with pytest.raises(TypeError, match="floating"):
        web.parse_rows(b'{"inputs": [[1]]}', width=1, dtype=np.int32)


def test_a_row_limit_is_judged_before_parsing() -> None:
    # Over the limit and not even JSON: refused from the bracket count, never parsed.
    body = b'{"inputs": [' + b"[1, 2, 3]," * 10 + b"[1, 2"
    with pytest.raises(web.RequestRejected) as info:
        web.parse_rows(body, width=3, max_rows=5)
    assert info.value.status_code == 413


def test_a_short_body_of_too_many_rows_is_refused_once_parsed() -> None:
    # Too short to hold six rows of three numbers: not counted before parsing, and
    # still a 413 (not a 422 for the empty rows) once parsed.
    body = b'{"inputs": [[],[],[],[],[],[],[]]}'
    assert len(body) < (5 + 1) * (2 * 3 + 1)
    with pytest.raises(web.RequestRejected) as info:
        web.parse_rows(body, width=3, max_rows=5)
    assert info.value.status_code == 413
    assert info.value.detail == "inputs: more than 5 rows"
    assert [e["type"] for e in info.value.errors] == ["too_many_rows"]
    x = web.parse_rows(b'{"inputs": [[1, 2, 3], [4, 5, 6]]}', width=3, max_rows=2)
    assert x.shape == (2, 3)


def test_error_body_and_handlers_share_one_shape() -> None:
    assert set(web.error_body("x", "y")) == KEYS
    assert web.Limits() == web.Limits(max_bytes=None, max_rows=None)


# -- in process --------------------------------------------------------------------------
@pytest.fixture(params=sorted(APPS))
async def app(request: pytest.FixtureRequest) -> AsyncIterator[Any]:
    application = APPS[request.param]()
    async with application.router.lifespan_context(application):
        yield application


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app, raise_app_exceptions=False), base_url="http://t")


async def test_bad_rows_are_refused_in_one_shape_and_leak_nothing(app: Any) -> None:
    h: _web_app.Handlers = app.state.handlers
    app_session = h.sessions.app_session
    before = app_session.stats()
    async with client(app) as c:
        ok = await c.post("/rows", content=b'{"inputs": [[1, 0, 0], [0, 1, 0]]}', headers=JSON)
        assert ok.json() == {"y": [[0.0, 1.0], [2.0, 3.0]]}
        for body, status, code, fragment in BAD.values():
            assert_error(await c.post("/rows", content=body, headers=JSON), status, code, fragment)
            assert_error(await c.post("/session-rows", content=body, headers=JSON), status, code, fragment)
        # Not ours, the same shape: an unknown path, a wrong method.
        assert_error(await c.get("/nowhere"), 404, "not_found", "Not Found")
        assert_error(await c.get("/rows"), 405, "method_not_allowed", "Method Not Allowed")
    after = app_session.stats()
    assert (after.live_tensors, after.allocated) == (before.live_tensors, before.allocated)
    assert h.sessions.in_flight == 0
    # /rows opened a session for the good request only: every refusal came before any tensor.
    assert [(e["path"], e["status"]) for e in h.log if e["path"] == "/rows"] == [("/rows", 200)]
    # /session-rows opened one first each time (refused with a Content-Length: never reached), nothing held.
    assert len([e for e in h.log if e["path"] == "/session-rows"]) == len(BAD) - 1
    assert all(e["live_tensors"] == 0 and e["allocated"] == e["freed"] for e in h.log)


async def test_fastapi_validation_errors_take_the_same_shape() -> None:
    app = _web_app.make_fastapi_app()
    async with app.router.lifespan_context(app), client(app) as c:
        cases = {
            b'{"x": [[1, "two", 3]]}': "body.x.0.1",
            b"": "body",
            b'{"x": [[1, 2': "body",
            b'{"x": [1, 2, 3]}': "body.x.0",
        }
        for body, where in cases.items():
            got = assert_error(await c.post("/model", content=body, headers=JSON), 422, "invalid_input", where)
            assert got["errors"], got
        huge = b"[" * (_web_app.MAX_BYTES + 1)
        assert_error(await c.post("/model", content=huge, headers=JSON), 413, "too_large", "at most")
        ok = await c.post("/model", json={"x": [[1, 0, 0]]})
        assert ok.json() == {"y": [[0.0, 1.0]]}
        assert app.state.handlers.sessions.in_flight == 0


@pytest.mark.parametrize("path", ["/rows", "/session-rows"])
async def test_a_body_without_content_length_is_cut_off_at_the_limit(app: Any, path: str) -> None:
    # /session-rows opens its session first: the disconnect watcher reads the body then.
    async def chunks() -> AsyncIterator[bytes]:
        for _ in range(64):
            yield b" " * (64 << 10)  # 4 MiB in all, 1 MiB allowed

    async with client(app) as c:
        r = await c.post(path, content=chunks(), headers=JSON)
        assert "content-length" not in r.request.headers
        assert_error(r, 413, "too_large", f"over {_web_app.MAX_BYTES} bytes")
        ok = await c.post(path, content=b'{"inputs": [[0, 0, 1]]}', headers=JSON)
        assert ok.json() == {"y": [[4.0, 5.0]]}
    h: _web_app.Handlers = app.state.handlers
    assert h.sessions.in_flight == 0
    assert all(e["live_tensors"] == 0 and e["allocated"] == e["freed"] for e in h.log)


async def test_route_limits_replace_the_service_limits() -> None:
    async def echo(request: Request) -> Response:
        return JSONResponse({"n": len(await request.body())})

    sessions = web.Sessions(limits=web.Limits(max_bytes=10), route_limits={"/big": web.Limits(max_bytes=100)})
    app = Starlette(routes=[Route("/small", echo, methods=["POST"]), Route("/big", echo, methods=["POST"])])
    sessions.install(app)
    async with client(app) as c:
        assert (await c.post("/small", content=b"x" * 10)).json() == {"n": 10}
        assert_error(await c.post("/small", content=b"x" * 11), 413, "too_large", "at most 10")
        assert (await c.post("/big", content=b"x" * 100)).json() == {"n": 100}
        assert_error(await c.post("/big", content=b"x" * 101), 413, "too_large", "at most 100")


async def test_the_body_limits_alone_and_in_the_request_session_middleware_answer_alike() -> None:
    async def echo(request: Request) -> Response:
        return JSONResponse({"n": len(await request.body()), "limits": web.limits_for(request).max_bytes})

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for _ in range(n):
            yield b"x" * 4

    inner = Starlette(routes=[Route("/small", echo, methods=["POST"]), Route("/big", echo, methods=["POST"])])
    limits, route_limits = web.Limits(max_bytes=10), {"/big": web.Limits(max_bytes=20)}
    sessions = web.Sessions(limits=limits, route_limits=route_limits)
    alone = web.BodyLimitMiddleware(inner, limits, route_limits)
    assert (alone.limits, alone.route_limits) == (limits, route_limits)
    one_layer = web.RequestSessionMiddleware(inner, sessions, limits=limits, route_limits=route_limits)
    installed = Starlette(routes=inner.routes)
    sessions.install(installed)
    assert [m.cls for m in installed.user_middleware] == [web.RequestSessionMiddleware]  # type: ignore[comparison-overlap]  # one layer
    for app in (alone, one_layer, installed):
        async with client(app) as c:
            assert (await c.post("/small", content=b"x" * 10)).json() == {"n": 10, "limits": 10}
            assert (await c.post("/big", content=b"x" * 20)).json() == {"n": 20, "limits": 20}
            assert_error(await c.post("/small", content=b"x" * 11), 413, "too_large", "at most 10")
            assert_error(await c.post("/big", content=b"x" * 21), 413, "too_large", "at most 20")
            assert (await c.post("/small", content=chunks(2))).json() == {"n": 8, "limits": 10}
            assert_error(await c.post("/small", content=chunks(3)), 413, "too_large", "over 10 bytes")
            assert_error(await c.post("/big", content=chunks(6)), 413, "too_large", "over 20 bytes")
    assert sessions.in_flight == 0


# -- a real uvicorn ---------------------------------------------------------------------
def run(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(fn())


@pytest.fixture(scope="module", params=sorted(APPS))
def server(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    with serve(f"_web_app:{request.param}_app", app_dir=TESTS) as srv:
        yield srv
    assert srv.process.returncode == 0, srv.log
    assert "app session closed=True live_tensors=0" in srv.log
    assert "Traceback" not in srv.log, srv.log


async def _raw_post(
    url: str, headers: dict[str, str], first: bytes, path: str = "/rows"
) -> tuple[asyncio.StreamReader, Any]:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    writer.write(f"POST {path} HTTP/1.1\r\nhost: {host}\r\n{head}\r\n".encode() + first)
    await writer.drain()
    return reader, writer


@pytest.mark.slow
def test_server_refuses_bad_rows_in_one_shape(server: RunningServer) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            for body, status, code, fragment in BAD.values():
                assert_error(await c.post("/rows", content=body, headers=JSON), status, code, fragment)
            ok = await c.post("/rows", json={"inputs": [[1, 0, 0]]})
            assert ok.json() == {"y": [[0.0, 1.0]]}
            log = (await c.get("/log")).json()
            assert (await c.get("/health")).json() == {"in_flight": 0}
        assert [(e["path"], e["status"]) for e in log] == [("/rows", 200)]  # no refusal opened a session
        assert all(e["live_tensors"] == 0 and e["allocated"] == e["freed"] for e in log)

    run(main)


@pytest.mark.slow
def test_server_answers_health_while_refusing_a_huge_body(server: RunningServer) -> None:
    huge = 107_000_000  # the size a newcomer's 200k rows took

    async def main() -> None:
        # A client announcing 107 MB and sending its first bytes: answered 413, the rest never read.
        # (Only a little is sent: bytes the server never read would turn its close into a reset.)
        reader, writer = await _raw_post(server.url, {**JSON, "content-length": str(huge)}, b"[" * (16 << 10))
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            health = await c.get("/health")
            assert (health.status_code, health.json()) == (200, {"in_flight": 0})
        answer = await asyncio.wait_for(reader.read(), 30)  # the server closes the connection after it
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        got = json.loads(body)
        assert set(got) == KEYS
        assert got["error"] == "too_large"
        # A body without a length, in chunks: refused for the chunk that takes it past the limit.
        reader, writer = await _raw_post(server.url, {**JSON, "transfer-encoding": "chunked"}, b"")
        chunk = b" " * (256 << 10)
        for piece in [chunk] * (_web_app.MAX_BYTES // len(chunk)) + [b" "]:
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")  # the end: the server reads a refused body to its end (up to DRAIN_MAX)
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 413"), head
        assert b"too_large" in body
        # The same to a handler that opened its session before reading: its watcher reads the body.
        reader, writer = await _raw_post(server.url, {**JSON, "transfer-encoding": "chunked"}, b"", "/session-rows")
        for piece in [chunk] * (2 * _web_app.MAX_BYTES // len(chunk)):
            writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 30)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as c:
            assert (await c.get("/health")).json() == {"in_flight": 0}

    run(main)


# -- the parse on the pool ----------------------------------------------------------------
class _Parses:
    """A ``parse_rows`` that records where it ran and keeps a weak reference to each array it made."""

    def __init__(self, real: Callable[..., Any]) -> None:
        self.real = real
        self.threads: list[int] = []
        self.made: list[weakref.ref[Any]] = []
        self.gate: threading.Event | None = None  # set: the parse waits for it
        self.started = threading.Event()

    def __call__(self, body: bytes, **kwargs: Any) -> Any:
        self.threads.append(threading.get_ident())
        self.started.set()
        if self.gate is not None:
            self.gate.wait(30)
        x = self.real(body, **kwargs)
        self.made.append(weakref.ref(x))
        return x


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> _Parses:
    from aiotensor.web import _input

    p = _Parses(_input.parse_rows)
    monkeypatch.setattr(_input, "parse_rows", p)
    return p


def pool_app(
    offload: bool | None, config: at.SessionConfig | None = None, **limits: Any
) -> tuple[Starlette, list[web.RequestStats], list[at.Tensor]]:
    """``POST /rows``: ``read_rows(offload=...)``, answering the rows; the tensors are kept past their request."""
    log: list[web.RequestStats] = []
    kept: list[at.Tensor] = []
    sessions = web.Sessions(
        on_request=log.append, request_config=config, limits=web.Limits(**limits) if limits else None
    )

    async def rows(request: Request) -> Response:
        x = await web.read_rows(request, width=3, offload=offload)
        assert x.session is web.request_session(request)
        kept.append(x)
        return JSONResponse({"y": (await x.numpy()).tolist()})

    app = Starlette(routes=[Route("/rows", rows, methods=["POST"])], lifespan=sessions.lifespan)
    sessions.install(app)
    return app, log, kept


#: (offload, rows, the request sessions' inline_threshold_us, parsed on the pool)
WHERE = [(True, 2, 50.0, True), (None, 4096, 50.0, True), (None, 2, 50.0, False), (None, 2, 0.0, True)]
WHERE += [(None, 4096, 1e6, False), (False, 4096, 50.0, False)]


@pytest.mark.parametrize(("offload", "n", "threshold", "on_pool"), WHERE)
async def test_rows_are_parsed_on_the_pool_when_large_and_owned_by_the_request_session(
    parses: _Parses, offload: bool | None, n: int, threshold: float, on_pool: bool
) -> None:
    app, log, kept = pool_app(offload, at.SessionConfig(inline_threshold_us=threshold))
    body = rows_body(n)
    async with app.router.lifespan_context(app), client(app) as c:
        r = await c.post("/rows", content=body, headers=JSON)
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(np.asarray(r.json()["y"], dtype=np.float32), web.parse_rows(body, width=3))
    assert (parses.threads[0] != threading.get_ident()) is on_pool
    # Owned by the request session, not copied, and freed with it: the array the parse
    # made is gone once the request ended, though its tensor object is still held here.
    (x,) = kept
    assert parses.made[0]() is None
    with pytest.raises(at.SessionClosedError):
        await x.numpy()
    assert (log[0].session.allocated, log[0].session.freed, log[0].session.live_tensors) == (1, 1, 0)


@pytest.mark.parametrize("name", sorted(set(BAD) - {"huge body"}))
async def test_bad_rows_parsed_on_the_pool_are_refused_alike(parses: _Parses, name: str) -> None:
    body, status, code, fragment = BAD[name]
    app, log, kept = pool_app(True, max_rows=_web_app.MAX_ROWS)
    async with app.router.lifespan_context(app), client(app) as c:
        assert_error(await c.post("/rows", content=body, headers=JSON), status, code, fragment)
    assert parses.threads
    assert parses.threads[0] != threading.get_ident()
    assert not kept
    assert [(e.status, e.session.allocated, e.session.live_tensors) for e in log] == [(status, 0, 0)]


async def test_a_request_cancelled_while_its_rows_are_parsed_leaves_nothing(parses: _Parses) -> None:
    app, log, kept = pool_app(True)
    parses.gate = threading.Event()
    async with app.router.lifespan_context(app), client(app) as c:
        post = asyncio.ensure_future(c.post("/rows", content=rows_body(64), headers=JSON))
        while not parses.started.is_set():  # the parse is running on a worker, held at the gate
            await asyncio.sleep(0.005)
        post.cancel()
        await asyncio.sleep(0)
        parses.gate.set()
        with pytest.raises(asyncio.CancelledError):
            await post
        assert not kept
        # The parse finished after its request was gone: its array was never a tensor, and is freed.
        for _ in range(1000):
            if parses.made and parses.made[0]() is None:
                break
            await asyncio.sleep(0.005)
        assert parses.made
        assert parses.made[0]() is None
        assert [(e.session.live_tensors, e.session.live_bytes) for e in log] == [(0, 0)]
        # The service goes on serving.
        r = await c.post("/rows", content=rows_body(2), headers=JSON)
        assert r.status_code == 200, r.text
