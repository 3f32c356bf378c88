"""A tensor's or an array's values as a JSON response: ``web.rows_json`` and ``web.rows_response``.

The bytes are checked against ``json.loads`` of what they hold and against what FastAPI
answers for the same values through a pydantic response model (non-finite values as
``null``); a service answering with ``rows_response`` is driven through its middleware,
and its request session must be empty afterwards.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI, Request
from pydantic import BaseModel
from starlette.responses import Response

import aiotensor as at
from aiotensor import web
from aiotensor.web import _output

ARRAYS = {
    "float32 rows": np.array([[0.1, -2.5, 3.0], [1e-8, 1e30, -0.0]], dtype=np.float32),
    "float64 rows": np.array([[0.1, 1 / 3], [2.0, -1e300]]),
    "float16": np.array([0.5, 1.25], dtype=np.float16),
    "int64": np.arange(6).reshape(2, 3),
    "uint8": np.array([0, 255], dtype=np.uint8),
    "bool": np.array([True, False]),
    "3-d": np.arange(8, dtype=np.float32).reshape(2, 2, 2),
    "one row": np.ones((1, 4), dtype=np.float32),
    "no rows": np.zeros((0, 4), dtype=np.float32),
    "0-d": np.array(2.5, dtype=np.float32),
    "column (not C-contiguous)": np.arange(12, dtype=np.float32).reshape(3, 4)[:, 1:2],
    "transposed": np.arange(6, dtype=np.float64).reshape(2, 3).T,
    "big-endian float64": np.array([[1.5, -2.25]], dtype=">f8"),
    "big-endian int32": np.array([1, -2], dtype=">i4"),
    "uint64": np.array([0, 2**64 - 1], dtype=np.uint64),
}


def _read_back(values: np.ndarray[Any, Any], body: bytes, key: str | None) -> None:
    data = json.loads(body)
    got = data if key is None else data[key]
    if key is not None:
        assert list(data) == [key]
    expected = values.tolist()
    if values.dtype == np.float32 or values.dtype == np.float16:
        # float32 is written at float32's precision: it reads back as the same float32.
        as_written = np.asarray(got, dtype=values.dtype)
        np.testing.assert_array_equal(as_written, np.asarray(expected, dtype=values.dtype), strict=True)
    else:
        assert got == expected


@pytest.mark.parametrize("name", sorted(ARRAYS))
@pytest.mark.parametrize("key", ["scores", "out", None])
def test_rows_json_holds_the_values_under_the_key(name: str, key: str | None) -> None:
    values = ARRAYS[name]
    _read_back(values, web.rows_json(values, key=key), key)


def test_float32_is_written_at_its_own_precision() -> None:
    assert web.rows_json(np.array([[0.1, 2.0]], dtype=np.float32)) == b'{"scores":[[0.1,2.0]]}'
    assert web.rows_json(np.array([0.1], dtype=np.float32), key=None) == b"[0.1]"


def test_without_orjson_the_same_values_are_written(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_output, "_dumps_numpy", None)
    for values in ARRAYS.values():  # (float32 widened by tolist: other text, the same float32 read back)
        _read_back(values, web.rows_json(values), "scores")
    assert web.rows_json(np.array([np.nan, np.inf, 1.0]), key=None) == b"[null,null,1.0]"


class _Scores(BaseModel):
    scores: list[list[float]]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
async def test_non_finite_values_are_null_as_fastapi_writes_them(dtype: Any) -> None:
    values = np.array([[np.nan, np.inf], [-np.inf, 1.5]], dtype=dtype)
    app = FastAPI()

    @app.get("/model")
    async def model() -> _Scores:
        return _Scores(scores=values.tolist())

    @app.get("/rows")
    async def rows() -> Response:
        return await web.rows_response(values)

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        by_model = (await client.get("/model")).json()
        by_rows = await client.get("/rows")
    assert by_rows.status_code == 200
    assert by_rows.headers["content-type"] == "application/json"
    assert by_rows.json() == by_model == {"scores": [[None, None], [None, 1.5]]}


def test_other_dtypes_go_through_python_values() -> None:
    assert web.rows_json(np.array(["a", "b"]), key=None) == b'["a","b"]'
    assert web.rows_json(np.array([1.5, np.inf], dtype=np.longdouble), key=None) == b"[1.5,null]"
    with pytest.raises(TypeError):
        web.rows_json(np.array([1 + 2j]))


async def test_rows_response_of_a_tensor_fetches_it(s: at.AsyncEagerSession) -> None:
    values = np.array([[1.5, 2.0], [3.0, 4.25]], dtype=np.float32)
    t = await s.constant(values)
    response = await web.rows_response(t, key="out", status_code=201, headers={"X-Rows": "2"})
    assert response.status_code == 201
    assert response.headers["x-rows"] == "2"
    assert response.media_type == "application/json"
    assert json.loads(bytes(response.body)) == {"out": [[1.5, 2.0], [3.0, 4.25]]}
    assert int(response.headers["content-length"]) == len(response.body)


async def test_rows_response_refuses_other_values() -> None:
    with pytest.raises(TypeError, match="Tensor or an ndarray"):
        await web.rows_response([[1.0, 2.0]])  # type: ignore[arg-type]


async def test_a_service_answers_with_rows_response_and_its_request_session_empties() -> None:
    sessions = web.Sessions(limits=web.Limits(max_bytes=1 << 16, max_rows=64))
    seen: list[at.AsyncEagerSession] = []
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 7

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with sessions.open() as s:
            app.state.w = await s.constant(w)
            yield

    app = FastAPI(lifespan=lifespan)
    sessions.install(app)

    @app.post("/predict")
    async def predict(request: Request) -> Response:
        x = await web.read_rows(request, width=4)
        s = web.request_session(request)
        seen.append(s)
        return await web.rows_response(await s.matmul(x, request.app.state.w))

    rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.post("/predict", json={"inputs": rows.tolist()})
            bad = await client.post("/predict", json={"inputs": [[1.0, 2.0]]})
    assert r.status_code == 200
    np.testing.assert_array_equal(np.asarray(r.json()["scores"], dtype=np.float32), rows @ w)
    assert bad.status_code == 422  # the refusal is read_rows's, before any response
    assert len(seen) == 1
    assert seen[0].closed
    stats = seen[0].stats()
    assert (stats.live_tensors, stats.live_bytes) == (0, 0)
    assert stats.allocated == stats.freed == 2


async def test_rows_response_of_a_large_tensor_fetches_it_the_long_way(s: at.AsyncEagerSession) -> None:
    values = np.arange(2 * 70_000, dtype=np.float64).reshape(2, -1)  # over the size fetched on the loop
    t = await s.constant(values)
    assert s._engine.fetch_now(t) is None  # (so rows_response takes numpy()'s fetch)
    response = await web.rows_response(t, key=None)
    np.testing.assert_array_equal(np.asarray(json.loads(bytes(response.body))), values)


async def test_rows_response_of_a_closed_sessions_tensor_raises() -> None:
    async with at.AsyncEagerSession() as s:
        t = await s.constant(np.ones((2, 2)))
    with pytest.raises(at.SessionClosedError):
        await web.rows_response(t)
