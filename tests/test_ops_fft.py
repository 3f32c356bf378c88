"""The ``fft`` extension's ops against ``array_api_strict.fft`` (the standard's reference) and numpy.

Every transform on each dtype the standard allows (precision kept: complex64 in,
complex64 out), ``n``/``s`` cropping and padding, ``axis``/``axes``, the three ``norm``
modes, stacked and empty inputs, and the dtypes the reference refuses.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import array_api_strict as xps
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aiotensor as at

from ._opcheck import Tolerance, assert_invalid, assert_same, check_op, running_session

_rng = np.random.default_rng(14)
ONE_D = ["fft", "ifft", "rfft", "irfft", "hfft", "ihfft"]
N_D = ["fftn", "ifftn", "rfftn", "irfftn"]
REAL_INPUT = {"rfft", "ihfft", "rfftn"}
NORMS = ["backward", "ortho", "forward"]


def strict(name: str) -> Callable[..., Any]:
    """``array_api_strict.fft.<name>`` on numpy arrays, giving a numpy array."""
    fn = getattr(xps.fft, name)

    def ref(*args: Any, **kwargs: Any) -> Any:
        conv = [xps.asarray(a) if isinstance(a, np.ndarray) else a for a in args]
        if kwargs.get("dtype") is not None:
            kwargs = {**kwargs, "dtype": getattr(xps, np.dtype(kwargs["dtype"]).name)}
        return np.asarray(fn(*conv, **kwargs)._array)

    ref.__name__ = f"array_api_strict.fft.{name}"
    return ref


def signal(*shape: int, dtype: Any) -> np.ndarray:
    """Normal values, complex for complex dtypes."""
    x = _rng.normal(size=shape)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * _rng.normal(size=shape)
    return np.asarray(x).astype(dtype)


def tol(dtype: Any) -> Tolerance:
    """Tolerances for a transform of this input dtype."""
    single = np.dtype(dtype) in (np.float32, np.complex64)
    return {"rtol": 1e-4, "atol": 1e-4} if single else {"rtol": 1e-10, "atol": 1e-10}


def dtypes(name: str) -> list[Any]:
    """The input dtypes the standard allows for this transform."""
    return [np.float32, np.float64] if name in REAL_INPUT else [np.complex64, np.complex128]


@pytest.fixture
async def sc() -> AsyncIterator[at.AsyncEagerSession]:
    """A session that frees nothing before close, so allocation counts are exact."""
    async with at.AsyncEagerSession(cleanup=at.ResourceCleanupStrategy.ON_SESSION_CLOSE) as session:
        yield session


@pytest.mark.parametrize("name", ONE_D)
async def test_one_dimensional_transforms(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for dt in dtypes(name):
        x = signal(3, 8, dtype=dt)
        for norm in NORMS:
            await check_op(s, name, ref, x, norm=norm, **tol(dt))
        for n in (1, 5, 8, 13):
            await check_op(s, name, ref, x, n=n, **tol(dt))
        await check_op(s, name, ref, x, axis=0, **tol(dt))
        await check_op(s, name, ref, x, axis=-2, n=4, norm="ortho", **tol(dt))
        await check_op(s, name, ref, signal(2, 3, 4, dtype=dt), axis=1, **tol(dt))  # a stack
        await check_op(s, name, ref, signal(7, dtype=dt), **tol(dt))
    wrong = signal(4, dtype=np.complex128 if name in REAL_INPUT else np.float64)
    await check_op(s, name, ref, wrong)  # the dtype the standard refuses
    await check_op(s, name, ref, np.arange(4))  # integers
    await check_op(s, name, ref, signal(4, dtype=dtypes(name)[1]), axis=1)  # axis out of range


@pytest.mark.parametrize("name", N_D)
async def test_n_dimensional_transforms(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for dt in dtypes(name):
        x = signal(2, 4, 6, dtype=dt)
        for norm in NORMS:
            await check_op(s, name, ref, x, norm=norm, **tol(dt))
        await check_op(s, name, ref, x, axes=(0, 2), **tol(dt))
        await check_op(s, name, ref, x, axes=[-1], **tol(dt))
        await check_op(s, name, ref, x, s=(3, 8), axes=(1, 2), **tol(dt))
        await check_op(s, name, ref, x, s=[2, 5, 4], axes=[0, 1, 2], norm="forward", **tol(dt))
        await check_op(s, name, ref, signal(5, dtype=dt), **tol(dt))
    wrong = signal(2, 2, dtype=np.complex128 if name in REAL_INPUT else np.float64)
    await check_op(s, name, ref, wrong)


async def test_s_minus_one_and_s_without_axes(s: at.AsyncEagerSession) -> None:
    x = signal(3, 4, 6, dtype=np.complex128)
    # -1 keeps the input's size along that axis (irfftn's last axis: 2 * (m - 1))
    await check_op(s, "fftn", lambda a, **k: np.fft.fftn(a, s=(4, 7), axes=(1, 2)), x, s=(-1, 7), axes=(1, 2))
    await check_op(s, "irfftn", lambda a, **k: np.fft.irfftn(a, s=(4, 10), axes=(1, 2)), x, s=(-1, -1), axes=(1, 2))
    # s alone transforms the last len(s) axes (numpy's behaviour, without its deprecation warning)
    await check_op(s, "fftn", lambda a, **k: np.fft.fftn(a, s=(2, 3), axes=(1, 2)), x, s=(2, 3))


async def test_round_trips(s: at.AsyncEagerSession) -> None:
    x = signal(4, 10, dtype=np.float32)
    back = await (await s.irfft(await s.rfft(x), n=10)).numpy()
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-5)
    c = signal(3, 4, dtype=np.complex64)
    back_c = await (await s.ifftn(await s.fftn(c))).numpy()
    assert back_c.dtype == np.complex64
    np.testing.assert_allclose(back_c, c, rtol=1e-5, atol=1e-5)


async def test_empty_and_zero_length(s: at.AsyncEagerSession) -> None:
    await check_op(s, "fft", strict("fft"), np.zeros((0, 4), np.complex128), rtol=0)  # an empty stack
    await check_op(s, "fft", strict("fft"), np.zeros((3, 0), np.complex128))  # zero-length transform: refused


@pytest.mark.parametrize("name", ["fftfreq", "rfftfreq"])
async def test_frequencies(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for n in (1, 2, 7, 8):
        for d in (1.0, 0.25, 3):
            await check_op(s, name, ref, n, d=d, rtol=1e-15)
        await check_op(s, name, ref, n, dtype=np.float32, rtol=1e-7)
    numpy_ref = getattr(np.fft, name)
    await check_op(
        s, name, lambda n, device: numpy_ref(n), 4, device="cpu", rtol=0
    )  # the reference's devices are its own
    bads: list[dict[str, Any]] = [{"dtype": np.int64}, {"dtype": np.complex64}]
    for bad in bads:
        with pytest.raises(at.InvalidArgumentError, match="real floating-point"):
            await getattr(s, name)(4, **bad)
    with pytest.raises(at.InvalidArgumentError, match="at least 1"):
        await getattr(s, name)(0)
    with pytest.raises(at.InvalidDeviceError, match="device"):
        await getattr(s, name)(4, device="not a device!")


@pytest.mark.parametrize("name", ["fftshift", "ifftshift"])
async def test_shifts(s: at.AsyncEagerSession, name: str) -> None:
    ref = strict(name)
    for dt in (np.float32, np.float64, np.complex64):
        x = signal(3, 5, 4, dtype=dt)
        for axes in (None, 0, -1, (0, 2), [1]):
            await check_op(s, name, ref, x, axes=axes, exact=True)
    await check_op(s, name, ref, np.arange(5))  # integers: refused, as the reference
    await check_op(s, name, ref, np.zeros(0), exact=True)


async def test_bad_arguments(sc: at.AsyncEagerSession) -> None:
    x = await sc.constant(signal(4, dtype=np.complex128))
    await assert_invalid(sc, lambda: sc.fft(x, norm="none"), "fft", "norm must be")
    await assert_invalid(sc, lambda: sc.ifft(x, n=0), "ifft", "at least 1")
    await assert_invalid(sc, lambda: sc.hfft(x, n=2.5), "hfft", "n must be an int")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.fftn(x, s=4), "fftn", "sequence of ints")  # type: ignore[arg-type]
    await assert_invalid(sc, lambda: sc.fftn(x, s=(0,)), "fftn", "at least 1")
    await assert_invalid(sc, lambda: sc.ifftn(x, s=(2, 2), axes=(0,)), "ifftn", "same length")
    await assert_invalid(sc, lambda: sc.fft(np.asarray(1j)), "fft", "0-d")
    await assert_invalid(sc, lambda: sc.rfft(x), "rfft", "real floating-point")


#: One or two rows per new op for the parity matrix: (op, args, kwargs, reference).
PARITY_CASES: list[tuple[str, tuple[Any, ...], dict[str, Any], Callable[..., Any]]] = [
    ("fft", (signal(2, 8, dtype=np.complex64),), {}, strict("fft")),
    ("fft", (signal(5, dtype=np.complex128),), {"n": 8, "norm": "ortho"}, strict("fft")),
    ("ifft", (signal(2, 6, dtype=np.complex128),), {"axis": 0}, strict("ifft")),
    ("fftn", (signal(2, 3, 4, dtype=np.complex128),), {"axes": (1, 2)}, strict("fftn")),
    ("ifftn", (signal(3, 4, dtype=np.complex64),), {"norm": "forward"}, strict("ifftn")),
    ("rfft", (signal(3, 8, dtype=np.float32),), {}, strict("rfft")),
    ("irfft", (signal(3, 5, dtype=np.complex128),), {"n": 8}, strict("irfft")),
    ("rfftn", (signal(4, 6, dtype=np.float64),), {}, strict("rfftn")),
    ("irfftn", (signal(4, 4, dtype=np.complex128),), {"s": (4, 6), "axes": (0, 1)}, strict("irfftn")),
    ("hfft", (signal(5, dtype=np.complex128),), {}, strict("hfft")),
    ("ihfft", (signal(8, dtype=np.float64),), {"norm": "ortho"}, strict("ihfft")),
    ("fftfreq", (8,), {"d": 0.5}, strict("fftfreq")),
    ("rfftfreq", (9,), {"dtype": np.float32}, strict("rfftfreq")),
    ("fftshift", (signal(3, 4, dtype=np.float64),), {}, strict("fftshift")),
    ("ifftshift", (signal(3, 5, dtype=np.float32),), {"axes": 1}, strict("ifftshift")),
]


# -- differential: hypothesis-drawn inputs against array_api_strict ---------------------------------


@pytest.fixture(scope="module")
def runner() -> Iterator[tuple[asyncio.Runner, at.AsyncEagerSession]]:
    """One event loop and session for every hypothesis example of the module."""
    with running_session() as pair:
        yield pair


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_differential_against_array_api_strict(runner: Any, data: Any) -> None:
    loop, session = runner
    name = data.draw(st.sampled_from([*ONE_D, *N_D, "fftshift", "ifftshift"]), label="op")
    dt = data.draw(st.sampled_from([np.float32, np.float64, np.complex64, np.complex128, np.int32]), label="dtype")
    shape = tuple(data.draw(st.lists(st.integers(0, 5), min_size=0, max_size=3), label="shape"))
    x = signal(*shape, dtype=dt) if np.dtype(dt).kind != "i" else np.asarray(_rng.integers(-3, 4, size=shape))
    kwargs: dict[str, Any] = {}
    nd = len(shape)
    if name in ONE_D:
        kwargs["n"] = data.draw(st.one_of(st.none(), st.integers(1, 9)), label="n")
        kwargs["axis"] = data.draw(st.integers(-max(nd, 1) - 1, max(nd, 1)), label="axis")
        kwargs["norm"] = data.draw(st.sampled_from(NORMS), label="norm")
    elif name in N_D:
        if nd and data.draw(st.booleans(), label="axes given"):
            axes = data.draw(st.lists(st.integers(-nd, nd - 1), min_size=1, max_size=nd, unique=True), label="axes")
            kwargs["axes"] = axes
            if data.draw(st.booleans(), label="s given"):
                kwargs["s"] = [data.draw(st.integers(1, 6)) for _ in axes]
        kwargs["norm"] = data.draw(st.sampled_from(NORMS), label="norm")
    else:
        kwargs["axes"] = data.draw(st.one_of(st.none(), st.integers(-max(nd, 1), max(nd, 1) - 1)), label="axes")
    try:
        with np.errstate(all="ignore"):
            want = strict(name)(x, **kwargs)
    except (TypeError, ValueError, IndexError):
        with pytest.raises(at.InvalidArgumentError, match=name):
            loop.run(getattr(session, name)(x, **kwargs))
        return
    with np.errstate(all="ignore"):
        got = loop.run(loop.run(getattr(session, name)(x, **kwargs)).numpy())
    assert_same(got, want, name, exact=False, **tol(dt if np.dtype(dt).kind != "i" else np.float64))
