"""Blocked runs (``_blocked``, ``_blocked_run``, ``_blocked_var``, ``_blocked_center``): bit for bit the op-by-op path.

Each expression is evaluated twice in one session, once with blocking on (block and
threshold sizes lowered, so that small arrays take many blocks and a ragged last
one) and once with it off (the op-by-op program), and the two outcomes compared: the
result's dtype, shape and bytes, or the error's type and message, and the warnings.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

import aiotensor as at
from aiotensor._expr import Expr
from aiotensor._opdef import OPS
from aiotensor._programs import (
    _blocked_center,
    _blocked_jit,
    _blocked_layout,
    _blocked_run,
    _blocked_split,
    _blocked_var,
    _blocked_whole,
    _compile,
)
from tests._results import outcome

UNARY = sorted(n for n, d in OPS.items() if d.ufunc and d.data == 1)
BINARY = sorted(n for n, d in OPS.items() if d.ufunc and d.data == 2)
DTYPES = ["bool", "int8", "uint8", "int32", "int64", "float16", "float32", "float64", "complex128"]


@pytest.fixture(autouse=True)
def interpreted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs through the interpreter's blocks, not one compiled loop (``_blocked_jit``), unless ``blocking`` says so."""
    monkeypatch.setattr(_blocked_layout, "JIT", False)


@pytest.fixture(params=["blocks", "one block", "compiled"])
def blocking(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Callable[[bool], None]]:
    """Turn blocked runs on (runs from 256 items, in blocks of 96, in one block, or eligible runs
    as one compiled loop: ``_blocked_jit``) or off; no program cached across."""
    monkeypatch.setattr(_blocked_layout, "JIT", request.param == "compiled")
    monkeypatch.setattr(_blocked_jit, "BACKGROUND", False)  # (compiled at the first run, not meanwhile)

    def switch(on: bool) -> None:
        monkeypatch.setattr(_blocked_run, "MIN_ITEMS", 256 if on else 1 << 62)
        monkeypatch.setattr(_blocked_run, "BLOCK_ITEMS", 96)
        monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 256 if request.param == "blocks" else 1 << 62)
        monkeypatch.setattr(_blocked_var, "MIN_ITEMS", 256)
        monkeypatch.setattr(_blocked_var, "BLOCK_ITEMS", 96)
        _compile._CACHE.clear()

    yield switch
    _compile._CACHE.clear()


def _values(dtype: str, shape: tuple[int, ...], seed: int) -> np.ndarray[Any, Any]:
    # Values with the awkward cases of each kind: zeros (division), extremes (overflow),
    # NaN, infinities and negatives (invalid) for floats.
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    dt = np.dtype(dtype)
    if dt.kind == "b":
        flat = rng.integers(0, 2, n).astype(bool)
    elif dt.kind in "iu":
        info = np.iinfo(dt)
        flat = rng.integers(max(info.min, -200), min(info.max, 200), n, endpoint=True).astype(dt)
        flat[::7] = 0
        flat[3::11] = info.max
        flat[5::13] = info.min
    else:
        flat = (rng.standard_normal(n) * 4).astype(dt)
        if dt.kind == "c":
            flat = flat + 1j * rng.standard_normal(n).astype(dt)
        specials = np.array([0.0, -0.0, np.nan, np.inf, -np.inf, 6e4, -3.5], dtype=dt)
        flat[: min(n, 7)] = specials[: min(n, 7)]
        flat[::9] = 0
    return flat.reshape(shape)


async def _both(blocking: Callable[[bool], None], make: Callable[..., Expr]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    blocking(True)
    blocked = await outcome(make)
    blocking(False)
    plain = await outcome(make)
    return blocked, plain


def _reduce(name: str, x: Any, **kwargs: Any) -> Expr:
    return Expr(OPS[name], *OPS[name].spec(x, **kwargs))


def _run(name: str, *args: Any) -> Expr:
    return Expr(OPS[name], args, None, None)


@pytest.mark.parametrize("dtype", DTYPES)
async def test_every_op_and_dtype_agrees_bit_for_bit(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], layouts_run: list[Any], dtype: str
) -> None:
    x = await s.constant(_values(dtype, (37, 29), 1))
    others = {
        "same shape": await s.constant(_values(dtype, (37, 29), 2)),
        "row": await s.constant(_values(dtype, (29,), 3)),
        "column": await s.constant(_values(dtype, (37, 1), 4)),
        "0-d": await s.constant(_values(dtype, (), 5)),
    }
    with np.errstate(all="ignore"):
        for name in UNARY:
            for label, y in others.items():
                blocked, plain = await _both(blocking, lambda n=name, y=y: _run(n, _run("add", x, y)))
                assert blocked == plain, (name, dtype, label)
            blocked, plain = await _both(blocking, lambda n=name: _run(n, _run(n, x)))
            assert blocked == plain, (name, dtype)
        for name in BINARY:
            for label, y in others.items():
                blocked, plain = await _both(blocking, lambda n=name, y=y: _run(n, _run(n, x, y), y))
                assert blocked == plain, (name, dtype, label)
                blocked, plain = await _both(blocking, lambda n=name, y=y: _run(n, 2.5, _run(n, y, _run(n, x, 3))))
                assert blocked == plain, (name, dtype, label, "python scalars")
    assert layouts_run  # the blocked path ran (and gave the op-by-op values)


