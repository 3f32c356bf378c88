"""Runs as one compiled loop (``_blocked_jit``): bit for bit numpy's op-by-op values and warnings.

Few distinct loops (each compile takes ~0.1-0.3 s): the same expressions are shared
across tests, and a loop is kept per source and dtype for the whole process.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._expr import Expr
from aiotensor._opdef import OPS
from aiotensor._programs import _blocked_jit, _blocked_layout, _blocked_run, _compile
from tests._results import outcome

pytest.importorskip("numba")

FLOATS = ["float32", "float64"]
SHAPE = (48, 64)  # every pair of the specials below, tiled


def _run(name: str, *args: Any) -> Expr:
    return Expr(OPS[name], args, None, None)


def _values(dtype: str, seed: int, specials: bool) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    # x and y. Finite ones (the loop's result is kept): random values, ±0, subnormals and
    # products that underflow; x >= 0 (a square root). With specials (the loop's result
    # is dropped: not finite): every pair of NaN, ±inf, ±0, huge (overflow), tiny, and
    # zeros (division by zero).
    dt = np.dtype(dtype)
    info = np.finfo(dt)
    rng = np.random.default_rng(seed)
    n = SHAPE[0] * SHAPE[1]
    x = (rng.standard_normal(n) * 4).astype(dt)
    y = (rng.standard_normal(n) * 4).astype(dt)
    if not specials:
        x = abs(x)
        x[::13] = -0.0
        x[::17] = info.smallest_subnormal
        y[::19] = 1e-30 if dtype == "float32" else 1e-300  # (products underflow, quotients stay finite)
        y[::23] = -0.0
        y[y == 0] = 1.0 if dtype == "float32" else 1.5
        return x.reshape(SHAPE), y.reshape(SHAPE)
    values = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, info.max, -info.max / 3, info.tiny, 1.5, -2.0], dt)
    pairs = len(values) ** 2
    x[:pairs] = np.repeat(values, len(values))
    y[:pairs] = np.tile(values, len(values))
    x[pairs::17] = info.smallest_subnormal
    y[pairs::5] = 0.0
    return x.reshape(SHAPE), y.reshape(SHAPE)


#: Expressions of x and y covering every op of the loop's list, and numpy's op-by-op values.
EXPRESSIONS: dict[str, tuple[Callable[[Any, Any], Expr], Callable[[Any, Any], Any]]] = {
    "add negative multiply": (
        lambda x, y: _run("multiply", _run("negative", _run("add", x, y)), y),
        lambda x, y: np.multiply(np.negative(np.add(x, y)), y),
    ),
    "subtract absolute divide": (
        lambda x, y: _run("divide", _run("abs", _run("subtract", x, y)), y),
        lambda x, y: np.divide(np.abs(np.subtract(x, y)), y),
    ),
    "positive sqrt square subtract": (
        lambda x, y: _run("subtract", _run("positive", _run("sqrt", x)), _run("square", y)),
        lambda x, y: np.subtract(np.positive(np.sqrt(x)), np.square(y)),
    ),
    "Python ints": (
        lambda x, y: (x * 3 - 2) / 7 + y * -5,
        lambda x, y: (x * 3 - 2) / 7 + y * -5,
    ),
    "the chain, Python constants": (
        lambda x, y: abs(((x * 2.0 + 1.0) - 0.5) * x / 3.0 + y) * 0.1 - x + 1.0,
        lambda x, y: abs(((x * 2.0 + 1.0) - 0.5) * x / 3.0 + y) * 0.1 - x + 1.0,
    ),
}


@pytest.fixture(autouse=True)
def small_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Runs from 256 items (so that small arrays take the blocked path), loops compiled at their first run
    (not on a thread of their own); no program cached across tests."""
    monkeypatch.setattr(_blocked_run, "MIN_ITEMS", 256)
    monkeypatch.setattr(_blocked_jit, "BACKGROUND", False)
    _compile._CACHE.clear()
    yield
    _compile._CACHE.clear()


