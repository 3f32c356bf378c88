"""A tensor's or an array's values as a JSON response: :func:`rows_response`, the counterpart of ``read_rows``.

:func:`rows_json` is the pure part (an array in, JSON bytes out); :func:`rows_response`
fetches a tensor's value and answers with those bytes.

Why not a pydantic response model (``return ScoreResponse(scores=y.tolist())``)? The
usual FastAPI handler turns the array into Python floats, FastAPI validates them
against the model and serializes the model: for a 16x4 float32 result, most of the
~12 µs that path costs the event loop per request (measured in process, the
user-style service of ``benchmarks/profile_web.py``), where ``orjson`` writes the
array itself in ~2 µs. Nothing here is specific to aiotensor: a NumPy handler gains
the same from ``orjson.dumps(array, option=orjson.OPT_SERIALIZE_NUMPY)``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from starlette.responses import Response

from .._tensor import Tensor

__all__ = ["rows_json", "rows_response"]

_dumps_numpy: Callable[[Any], bytes] | None
try:
    import orjson
except ImportError:  # pragma: no cover - orjson comes with the web extra
    _dumps_numpy = None
else:
    _OPTION = orjson.OPT_SERIALIZE_NUMPY

    def _dumps_numpy(value: Any) -> bytes:
        return orjson.dumps(value, option=_OPTION)


#: The dtypes orjson writes from an array's memory (others go through ``tolist``): bool,
#: integers and floats up to 8 bytes (not ``longdouble``).
_ORJSON_KINDS = frozenset("fiub")
_ORJSON_MAX_ITEMSIZE = 8


def _finite_or_none(value: Any) -> Any:
    # What FastAPI's response path writes for NaN and infinities (pydantic's default): null.
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    if isinstance(value, np.floating):  # (``longdouble.tolist()`` keeps numpy scalars)
        value = float(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def rows_json(values: np.ndarray[Any, Any], *, key: str | None = "scores") -> bytes:
    """``values`` as JSON bytes: ``{"<key>": [[...], ...]}``, or the bare nested list with ``key=None``.

    Any shape (a 2-d array is a list of rows, a 1-d one a list, a 0-d one a number) of
    a float, integer or bool dtype. Written by ``orjson`` from the array's memory: a
    float32 value as the shortest text that reads back as the same float32 (``0.1``,
    not ``0.10000000149011612``). NaN and infinities are written as ``null``, as
    FastAPI writes them from a response model. Other dtypes go through ``tolist()``
    (a complex value is refused with ``TypeError``, as by the standard library).
    """
    array = np.asarray(values)
    dtype = array.dtype
    if (
        _dumps_numpy is not None
        and array.ndim
        and dtype.kind in _ORJSON_KINDS
        and dtype.itemsize <= _ORJSON_MAX_ITEMSIZE
    ):
        if not dtype.isnative:  # (orjson reads native byte order only)
            array = array.astype(dtype.newbyteorder("="))
        if not array.flags.c_contiguous:  # (and C-ordered memory only)
            array = np.ascontiguousarray(array)
        return _dumps_numpy(array if key is None else {key: array})
    # A 0-d array, another dtype, or no orjson: Python values, written as JSON is.
    plain = _finite_or_none(array.tolist())
    text = json.dumps(plain if key is None else {key: plain}, allow_nan=False, separators=(",", ":"))
    return text.encode()


async def rows_response(
    values: Tensor | np.ndarray[Any, Any],
    *,
    key: str | None = "scores",
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """A JSON response of ``values`` (a tensor, fetched, or an array): ``{"<key>": [[...], ...]}``.

    ::

        @app.post("/predict")
        async def predict(request: Request) -> Response:
            x = await web.read_rows(request, width=32)        # {"inputs": [[...], ...]}
            ...
            return await web.rows_response(scores)            # {"scores": [[...], ...]}

    The body is :func:`rows_json`'s (see there for dtypes, float32 text and non-finite
    values), the media type ``application/json``. The response is the data: the tensor
    may be freed (its request session closed) once this returns. FastAPI sends a
    returned ``Response`` as it is: a ``response_model`` (for the API's schema) is not
    applied to it.

    Args:
        values: A tensor (any session's: its value is fetched, ``await t.numpy()``) or
            an ndarray.
        key: The key of the values in the body's object, or ``None`` for the bare list.
        status_code: The response's status.
        headers: More response headers.
    """
    if type(values) is Tensor:
        array = values._engine.fetch_now(values)  # (what ``numpy()`` does first, without its coroutine)
        if array is None:
            array = await values.numpy()
    elif isinstance(values, np.ndarray):
        array = values
    else:
        raise TypeError(f"rows_response: expected a Tensor or an ndarray, got {type(values).__name__}")
    return Response(rows_json(array, key=key), status_code, headers, "application/json")