@pytest.mark.parametrize(
    ("xdtype", "ydtype"),
    [("int8", "float32"), ("uint8", "int64"), ("float16", "float64"), ("bool", "int32"), ("int32", "float32")],
)
async def test_mixed_dtypes_promote_as_op_by_op(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], layouts_run: list[Any], xdtype: str, ydtype: str
) -> None:
    x = await s.constant(_values(xdtype, (40, 30), 6))
    y = await s.constant(_values(ydtype, (30,), 7))
    with np.errstate(all="ignore"):
        for make in (
            lambda: (x * 3 + y) * 0.5 - x,
            lambda: (x + 1) / (y - 2) + x * 100,
            lambda: _run("maximum", x * 2, y) ** 2,
        ):
            blocked, plain = await _both(blocking, make)
            assert blocked == plain
    assert layouts_run


@pytest.mark.parametrize("shape", [(1001,), (37, 29), (5, 7, 11), (0, 29), (), (1, 500), (500, 1)])
async def test_shapes_not_multiples_of_the_block_and_degenerate_ones(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], shape: tuple[int, ...]
) -> None:
    x = await s.constant(_values("float32", shape, 8))
    row = await s.constant(_values("float32", shape[-1:], 9))
    col = await s.constant(_values("float32", (*shape[:1], *([1] * (len(shape) - 1))), 10))
    with np.errstate(all="ignore"):
        for make in (
            lambda: ((x * 2.0 + 1.0) * x - 3.0) / 2.0,
            lambda: (x - row) * col + 1.5,
            lambda: abs(x * row) + col * 2,
        ):
            blocked, plain = await _both(blocking, make)
            assert blocked == plain
            assert blocked[0] == "ok"


async def test_values_every_block_reads_whole_are_copied_over_a_block_with_the_same_values(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch, layouts_run: list[Any]
) -> None:
    # A row vector and a hoisted op's value (``row * 2.0``) read by every block are copied
    # once over a block's shape (``Layout.tiled``); a column is sliced with the rows; a
    # value its readers broadcast to two block shapes, or of one element, is read as it
    # is. Tail blocks too.
    layouts = layouts_run
    x = await s.constant(_values("float32", (37, 29), 30))
    x3 = await s.constant(_values("float32", (37, 5, 29), 31))
    row = await s.constant(_values("float32", (29,), 32))
    col = await s.constant(_values("float32", (37, 1), 33))
    col3 = await s.constant(_values("float32", (37, 1, 1), 34))
    one = await s.constant(np.full((1, 1), 1.5, np.float32))
    cases: list[tuple[Callable[[], Expr], int]] = [
        (lambda: (x - row) / (row * 2.0 + 1e-3) + col, 2),  # the row and the hoisted value
        (lambda: (x3 * row) + (col3 * row), 0),  # the row read at (h, 5, 29) and (h, 1, 29)
        (lambda: (x - one) * row, 1),  # one element: numpy's loop reads it as a scalar already
        (lambda: (x * 2.0 + 1.0) * x, 0),  # nothing read whole
    ]
    with np.errstate(all="ignore"):
        for make, tiled in cases:
            layouts.clear()
            blocked, plain = await _both(blocking, make)
            assert blocked == plain
            assert blocked[0] == "ok"
            assert layouts
            blocks = layouts[0].whole is None
            assert len(layouts[0].tiled) == (tiled if blocks else 0)


def test_a_one_block_result_is_asked_again_when_it_is_not_32_byte_aligned() -> None:
    # malloc's chunk 16 bytes off a 32-byte boundary: the second one, if aligned, is the
    # result (a plain array of its own); if not, the first is.
    raw = np.empty((1 << 16) * 4 + 64, np.uint8)
    base = -raw.ctypes.data % 64
    misaligned = raw[base + 16 : base + 16 + (1 << 18)].view(np.float32).reshape(256, 256)
    aligned = _blocked_var.aligned_empty((256, 256), np.dtype(np.float32))
    given: list[Any] = []

    def empty(answers: list[Any]) -> Callable[..., Any]:
        def make(shape: tuple[int, ...], dtype: Any) -> Any:
            given.append((shape, dtype))
            return answers.pop(0)

        return make

    f32 = np.dtype(np.float32)
    assert _blocked_whole.aligned_result((256, 256), f32, empty([misaligned, aligned])) is aligned
    assert _blocked_whole.aligned_result((256, 256), f32, empty([misaligned, misaligned[:]])) is misaligned
    assert _blocked_whole.aligned_result((256, 256), f32, empty([aligned])) is aligned
    assert given == [((256, 256), f32)] * 5
    small = np.empty(100, np.float32)
    assert _blocked_whole.aligned_result((100,), f32, empty([small])) is small  # (too small to matter)
    got = _blocked_whole.aligned_result((256, 256), f32)
    assert got.base is None
    assert got.shape == (256, 256)
    assert got.dtype == f32


def test_a_one_block_result_is_asked_up_to_four_times_holding_the_misaligned_chunks() -> None:
    # malloc's bins may hold several chunks 16 bytes off: each is held while the next is
    # asked for, so the third or fourth can be the aligned one; none in four: the first.
    raw = np.empty((1 << 16) * 4 + 64, np.uint8)
    base = -raw.ctypes.data % 64
    off = [raw[base + 16 : base + 16 + (1 << 18)].view(np.float32).reshape(256, 256) for _ in range(8)]
    aligned = _blocked_var.aligned_empty((256, 256), np.dtype(np.float32))
    held: list[int] = []

    def empty(answers: list[Any]) -> Callable[..., Any]:
        def make(shape: tuple[int, ...], dtype: Any) -> Any:
            held.append(len(answers))
            return answers.pop(0)

        return make

    f32 = np.dtype(np.float32)
    tries = _blocked_whole.RESULT_TRIES
    assert tries == 4
    assert _blocked_whole.aligned_result((256, 256), f32, empty([*off[:3], aligned]), tries) is aligned
    assert len(held) == 4
    assert _blocked_whole.aligned_result((256, 256), f32, empty(off[3:7]), tries) is off[3]
    assert len(held) == 8