@pytest.fixture
def compiled(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each layout run took the compiled loop (False: the interpreter's path)."""
    seen: list[bool] = []
    real = _blocked_layout.Layout._compiled

    def spy(self: Any, inputs: Any, out: Any, flagged: Any) -> bool:
        took = real(self, inputs, out, flagged)
        seen.append(took)
        return took

    monkeypatch.setattr(_blocked_layout.Layout, "_compiled", spy)
    return seen


@pytest.fixture
def loops(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the compiled loops asked for (past the checks of the error state and the arrays)."""
    seen: list[int] = []
    real = _blocked_jit.kernel

    def kernel(p: Any) -> Any:
        seen.append(1)
        return real(p)

    monkeypatch.setattr(_blocked_jit, "kernel", kernel)
    return seen


def _bits(a: Any) -> Any:
    a = np.ascontiguousarray(a)
    return a.view({4: np.int32, 8: np.int64, 2: np.int16}[a.dtype.itemsize])


def _same(got: Any, want: Any) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert np.array_equal(_bits(got), _bits(want)), np.flatnonzero(_bits(got) != _bits(want))[:10]


@pytest.mark.parametrize("specials", [False, True], ids=["finite", "specials"])
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("case", list(EXPRESSIONS))
async def test_every_op_matches_numpy_bit_for_bit(
    s: at.AsyncEagerSession, compiled: list[bool], dtype: str, case: str, specials: bool
) -> None:
    xv, yv = _values(dtype, 1, specials)
    x, y = await s.constant(xv), await s.constant(yv)
    make, reference = EXPRESSIONS[case]
    with np.errstate(all="ignore"):
        got = await make(x, y).eval()
        want = reference(xv, yv)
    _same(got, want)
    # (not finite: the loop ran, its result dropped, the interpreter's path computed it)
    assert compiled == [not specials]


async def test_finite_values_take_the_loop_under_numpys_default_errstate(
    s: at.AsyncEagerSession, compiled: list[bool]
) -> None:
    xv, yv = _values("float32", 2, False)
    make, reference = EXPRESSIONS["the chain, Python constants"]
    got = await make(await s.constant(xv), await s.constant(yv)).eval()
    _same(got, reference(xv, yv))
    assert compiled == [True]


@pytest.mark.parametrize("shape", [SHAPE, (400, 300)])  # (inline; on the pool)
@pytest.mark.parametrize(
    "state",
    [
        {},
        {"over": "warn"},
        {"over": "raise"},
        {"all": "raise"},
        {"over": "ignore"},
        {"under": "warn"},
        {"all": "ignore"},
    ],
)
async def test_warnings_and_errors_are_numpys(
    s: at.AsyncEagerSession,
    monkeypatch: pytest.MonkeyPatch,
    loops: list[int],
    shape: tuple[int, ...],
    state: dict[str, str],
) -> None:
    # A chain that overflows (x * 2.0 of huge values), divides by zero (1/0 → inf, then
    # inf - inf: invalid) and underflows: the same outcome with the loop on and off.
    info = np.finfo(np.float32)
    xv = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
    xv.flat[::97] = info.max
    xv.flat[5::101] = 0.0
    xv.flat[7::89] = info.tiny
    x = await s.constant(xv)

    def make() -> Expr:
        return (x * 2.0 + 1.0) / x * 0.001 - x

    with np.errstate(**state):  # type: ignore[arg-type]
        on = await outcome(make, ordered=False)
        monkeypatch.setattr(_blocked_layout, "JIT", False)
        off = await outcome(make, ordered=False)
    assert on == off
    # The loop ran when underflow is ignored; its result (not finite) was dropped.
    assert loops == ([1] if state.get("under", state.get("all", "ignore")) == "ignore" else [])


@pytest.mark.parametrize(
    ("label", "make"),
    [
        ("a row vector", lambda f, x, y, r, d, i: (x - r) * 2.0 + 1.0),
        ("mixed dtypes", lambda f, x, y, r, d, i: (x + d) * 2.0 - 1.0),
        ("exp", lambda f, x, y, r, d, i: f("exp", x * 0.5) + 1.0),
        ("integers", lambda f, x, y, r, d, i: (i + 3) * i - 1),
        ("a comparison", lambda f, x, y, r, d, i: f("less", x * 2.0, y) * 1.0),
        ("maximum", lambda f, x, y, r, d, i: f("maximum", x * 2.0, y) + 1.0),
        ("an int float32 does not hold", lambda f, x, y, r, d, i: x * 16777217 + 1.0),
    ],
)
async def test_runs_not_eligible_take_the_interpreters_path(
    s: at.AsyncEagerSession, layouts_run: list[Any], compiled: list[bool], label: str, make: Callable[..., Expr]
) -> None:
    xv, yv = _values("float32", 4, False)
    args = [xv, yv, yv[0], xv.astype(np.float64), (xv * 10).astype(np.int32)]
    tensors = [await s.constant(a) for a in args]
    with np.errstate(all="ignore"):
        got = await make(_run, *tensors).eval()
        want = make(lambda name, *a: getattr(np, name)(*a), *args)
    _same(np.asarray(got), np.asarray(want))
    assert layouts_run
    assert all(layout.jit is None for layout in layouts_run), label
    assert compiled == []


async def test_non_contiguous_inputs_take_the_interpreters_path(s: at.AsyncEagerSession, compiled: list[bool]) -> None:
    xv, yv = _values("float32", 5, False)
    x, y = await s.constant(xv), await s.constant(yv)
    make, reference = EXPRESSIONS["add negative multiply"]
    with np.errstate(all="ignore"):
        got = await make(x[:, ::2], y[:, 1::2]).eval()
        want = reference(xv[:, ::2], yv[:, 1::2])
    _same(got, want)
    assert compiled == [False]


async def test_off_gives_the_same_values(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, compiled: list[bool]
) -> None:
    xv, yv = _values("float64", 6, False)
    x, y = await s.constant(xv), await s.constant(yv)
    make, _ = EXPRESSIONS["the chain, Python constants"]
    with np.errstate(all="ignore"):
        on = await make(x, y).eval()
        monkeypatch.setattr(_blocked_layout, "JIT", False)
        off = await make(x, y).eval()
    _same(on, off)
    assert compiled == [True]


async def test_without_numba_the_interpreters_path(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, compiled: list[bool]
) -> None:
    real = importlib.import_module

    def no_numba(name: str, package: str | None = None) -> Any:
        if name == "numba":
            raise ImportError("no numba here")
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", no_numba)
    monkeypatch.setattr(_blocked_jit, "_numba", None)
    monkeypatch.setattr(_blocked_jit, "_KERNELS", {})
    xv, yv = _values("float32", 7, False)
    make, reference = EXPRESSIONS["subtract absolute divide"]
    with np.errstate(all="ignore"):
        got = await make(await s.constant(xv), await s.constant(yv)).eval()
        want = reference(xv, yv)
    _same(got, want)
    assert compiled == [False]
    assert _blocked_jit._numba is False


async def test_a_loop_is_compiled_once_per_run_and_dtype(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, compiled: list[bool]
) -> None:
    made: list[Any] = []
    real = _blocked_jit._compile

    def count(p: Any) -> Any:
        made.append(p.dtype)
        return real(p)

    monkeypatch.setattr(_blocked_jit, "_KERNELS", {})
    monkeypatch.setattr(_blocked_jit, "_compile", count)
    make, reference = EXPRESSIONS["the chain, Python constants"]
    with np.errstate(all="ignore"):
        for dtype, shape in [("float32", SHAPE), ("float32", SHAPE), ("float32", (30, 40)), ("float64", SHAPE)]:
            xv = np.random.default_rng(8).standard_normal(shape).astype(dtype)
            x = await s.constant(xv)
            _same(await make(x, x).eval(), reference(xv, xv))
            _compile._CACHE.clear()  # (a new program: the loop is still the one kept)
    assert made == [np.dtype(np.float32), np.dtype(np.float64)]
    assert compiled == [True] * 4


def test_the_loop_source_and_its_version() -> None:
    # The loop reads every input before it writes the result's element (it may be one of them).
    f = np.float32
    p = _blocked_jit.plan(
        [np.multiply, np.add],
        [(0, 4), (2, 1)],  # (x0 * c) + x1: inputs 0 and 1, the ops' values 2 and 3, the typed constant 4
        2,
        0,
        [np.dtype(f)] * 4,
        [None, None, None, None, np.array(2.0, f)],
        True,
    )
    assert p is not None
    assert p.const_slots == [4]
    body = p.source.splitlines()
    assert body.index("        a1 = x1[j]") < body.index("        t0 = a0 * c0") < body.index("        out[j] = t1")
    version = _blocked_jit.available()
    assert version is None or version[0].isdigit()


async def test_on_the_event_loop_a_loop_compiles_on_a_thread_of_its_own(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, compiled: list[bool]
) -> None:
    # An inline run (on the loop's thread) does not hold the loop while numba compiles:
    # the interpreter computes it meanwhile; once the loop is made, runs take it.
    monkeypatch.setattr(_blocked_jit, "BACKGROUND", True)
    monkeypatch.setattr(_blocked_jit, "_KERNELS", {})
    xv, yv = _values("float64", 9, False)
    x, y = await s.constant(xv), await s.constant(yv)
    make, reference = EXPRESSIONS["positive sqrt square subtract"]
    _same(await make(x, y).eval(), reference(xv, yv))
    threads = list(_blocked_jit._PENDING.values())  # (empty if it finished already)
    assert all(t.name == "aiotensor-jit-compile" for t in threads)
    for t in threads:
        t.join()
    assert not _blocked_jit._PENDING
    _same(await make(x, y).eval(), reference(xv, yv))
    assert compiled == [False, True]


@pytest.mark.parametrize("state", [{}, {"over": "raise"}, {"all": "ignore"}])
async def test_an_overflow_hidden_by_a_division_is_numpys(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, state: dict[str, str]
) -> None:
    # ``y * y`` overflows to inf and ``x / inf`` is a finite 0: the loop checks its divisors
    # as well as its result, so numpy's overflow warning (or error) still comes.
    xv, yv = _values("float32", 10, False)
    yv[abs(yv) < 1e-10] = 1.0  # (no square underflowing to 0: no division by zero)
    yv.flat[::31] = np.finfo(np.float32).max
    x, y = await s.constant(xv), await s.constant(yv)

    def make() -> Expr:
        return (x + 1.0) / (y * y)

    with np.errstate(**state):  # type: ignore[arg-type]
        on = await outcome(make, ordered=False)
        monkeypatch.setattr(_blocked_layout, "JIT", False)
        off = await outcome(make, ordered=False)
    assert on == off
    assert (on[0], len(on[-1])) == {"over": ("error", 0), "all": ("ok", 0)}.get(next(iter(state), ""), ("ok", 1))
