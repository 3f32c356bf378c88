"""A request body's rows as an array or a tensor, refused with a 413 or a 422 that says which row and why.

:func:`parse_rows` is the pure part (bytes in, a 2-d ndarray out); :func:`read_rows` reads
the body of a request under the service's :class:`Limits` and returns the rows as a
tensor of the request session.

The path from JSON to an array: a body of numbers is parsed by ``orjson`` (the ``web``
extra; without it pydantic's parser, else the standard library's), and the rows become
one array in one ``np.asarray`` call. Parsing straight from the bytes to an
array, without any Python float in between (``np.fromstring``, ``np.loadtxt``), measured
slower than either parser plus ``np.asarray`` (their number parsing is the cost, not
the floats), so the floats stay and the fast parser does the work: see the benchmark in
the web guide. What is checked costs little on the usual body: the row count is bounded
from the body's bytes before parsing, a body of nothing but numbers and brackets (one
``bytes.translate``) skips the per-value type check, and widths, raggedness and
non-finite values are found on the array; only a refused body is walked value by value,
to say where it went wrong.

Where the parse runs: a body whose parse is estimated above the request session's
``inline_threshold_us`` is parsed on the session's pool, so the event loop answers
other requests while the rows are read; a small body is parsed on the loop, where a hop
would cost more than the parse.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .._config import SessionConfig
from .._errors import KernelError
from .._opdef import OPS
from ._errors import ErrorItem, RequestRejected
from ._limits import SCOPE_KEY as LIMITS_KEY
from ._limits import Limits, limits_for
from ._middleware import _request_of

if TYPE_CHECKING:
    from starlette.requests import Request

    from .._session import AsyncEagerSession
    from .._tensor import Tensor

__all__ = ["parse_rows", "read_body", "read_rows"]

_loads: Callable[[bytes], Any]
_DecodeError: tuple[type[Exception], ...] = (ValueError,)
try:
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the web extra
    try:  # pydantic's parser (FastAPI's dependency): 1.4x orjson's time on rows of floats
        from pydantic_core import from_json as _loads
    except ImportError:  # the standard library's: about 6x
        _loads = json.loads
else:
    _loads = orjson.loads
    _DecodeError = (orjson.JSONDecodeError, ValueError)

# Bytes a body of numbers, brackets and object punctuation is made of (its keys aside).
_NUMERIC = b"0123456789+-.eE,[]{}: \t\r\n"
_SHOWN = 3  # refused parts listed in an answer's ``errors``
_APPLY = OPS["apply"]
#: The parse's cost model, from ``parse_rows`` on rows of float32 numbers with six
#: decimals (``python -m benchmarks.bench_input``'s bodies): a few µs, then ~3.6 ns per byte.
PARSE_US = 4.0
PARSE_US_PER_BYTE = 0.0036
_DEFAULT_CONFIG = SessionConfig()
_FLOAT32 = np.dtype(np.float32)


def _reject(detail: str, loc: list[str | int] | None = None, kind: str = "value_error") -> RequestRejected:
    errors: list[ErrorItem] = [] if loc is None else [{"loc": loc, "msg": detail, "type": kind}]
    return RequestRejected(422, detail, errors)


def _too_many(key: str | None, max_rows: int) -> RequestRejected:
    # More rows than the limit: a 413 (found before parsing, or after for a short body).
    item: ErrorItem = {"loc": _loc(key), "msg": f"at most {max_rows} rows", "type": "too_many_rows"}
    return RequestRejected(413, f"{_name(key)}: more than {max_rows} rows", [item])


def _name(key: str | None, row: int | None = None, col: int | None = None) -> str:
    text = key or "body"
    if row is not None:
        text += f"[{row}]"
    if col is not None:
        text += f"[{col}]"
    return text


def _loc(key: str | None, *rest: int) -> list[str | int]:
    return ["body", *([key] if key else []), *rest]


def _is_number(v: object) -> bool:
    t = type(v)
    return t is float or t is int  # bool is an int subclass, and not a number here


def _diagnose(rows: list[Any], width: int, key: str | None) -> RequestRejected:
    # The body was refused: find where, value by value, and say so (the first few places).
    problems: list[tuple[str, list[str | int], str]] = []
    for i, row in enumerate(rows):
        if not isinstance(row, list):
            what = "a number" if _is_number(row) else type(row).__name__
            problems.append((f"{_name(key, i)}: expected a row of {width} numbers, got {what}", _loc(key, i), "row"))
        elif len(row) != width:
            n = len(row)
            msg = f"{_name(key, i)}: {n} value{'' if n == 1 else 's'}, expected {width}"
            problems.append((msg, _loc(key, i), "row_width"))
        else:
            for j, v in enumerate(row):
                if not _is_number(v):
                    shown = json.dumps(v)[:40] if not isinstance(v, list | dict) else type(v).__name__
                    problems.append((f"{_name(key, i, j)}: {shown} is not a number", _loc(key, i, j), "not_a_number"))
                    break
        if len(problems) >= _SHOWN:
            break
    if not problems:  # (a value numpy refused that passed these checks: say so plainly)
        problems.append((f"{_name(key)}: not a list of rows of {width} numbers", _loc(key), "value_error"))
    errors: list[ErrorItem] = [{"loc": loc, "msg": msg, "type": kind} for msg, loc, kind in problems]
    return RequestRejected(422, problems[0][0], errors)


def parse_rows(
    body: bytes,
    *,
    width: int,
    dtype: Any = np.float32,
    key: str | None = "inputs",
    max_rows: int | None = None,
    allow_nonfinite: bool = False,
) -> np.ndarray[Any, Any]:
    """The rows of a JSON body as a fresh 2-d array of ``dtype``, ``width`` columns; :class:`RequestRejected` else.

    ``body`` is ``{"<key>": [[...], ...]}`` (``key=None``: the body is the list of rows).

    Refused with 422 (:class:`~aiotensor.web.RequestRejected`, its ``detail`` naming the
    row and why, e.g. ``"inputs[3]: 63 values, expected 64"``): a body that is not JSON,
    without ``key``, no rows, a row that is not a list (a flat list of numbers), a row of
    another width, a value that is not a number (strings, ``true``, ``null``), and, unless
    ``allow_nonfinite``, NaN, infinities and numbers that overflow ``dtype`` (``1e39``
    in float32). More than ``max_rows`` rows is a 413, found before the body is parsed
    (a body too short to hold that many rows of ``width`` numbers is parsed first).

    Args:
        body: The request body.
        width: Values per row.
        dtype: A floating dtype (``float32`` by default).
        key: The key of the rows in the body's object, or ``None`` for a bare list.
        max_rows: The most rows accepted, or ``None``.
        allow_nonfinite: Accept NaN and infinities (``NaN``, ``Infinity`` and
            ``-Infinity`` in the JSON, and overflowing numbers, which become ``inf``).
    """
    dt = dtype if type(dtype) is type(_FLOAT32) else np.dtype(dtype)  # (read_rows passes a dtype)
    if dt.kind != "f":
        raise TypeError(f"parse_rows: dtype must be a floating dtype, got {dt}")
    # Counted before parsing only where parsing could cost: a body shorter than
    # ``max_rows + 1`` rows of ``width`` one-digit values cannot hold too many rows of
    # numbers (the count is ~1.7 µs of a 16-row request's ~21 µs parse); a short body
    # with too many rows that are not (empty ones) is counted once parsed.
    if max_rows is not None and len(body) >= (max_rows + 1) * (2 * width + 1) and body.count(b"[") - 1 > max_rows:
        raise _too_many(key, max_rows)
    try:
        data = _loads(body)
    except _DecodeError:
        try:  # the standard library's parser reads NaN and Infinity (refused below, or not), and words errors well
            data = json.loads(body)
        except ValueError as exc:
            raise _reject(f"the body is not valid JSON: {exc}", ["body"], "json_invalid") from None
    if key is None:
        rows = data
    elif isinstance(data, dict) and key in data:
        rows = data[key]
    else:
        detail = f"body: expected an object with {key!r}: a list of rows of {width} numbers"
        raise _reject(detail, _loc(None), "missing")
    if not isinstance(rows, list):
        raise _reject(f"{_name(key)}: expected a list of rows of {width} numbers", _loc(key), "list")
    if not rows:
        raise _reject(f"{_name(key)}: no rows; expected rows of {width} numbers", _loc(key), "empty")
    if max_rows is not None and len(rows) > max_rows:
        raise _too_many(key, max_rows)
    numbers_only = body.translate(None, _NUMERIC) == (b'"' + key.encode() + b'"' if key else b"").translate(
        None, _NUMERIC
    )
    if not numbers_only and not all(_is_number(v) for row in rows if isinstance(row, list) for v in row):
        raise _diagnose(rows, width, key)
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf: judged below
            x = np.asarray(rows, dtype=dt)
    except (ValueError, TypeError):  # ragged, or a row that is not a list
        raise _diagnose(rows, width, key) from None
    if x.ndim != 2 or x.shape[1] != width:
        raise _diagnose(rows, width, key)
    if not allow_nonfinite and not np.isfinite(x).all():
        i, j = (int(v) for v in np.argwhere(~np.isfinite(x))[0])
        given = rows[i][j]
        if isinstance(given, float) and not np.isfinite(given):
            why = f"{json.dumps(given)} is not allowed (non-finite)"
        else:
            why = f"{json.dumps(given)} overflows {dt}"
        detail = f"{_name(key, i, j)}: {why}"
        raise _reject(detail, _loc(key, i, j), "non_finite")
    return x


async def _read_counted(request: Request, max_bytes: int | None) -> bytes:
    # read_body without the Content-Length check (the guard's): the bytes as they come.
    if max_bytes is None:
        return await request.body()
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise RequestRejected(413, f"the body is over {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request, *, max_bytes: int | None = None) -> bytes:
    """The request's body, refused with 413 once it passes ``max_bytes`` (from ``Content-Length`` before reading)."""
    if max_bytes is None:
        return await request.body()
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise RequestRejected(413, f"the body is {int(declared)} bytes, at most {max_bytes}")
    return await _read_counted(request, max_bytes)