async def test_a_one_block_run_asks_for_its_result_with_result_tries(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    real = _blocked_whole.aligned_result

    def spy(shape: tuple[int, ...], dtype: np.dtype[Any], tries: int = 2) -> Any:
        asked.append(tries)
        return real(shape, dtype, tries=tries)

    monkeypatch.setattr(_blocked_layout, "aligned_result", spy)
    value = np.random.default_rng(1).standard_normal((256, 256)).astype(np.float32)
    x = await s.constant(value)
    got = await ((x * 2.0 + 1.0) * x - 0.5)
    assert asked == [_blocked_whole.RESULT_TRIES]
    np.testing.assert_array_equal(await got.numpy(), (value * 2.0 + 1.0) * value - 0.5)
    del x, got


async def test_non_contiguous_inputs(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], layouts_run: list[Any]
) -> None:
    x = await s.constant(_values("float64", (40, 60), 11))
    with np.errstate(all="ignore"):
        for make in (
            lambda: (x.T * 2.0 + 1.0) * x.T,  # a transposed view read by the run
            lambda: (x[:, ::3] - 1.0) * x[:, 1::3],  # strided slices
            lambda: _run("exp", x[::2].T) + x[1::2].T / 3.0,
        ):
            blocked, plain = await _both(blocking, make)
            assert blocked == plain
            assert blocked[0] == "ok"
    assert layouts_run


async def test_the_standardization_keeps_numpy_values(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], layouts_run: list[Any]
) -> None:
    v = _values("float32", (300, 17), 12)
    x = await s.constant(v)
    blocked, plain = await _both(blocking, lambda: (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8))
    assert blocked == plain
    with np.errstate(all="ignore"):
        want = (v - v.mean(axis=0)) / (v.std(axis=0) + 1e-8)
    assert blocked[3] == want.tobytes()
    assert layouts_run


@pytest.fixture
def centered(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Per fused run of a mean, a variance and a run (``_blocked_center``): whether its two passes ran."""
    seen: list[bool] = []
    real = _blocked_center.CenteredRun._fused

    def fused(self: Any, x: Any) -> Any:
        found = real(self, x)
        seen.append(found is not None)
        return found

    monkeypatch.setattr(_blocked_center.CenteredRun, "_fused", fused)
    return seen


def _centered_cases(x: Any, y: Any) -> list[tuple[Callable[[], Expr], bool]]:
    # (expression, fused into one step): the run reads x - mean(x) once, mean and
    # variance read by the run alone, and nothing full-size before the deviations' reader.
    return [
        (lambda: (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8), True),
        (lambda: (x - x.mean(axis=0, keepdims=True)) / x.std(axis=0, keepdims=True), True),
        (lambda: (x - x.mean(axis=0)) * (1.0 / _reduce("var", x, axis=0, correction=1)), True),
        (lambda: ((x - x.mean(axis=0)) / x.std(axis=0)) * 2.0 + x.mean(axis=0), True),  # the mean read again
        (lambda: (1.0 / x.std(axis=0)) * (x - x.mean(axis=0)), True),  # the subtraction first in the program
        (lambda: ((x - x.mean(axis=0)) / x.std(axis=0)) * (x - x.mean(axis=0)), False),  # deviations read twice
        (lambda: (y * 2.0 + (x - x.mean(axis=0))) / x.std(axis=0), False),  # a full-size op before
        (lambda: (x - x.mean(axis=0)) / x.std(axis=0) + x.mean(axis=0).sum(), False),  # mean read outside
        (lambda: (x - x.mean(axis=1, keepdims=True)) / x.std(axis=0), False),  # another axis
    ]


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
@pytest.mark.parametrize("shape", [(300, 17), (301, 5, 7)])
async def test_a_run_fused_with_its_mean_and_variance_keeps_numpy_values(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], centered: list[bool], dtype: str, shape: tuple[int, ...]
) -> None:
    from aiotensor._engine._expressions import _is_tensor

    v = np.random.default_rng(23).standard_normal(shape).astype(dtype) * 30 + 5
    x = await s.constant(v)
    y = await s.constant(v[::-1].copy())
    for make, fuses in _centered_cases(x, y):
        centered.clear()
        with np.errstate(all="ignore"):
            blocked, plain = await _both(blocking, make)
        assert blocked == plain
        assert blocked[0] == "ok"
        # Two passes for float32 and float64 (else numpy's calls in the fused step).
        assert centered == ([dtype in ("float32", "float64")] if fuses else [])
        blocking(True)
        e = make()
        program, _, _ = _compile.compiled(e, _is_tensor, "numpy", Expr)
        names = [type(st[0].kernel).__name__ for st in program.steps]
        assert ("CenteredRun" in names) == fuses, names
        with np.errstate(all="ignore"):
            await e
    with np.errstate(all="ignore"):
        want = (v - v.mean(axis=0)) / (v.std(axis=0) + 1e-8)
    assert (await _both(blocking, _centered_cases(x, y)[0][0]))[0][3] == want.tobytes()


async def test_a_fused_standardization_of_awkward_inputs_is_op_by_op(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], centered: list[bool]
) -> None:
    # NaN and infinities, a constant column (0 / 0 where the run divides by its std),
    # a transposed view: numpy's values and warnings, under every errstate mode.
    v = _values("float32", (300, 17), 24)
    v[:, 3] = 2.5
    flat = _values("float32", (300, 17), 25)
    flat[:, 5] = -1.0
    for value in (v, flat, np.ascontiguousarray(flat.T).T):
        x = await s.constant(value)
        for mode in ("warn", "raise", "ignore"):
            with np.errstate(all=mode):
                blocked, plain = await _both(blocking, lambda x=x: (x - x.mean(axis=0)) / x.std(axis=0))
            assert blocked == plain, mode
    assert False in centered
    # One row: the mean and variance (keepdims) have the rows' shape, so the run's ops
    # before the one reading the deviations are not hoisted: nothing may write over them.
    x = await s.constant(np.linspace(-2.0, 3.0, 300, dtype=np.float32).reshape(1, 300))

    def one_row() -> Expr:
        m = x.mean(axis=0, keepdims=True)
        return (m * 2.0 + (x - m)) / (x.std(axis=0, keepdims=True) + 1.0)

    blocked, plain = await _both(blocking, one_row)
    assert blocked == plain
    assert blocked[0] == "ok"


async def test_a_fused_standardization_on_the_pool_writes_over_its_deviations(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, centered: list[bool], layouts_run: list[Any]
) -> None:
    monkeypatch.setattr(_blocked_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 0)
    monkeypatch.setattr(_blocked_split, "_PART_BYTES", 1 << 12)
    _compile._CACHE.clear()
    v = np.random.default_rng(26).standard_normal((600, 301)).astype(np.float32)
    x = await s.constant(v)
    for _ in range(3):  # (the second run's deviations go into the first one's recycled buffer)
        got = await ((x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8)).eval()
        assert got.tobytes() == ((v - v.mean(axis=0)) / (v.std(axis=0) + 1e-8)).tobytes()
    assert centered == [True] * 3
    assert layouts_run


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
async def test_a_trailing_reduction_over_the_last_axis_keeps_numpy_values(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], layouts_run: list[Any], dtype: str
) -> None:
    # Joined to the run and reduced block by block when each row's reduction is numpy's
    # (the last axis: pairwise sums along each row); numpy's call on the run's result
    # otherwise (other dtypes for sum and mean, other axes, 1-d results).
    from aiotensor._engine._expressions import _is_tensor

    v = _values(dtype, (97, 3, 301), 21)
    x = await s.constant(v)
    row = await s.constant(_values(dtype, (301,), 22))
    flat = await s.constant(v.reshape(-1))
    with np.errstate(all="ignore"):
        for name in ("sum", "mean", "max", "min"):
            for kwargs in ({"axis": -1}, {"axis": 2, "keepdims": True}, {"axis": 0}, {"axis": (1,)}):
                make = lambda n=name, kw=kwargs: _reduce(n, (x - row) * 0.5 + x, **kw) * 1  # noqa: E731
                blocked, plain = await _both(blocking, make)
                assert blocked == plain, (name, kwargs)
            blocked, plain = await _both(blocking, lambda n=name: _reduce(n, flat * 2 + flat, axis=-1))
            assert blocked == plain
    blocking(True)
    e = _reduce("sum", x * 2.0 + row, axis=-1)
    program, _, _ = _compile.compiled(e, _is_tensor, "numpy", Expr)
    assert [st[0].name for st in program.steps] == ["blocked"]  # the sum is part of the run
    with np.errstate(all="ignore"):
        await e
    if dtype in ("float32", "float64"):
        assert layouts_run


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
async def test_var_and_std_over_axis_0_keep_numpy_values(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocked_calls: list[int] = []
    real = _blocked_var.BlockedVar._blocked

    def spy(self: Any, *args: Any) -> Any:
        blocked_calls.append(1)
        return real(self, *args)

    monkeypatch.setattr(_blocked_var.BlockedVar, "_blocked", spy)
    # Blocked for float32 and float64 (the running sum continues numpy's row order);
    # numpy's own call for the rest, for other axes and for too few rows.
    v = np.random.default_rng(19).standard_normal((301, 5, 7)).astype(dtype) * 50 + 7
    x = await s.constant(v)
    for make in (
        lambda: x.std(axis=0) + 0.0,
        lambda: x.var(axis=0, keepdims=True) * 1.0,
        lambda: _reduce("std", x, axis=0, correction=1) * 1.0,
        lambda: x.var(axis=(0, 1)) * 1.0,
        lambda: x.std(axis=1) * 1.0,
        lambda: x.var() * 1.0,
        lambda: _reduce("var", x[:1], axis=0, correction=1) * 1.0,  # no degrees of freedom: numpy's warning
    ):
        with np.errstate(all="ignore"):
            blocked, plain = await _both(blocking, make)
        assert blocked == plain
        assert blocked[0] == "ok", blocked
    with np.errstate(all="ignore"):
        want = np.std(v, axis=0) + 0.0
    assert (await _both(blocking, lambda: x.std(axis=0) + 0.0))[0][3] == want.tobytes()
    assert bool(blocked_calls) == (dtype in ("float32", "float64"))


async def test_var_overflow_warns_as_numpy(s: at.AsyncEagerSession, blocking: Callable[[bool], None]) -> None:
    v = np.full((300, 4), 3e38, np.float32)
    v[::2] *= -1  # a mean near 0, squared deviations past float32's range
    x = await s.constant(v)
    blocked, plain = await _both(blocking, lambda: x.var(axis=0) * 1.0)
    assert blocked == plain
    assert any("overflow" in str(message) for _, message in blocked[-1])


async def test_a_trailing_sum_that_overflows_warns_as_numpy(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None]
) -> None:
    x = await s.constant(np.full((300, 4), 3e38, np.float32))
    blocked, plain = await _both(blocking, lambda: _reduce("sum", x * 1.0 + 0.0, axis=-1))
    assert blocked == plain
    assert any("overflow" in str(message) for _, message in blocked[-1])


@pytest.mark.parametrize("mode", ["warn", "raise", "ignore", "call"])
async def test_warnings_and_errors_follow_errstate_as_op_by_op(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], mode: str
) -> None:
    f = await s.constant(_values("float32", (40, 30), 13))
    i = await s.constant(_values("int32", (40, 30), 14))
    calls: list[str] = []
    handler: dict[str, Any] = {"call": lambda kind, flag: calls.append(kind)} if mode == "call" else {}
    with np.errstate(all=mode, **handler):  # type: ignore[arg-type]
        for make in (
            lambda: (f / 0.0) + 1.0,  # divide by zero (and invalid: 0 / 0)
            lambda: _run("sqrt", f - 10.0) * 2.0,  # invalid
            lambda: (f * 1e38) * 10.0,  # overflow
            lambda: (i // 0) + 1,  # integer division by zero
            lambda: (i * 100000) * 100000 + 1,  # integer overflow wraps, silently
        ):
            calls.clear()
            blocking(True)
            blocked = await outcome(make)
            blocked_calls = list(calls)
            calls.clear()
            blocking(False)
            plain = await outcome(make)
            assert blocked == plain  # the same result or error, and the same warnings in the same order
            assert blocked_calls == calls  # errstate's callback called as often, with the same kinds


async def test_a_one_block_run_in_place_names_the_op_that_failed_without_running_again(
    s: at.AsyncEagerSession, blocking: Callable[[bool], None], monkeypatch: pytest.MonkeyPatch, layouts_run: list[Any]
) -> None:
    # A one-block run of ufuncs writing in place into its result (``Layout.in_place``:
    # the output given by position; not with maximum, whose positional output numpy
    # deprecates) computes numpy's values and maps an op's error itself, as op by op
    # would name it; blocks rerun op by op for it. (The interpreter's paths: a compiled
    # loop, ``_blocked_jit``, drops a result that is not finite and reruns op by op.)
    blocking(True)
    monkeypatch.setattr(_blocked_layout, "JIT", False)
    x = await s.constant(np.linspace(1.0, 3.0, 1200, dtype=np.float32).reshape(40, 30))
    reran: list[int] = []
    layouts = layouts_run
    real_op_by_op = _blocked_run.BlockedRun.op_by_op

    def op_by_op(self: Any, inputs: Any) -> Any:
        reran.append(1)
        return real_op_by_op(self, inputs)

    monkeypatch.setattr(_blocked_run.BlockedRun, "op_by_op", op_by_op)
    v = s._engine.peek(x)
    got = await (await (abs(x * 2.0 - 1.0) + x)).numpy()
    np.testing.assert_array_equal(got, abs(v * np.float32(2.0) - np.float32(1.0)) + v)
    assert (layouts[-1].in_place is not None) == (layouts[-1].whole is not None)
    got = await (await (_run("maximum", x * 2.0, 0.5) + x)).numpy()  # (maximum: out by keyword, not in place)
    np.testing.assert_array_equal(got, np.maximum(v * np.float32(2.0), np.float32(0.5)) + v)
    assert layouts[-1].in_place is None
    with np.errstate(divide="raise"), pytest.raises(at.InvalidArgumentError, match=r"divide\(float32\[40, 30\]"):
        await ((x * 2.0) / 0.0 + 1.0)
    in_place = layouts[-1].in_place is not None
    assert in_place == (layouts[-1].whole is not None)
    assert reran == ([] if in_place else [1])


async def test_the_blocked_program_pickles(s: at.AsyncEagerSession, blocking: Callable[[bool], None]) -> None:
    from aiotensor._engine._expressions import _is_tensor

    blocking(True)
    x = await s.constant(np.linspace(-3.0, 3.0, 900).reshape(30, 30))
    e = (x * 2.0 + 1.0) / 3.0 - x
    program, _, _ = _compile.compiled(e, _is_tensor, "numpy", Expr)
    assert [st[0].name for st in program.steps] == ["blocked"]
    again = pickle.loads(pickle.dumps(program))
    arr = s._engine.peek(x)
    assert again(arr).tobytes() == program.fresh()(arr).tobytes()
    await e  # (evaluated: no warning)
    e = x.std(axis=0) + 1.0
    program, _, _ = _compile.compiled(e, _is_tensor, "numpy", Expr)
    assert type(program.steps[0][0]).__name__ == "_VarOp"
    again = pickle.loads(pickle.dumps(program))
    assert again(arr).tobytes() == program.fresh()(arr).tobytes() == (np.std(arr, axis=0) + 1.0).tobytes()
    await e
    e = (x - x.mean(axis=0)) / (x.std(axis=0) + 1e-8)
    program, _, _ = _compile.compiled(e, _is_tensor, "numpy", Expr)
    assert type(program.steps[0][0].kernel).__name__ == "CenteredRun"
    again = pickle.loads(pickle.dumps(program))
    want = (arr - arr.mean(axis=0)) / (arr.std(axis=0) + 1e-8)
    assert again(arr).tobytes() == program.fresh()(arr).tobytes() == want.tobytes()
    await e


async def test_large_runs_split_over_the_pool_with_the_same_values(
    s: at.AsyncEagerSession, monkeypatch: pytest.MonkeyPatch, layouts_run: list[Any]
) -> None:
    split: list[int] = []
    real = _blocked_split._aligned

    def aligned(rows: int, parts: int, h: int) -> Any:
        split.append(parts)
        return real(rows, parts, h)

    monkeypatch.setattr(_blocked_split, "_aligned", aligned)
    monkeypatch.setattr(_blocked_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 0)
    monkeypatch.setattr(_blocked_split, "_PART_BYTES", 1 << 12)
    _compile._CACHE.clear()
    v = np.random.default_rng(16).standard_normal((600, 301))
    x = await s.constant(v)
    row = await s.constant(v[0] + 1)
    got = await (((x * 2.0 + 1.0) * x - row) / 3.0 + x).eval()
    with np.errstate(all="ignore"):
        want = ((v * 2.0 + 1.0) * v - (v[0] + 1)) / 3.0 + v
    assert got.tobytes() == want.tobytes()
    assert layouts_run
    assert split  # shared out between the workers
    # The other workers' threads record the flags the caller does not ignore, not their own errstate's.
    again: list[int] = []
    real_op_by_op = _blocked_run.BlockedRun.op_by_op

    def op_by_op(self: Any, inputs: Any) -> Any:
        again.append(1)
        return real_op_by_op(self, inputs)

    monkeypatch.setattr(_blocked_run.BlockedRun, "op_by_op", op_by_op)
    split.clear()
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0.0)) as pooled:  # on the pool
        y = await pooled.constant(v)
        with np.errstate(divide="ignore"):
            got = await ((y * 2.0) / 0.0 + 1.0).eval()
            want = (v * 2.0) / 0.0 + 1.0
        del y
    assert got.tobytes() == want.tobytes()
    assert split
    assert not again  # no flag recorded: no op-by-op rerun


@pytest.fixture
def split_small(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """Blocked runs on the pool split, in blocks of 96 items alone and 288 split; records split runs' (rows, h)."""
    seen: list[tuple[int, int]] = []
    real = _blocked_split.in_parts

    def in_parts(part: Any, rows: int, h: int, *args: Any) -> None:
        seen.append((rows, h))
        real(part, rows, h, *args)

    monkeypatch.setattr(_blocked_layout, "in_parts", in_parts)
    monkeypatch.setattr(_blocked_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(_blocked_split, "core_free", lambda: True)  # (tall blocks: see the rule's own test)
    monkeypatch.setattr(_blocked_split, "SPLIT_BLOCK_ITEMS", 288)
    monkeypatch.setattr(_blocked_split, "_PART_BYTES", 1 << 10)
    monkeypatch.setattr(_blocked_run, "MIN_ITEMS", 256)
    monkeypatch.setattr(_blocked_run, "BLOCK_ITEMS", 96)
    monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 0)
    _compile._CACHE.clear()
    yield seen
    _compile._CACHE.clear()


@pytest.mark.parametrize("free", [True, False], ids=["core free", "core busy"])
async def test_split_runs_walk_taller_blocks_with_the_op_by_op_values(
    split_small: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch, free: bool
) -> None:
    # Split runs walk blocks of SPLIT_BLOCK_ITEMS (here 288 items: 3x one thread's 96),
    # tail blocks included, with rows and columns broadcast, values read whole copied
    # over the taller blocks, non-contiguous inputs and a trailing reduction; with no
    # core free, in one thread's blocks (96 items).
    monkeypatch.setattr(_blocked_split, "core_free", lambda: free)
    h = 12 if free else 4
    rng = np.random.default_rng(40)
    v = rng.standard_normal((101, 24)).astype(np.float32)
    w = rng.standard_normal((24, 203)).astype(np.float32)  # its transpose: a non-contiguous (203, 24)
    row, col = rng.standard_normal(24).astype(np.float32), rng.standard_normal((101, 1)).astype(np.float32)
    v3 = rng.standard_normal((53, 3, 8))
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0.0)) as s:  # on the pool
        x, wt, r, c, x3 = [await s.constant(a) for a in (v, w, row, col, v3)]
        cases: list[tuple[Callable[[], Any], Any, int]] = [
            (
                lambda: ((x * 2.0 + 1.0) * x - r) / (r * 3.0 + 0.5) + c,
                ((v * 2.0 + 1.0) * v - row) / (row * 3.0 + 0.5) + col,
                101,
            ),
            (lambda: (wt.T - 1.5) * wt.T + abs(wt.T), (w.T - 1.5) * w.T + abs(w.T), 203),
            (lambda: x[::2] * 3.0 - x[1::2][:50].sum(), None, 51),
            (lambda: (x3 * 2.0 - 1.0) * x3, (v3 * 2.0 - 1.0) * v3, 53),
            (lambda: ((x - r) * 2.0).sum(axis=-1), ((v - row) * 2.0).sum(axis=-1), 101),
        ]
        with np.errstate(all="ignore"):
            for make, want, rows in cases:
                split_small.clear()
                value = await make().eval()
                if want is None:
                    want = v[::2] * 3.0 - v[1::2][:50].sum()
                assert value.dtype == want.dtype
                assert value.tobytes() == np.ascontiguousarray(want).tobytes()
                assert split_small, "not split"
                assert split_small[0] == (rows, h)  # 288 items of 24 a row: taller than one thread's 4 rows
                assert rows % h  # and a short last block