async def read_rows(
    request: Request,
    *,
    width: int,
    dtype: Any = np.float32,
    key: str | None = "inputs",
    limits: Limits | None = None,
    allow_nonfinite: bool = False,
    session: AsyncEagerSession | None = None,
    name: str | None = "inputs",
    offload: bool | None = None,
) -> Tensor:
    """The rows of ``request``'s JSON body as a ``(rows, width)`` tensor of ``dtype`` in the request session.

    ::

        @app.post("/predict")
        async def predict(request: Request) -> Response:
            x = await web.read_rows(request, width=64)        # float32[rows, 64]
            ...

    The body is read under ``limits`` (by default the route's or the service's, from
    :class:`~aiotensor.web.Sessions`), then parsed and checked by :func:`parse_rows`
    (see there for what is refused, always before anything is allocated in a session).
    A large body is parsed on the session's pool, as an op's kernel: the event loop
    serves other requests meanwhile, and the array never exists outside the session
    (cancelled while it is parsed, the request leaves nothing behind). A small one is
    parsed on the loop, where a hop to the pool would cost more than the parse
    (``offload`` decides instead, for one call). A refusal raises
    :class:`~aiotensor.web.RequestRejected`, answered 413 or 422 with an
    :data:`~aiotensor.web.ErrorBody` by the installed handlers.

    Args:
        request: A Starlette (or FastAPI) ``Request``.
        width: Values per row.
        dtype: A floating dtype.
        key: The key of the rows in the body's object, or ``None`` for a bare list.
        limits: ``max_bytes`` and ``max_rows`` for this call; ``None``: the route's
            limits from ``Sessions(route_limits=...)``, else ``Sessions(limits=...)``.
        allow_nonfinite: Accept NaN and infinities (the default refuses them, 422).
        session: The session that owns the tensor (default: :func:`~aiotensor.web.request_session`).
        name: The tensor's name.
        offload: ``True``: parse on the session's pool; ``False``: on the event loop;
            ``None`` (the default): on the pool when the parse's estimated cost (a few
            µs plus ~3.6 ns per byte of body) is above the session's
            ``inline_threshold_us``.
    """
    dt = _FLOAT32 if dtype is np.float32 else np.dtype(dtype)
    if dt.kind != "f":
        raise TypeError(f"read_rows: dtype must be a floating dtype, got {dt}")
    # The guard (BodyLimitMiddleware) checked the declared length against the route's
    # limits already: only the bytes as they come are counted here then.
    guarded = limits is None and LIMITS_KEY in request.scope
    if limits is None:
        limits = limits_for(request)
    body = await (
        _read_counted(request, limits.max_bytes) if guarded else read_body(request, max_bytes=limits.max_bytes)
    )
    s = session
    state = _request_of(request, "read_rows") if session is None else None
    if offload is None:
        # No busy band as for an op's kernel: measured under wrk on 2 cores, sending
        # 40 µs parses to the pool on a busy loop cost the web example a quarter of its
        # requests/s at 16 rows (the hop costs the loop ~16 µs, and the worker's time
        # competes for the same cores).
        est = PARSE_US + len(body) * PARSE_US_PER_BYTE
        # (the request sessions' config, without making one: a body refused on the loop opens none)
        config = state.sessions.request_config if state is not None else s.config if s is not None else None
        offload = est > (config or _DEFAULT_CONFIG).inline_threshold_us
    if offload:
        if s is None:
            assert state is not None
            s = state.open_session()
        options = {"width": width, "dtype": dt, "key": key, "max_rows": limits.max_rows}
        options["allow_nonfinite"] = allow_nonfinite
        try:
            rows: Tensor = await s._engine.op(_APPLY, (parse_rows, body), options, None, name)
        except KernelError as exc:
            if isinstance(exc.__cause__, RequestRejected):  # the refusal as the loop would raise it
                raise exc.__cause__ from None
            raise
        return rows
    x = parse_rows(body, width=width, dtype=dt, key=key, max_rows=limits.max_rows, allow_nonfinite=allow_nonfinite)
    if s is None:
        assert state is not None
        s = state.open_session()
    owned = s._engine.adopt(x, name)  # the fresh array itself, when the session can take it so
    return owned if owned is not None else await s.constant(x, name=name)