def test_a_participant_keeps_its_copies_from_part_to_part_and_restores_them_after_a_short_block() -> None:
    # Layout._rows with a participant's ``kept`` setup: its second call (a whole block
    # after a short one) reads the row vector's copy whole again.
    from aiotensor._programs._blocked_run import BlockedRun

    ops = ((OPS["subtract"], (0, 1)), (OPS["multiply"], (3, 2)))
    run = BlockedRun(ops, 2, (2.0,))
    rng = np.random.default_rng(41)
    x, row = rng.standard_normal((10, 8)), rng.standard_normal(8)
    layout = _blocked_layout.Layout(
        run, [x.shape, row.shape], [True, False], x.shape, 4, [x.dtype, row.dtype, x.dtype, x.dtype]
    )
    assert layout.tiled  # the row is copied over a block
    vals = [*layout.template]
    vals[:2] = [x, row]
    out = np.empty_like(x)
    kept: list[Any] = []
    layout._rows(vals, out, 8, 10, kept)  # a short block first
    layout._rows(vals, out, 0, 8, kept)
    layout._rows(vals, out, 8, 10, kept)
    assert out.tobytes() == ((x - row) * 2.0).tobytes()


async def test_a_split_run_keeps_no_scratch_after_it_returns(
    split_small: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each participant's scratch and copies live from its first part to the run's end.
    made: list[Any] = []
    real = _blocked_var.aligned_empty

    def aligned_empty(shape: Any, dtype: Any) -> Any:
        block = real(shape, dtype)
        made.append(weakref.ref(block))
        return block

    monkeypatch.setattr(_blocked_layout, "aligned_empty", aligned_empty)
    v = np.random.default_rng(42).standard_normal((301, 24))
    row = v[0] + 1
    async with at.AsyncEagerSession(config=at.SessionConfig(inline_threshold_us=0.0)) as s:
        x, r = await s.constant(v), await s.constant(row)
        got = await (((x * 2.0 + 1.0) * x - r) / 3.0).eval()
    assert got.tobytes() == (((v * 2.0 + 1.0) * v - row) / 3.0).tobytes()
    assert split_small
    assert made
    assert all(ref() is None for ref in made)


def test_runs_from_the_lower_threshold_split_only_while_a_core_is_free_and_then_in_tall_blocks(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    pool = (lambda fn: None, 2)
    token = _blocked_split._POOL.set(pool)
    try:
        free = [True]
        monkeypatch.setattr(_blocked_split, "core_free", lambda: free[0])
        low, high = _blocked_split.SPLIT_IDLE_MIN_BYTES, _blocked_split.SPLIT_MIN_BYTES
        assert low < high
        assert _blocked_split.split_pool(low - 1) is None
        assert _blocked_split.split_pool(low) == (pool, True)  # in the split's tall blocks
        assert _blocked_split.split_pool(high) == (pool, True)
        free[0] = False  # the other core busy: only from SPLIT_MIN_BYTES, in one thread's blocks
        assert _blocked_split.split_pool(low) is None
        assert _blocked_split.split_pool(high - 1) is None
        assert _blocked_split.split_pool(high) == (pool, False)
        tier = _blocked_split.IDLE_TIER.set(False)  # (the standardization's run): only from SPLIT_MIN_BYTES
        free[0] = True
        assert _blocked_split.split_pool(high - 1) is None
        assert _blocked_split.split_pool(high) == (pool, True)
        _blocked_split.IDLE_TIER.reset(tier)
        _blocked_split._POOL.set((pool[0], 1))  # one worker: never
        assert _blocked_split.split_pool(high) is None
    finally:
        _blocked_split._POOL.reset(token)
    assert _blocked_split.split_pool(high) is None  # no pool at hand (the loop's thread)
    monkeypatch.undo()
    # core_free reads the runnable threads of /proc/loadavg against the cores.
    monkeypatch.setattr(_blocked_split, "_CORES", 2)
    found = {}
    for text in ("0.52 0.58 0.59 1/123 4567\n", "3.10 2.01 1.00 2/130 4570\n", "5.0 4.0 3.0 7/130 1\n", "garbage"):
        path = tmp_path / "loadavg"
        path.write_text(text)
        fd = os.open(path, os.O_RDONLY)
        try:
            monkeypatch.setattr(_blocked_split, "_LOADAVG", [fd])
            found[text.split()[3] if len(text.split()) > 3 else text] = _blocked_split.core_free()
        finally:
            os.close(fd)
    assert found == {"1/123": True, "2/130": False, "7/130": False, "garbage": False}
    monkeypatch.setattr(_blocked_split, "_LOADAVG", [None])  # not Linux: not known to be free
    assert not _blocked_split.core_free()


@pytest.mark.parametrize("helper", ["never starts", "starts at once", "spawn fails", "starts late"])
def test_a_split_run_waits_a_bounded_time_for_its_helper_and_does_every_part_once(helper: str) -> None:
    done: list[tuple[str, int, int]] = []
    late: list[threading.Thread] = []

    def part(lo: int, hi: int) -> None:
        done.append((threading.current_thread().name, lo, hi))

    def spawn(fn: Callable[[], None]) -> None:
        if helper == "starts at once":
            fn()
        elif helper == "spawn fails":
            raise RuntimeError("cannot schedule new futures after shutdown")
        elif helper == "starts late":  # after the wait: finds what the caller left
            t = threading.Timer(0.01, fn)
            t.start()
            late.append(t)

    _blocked_split.in_parts(part, 100, 8, 800, (spawn, 2), wait=0.001)
    for t in late:
        t.join()
    parts = sorted((lo, hi) for _, lo, hi in done)
    assert parts == [(0, 32), (32, 56), (56, 80), (80, 100)]  # each once, whole 8-row blocks


async def test_cancelling_a_split_run_leaks_nothing(
    strategy: at.ResourceCleanupStrategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    started, release = threading.Event(), threading.Event()
    real = _blocked_layout.Layout._rows

    def rows(self: Any, *args: Any) -> None:
        started.set()
        release.wait(5.0)
        real(self, *args)

    monkeypatch.setattr(_blocked_layout.Layout, "_rows", rows)
    monkeypatch.setattr(_blocked_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 0)
    _compile._CACHE.clear()
    v = np.random.default_rng(17).standard_normal((2048, 1024)).astype(np.float32)  # runs on the pool
    async with at.AsyncEagerSession(cleanup=strategy) as s:
        x = await s.constant(v)
        before = s.stats()
        task = asyncio.create_task(_awaited(((x * 2.0 + 1.0) * x - 3.0) / 2.0))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with asyncio.timeout(5.0):  # the kernel ends; its result is adopted as dropped
            while s.stats().in_flight:
                await asyncio.sleep(0.005)
        if strategy is at.ResourceCleanupStrategy.IN_BACKGROUND:
            async with asyncio.timeout(5.0):
                while s.stats().live_bytes != before.live_bytes:
                    await asyncio.sleep(0.005)
        got = await (((x * 2.0 + 1.0) * x - 3.0) / 2.0).eval()  # and the next run is whole
        assert got.tobytes() == (((v * 2.0 + 1.0) * v - 3.0) / 2.0).tobytes()
        del x
    after = s.stats()
    assert (after.live_tensors, after.live_bytes, after.pending) == (0, 0, 0)
    assert after.allocated == after.freed


async def _awaited(e: Expr) -> Any:
    return await e


async def test_a_run_whose_intermediates_would_not_fit_the_memory_limit_runs_blocked(
    blocking: Callable[[bool], None],
) -> None:
    v = np.random.default_rng(18).standard_normal((128, 128))  # 128 KiB
    config = at.SessionConfig(memory_limit=int(v.nbytes * 2.5))
    for on in (True, False):
        async with at.AsyncEagerSession(config=config) as s:
            x = await s.constant(v)
            blocking(on)
            e = (x * 2.0) * (x + 1.0) - (x * 3.0)
            if on:
                got = await e.eval()
                assert got.tobytes() == ((v * 2.0) * (v + 1.0) - (v * 3.0)).tobytes()
            else:  # op by op, two full-size intermediates and the result do not fit
                with pytest.raises(at.ResourceExhaustedError):
                    await e
            del x


def test_the_measured_constants_are_in_aiotensor_info() -> None:
    from aiotensor._cli import collect_info

    info = collect_info()
    assert info["blocked"] == _blocked_run.settings()
    assert info["blocked"]["block_items"] == _blocked_run.BLOCK_ITEMS


def test_a_run_called_again_with_another_shape_or_dtype_takes_that_ones_layout() -> None:
    # A run keeps the last layout it used for one input array (a formula evaluated in a
    # loop skips its memo's key): an input of another shape, dtype or kind is not given it.
    run = _blocked_run.BlockedRun(((OPS["multiply"], (0, 1)), (OPS["add"], (2, 0))), 1, (2.0,))
    rng = np.random.default_rng(5)
    inputs: list[Any] = [
        rng.standard_normal((256, 256)).astype(np.float32),
        rng.standard_normal((256, 256)),  # float64
        rng.standard_normal((200, 256)).astype(np.float32),
        rng.standard_normal((256, 256)).astype(np.float32).T,  # the same shape, not contiguous
        np.float32(1.5),  # not an array
    ]
    for x in [*inputs, *inputs[::-1], inputs[0], inputs[0]]:
        got = run(np, x)
        want = x * 2.0 + x
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_an_in_place_absolute_is_numpys_bit_for_bit(dtype: str) -> None:
    # A one-block run in place computes a float's ``absolute`` of the result as its sign
    # bits cleared (faster than numpy's loop there): the same bits as numpy's, NaN
    # payloads and signed zeros included, and no floating-point flag (errors raised here).
    # An ``absolute`` of an input (not in place) is numpy's own.
    ints = np.dtype(dtype.replace("float", "int"))
    rng = np.random.default_rng(7)
    x = rng.standard_normal((256, 256)).astype(dtype)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, -1e-40, 1.5], dtype)
    x.flat[: len(special)] = special
    nan = 0xFFC00123 if dtype == "float32" else 0xFFF8000000000123  # a quiet NaN, sign set, with a payload
    x.view(ints.str.replace("i", "u")).flat[8] = nan
    sub, mul, add, absolute = OPS["subtract"], OPS["multiply"], OPS["add"], OPS["abs"]
    in_place = _blocked_run.BlockedRun(((sub, (0, 1)), (absolute, (3,)), (mul, (4, 2))), 1, (0.5, 2.0))
    of_input = _blocked_run.BlockedRun(((absolute, (0,)), (add, (2, 1))), 1, (1.0,))
    with np.errstate(all="raise"):
        for run, by_bits in ((in_place, True), (of_input, False)):
            got = run(np, x)
            want = run.op_by_op((x,))
            assert got.dtype == want.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(got.view(ints), want.view(ints))
            assert run._last is not None
            assert (run._last[2].bits is not None) is by_bits
    assert np.isnan(in_place(np, x).flat[8])


def test_an_in_place_run_names_the_op_that_raised_after_its_absolute() -> None:
    # The in-place run is one function of straight-line calls: the op that raised is
    # found from its line, after the absolute done on the result's bits as before it.
    x = np.linspace(1.0, 3.0, 256 * 256, dtype=np.float32).reshape(256, 256)
    sub, div, mul, absolute = OPS["subtract"], OPS["divide"], OPS["multiply"], OPS["abs"]
    run = _blocked_run.BlockedRun(((sub, (0, 1)), (absolute, (4,)), (div, (5, 2)), (mul, (6, 3))), 1, (0.5, 0.0, 2.0))
    with np.errstate(divide="raise"), pytest.raises(at.InvalidArgumentError, match=r"^divide\(float32\[256, 256\]"):
        run(np, x)
    assert run._last is not None
    assert run._last[2].bits is not None  # (the absolute was done on the bits)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(run(np, x), run.op_by_op((x,)))
