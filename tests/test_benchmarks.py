"""The benchmark harness keeps working: tiny configurations of a few scenarios, and the page it writes.

Behaviour only (the numbers are not checked: timings have no place in tests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console

import aiotensor as at
from benchmarks import bench_dispatch, bench_memory, bench_overheads
from benchmarks._harness import Report, Stat, run_on
from benchmarks._report import markdown, plot

pytestmark = pytest.mark.slow


def test_dispatch_scenario_measures_every_variant() -> None:
    results = run_on("asyncio", bench_dispatch._one_size(16, rounds=1, budget=0.0005))
    for label in (bench_dispatch.NUMPY, bench_dispatch.AUTO, bench_dispatch.POOL, bench_dispatch.TO_THREAD):
        assert results[label].median > 0


def test_seeds_loop_and_drop_latency() -> None:
    peak, live = run_on("asyncio", bench_memory.seeds_loop(at.ResourceCleanupStrategy.ON_SESSION_CLOSE, 2, 3, 16))
    assert len(live) == 3
    assert live == sorted(live)  # nothing is freed before close: live bytes only grow
    assert peak == live[-1]
    samples = run_on("asyncio", bench_memory.drop_to_free_us(3))
    assert len(samples) == 3


def test_fused_scenario_and_the_page(tmp_path: Path) -> None:
    results = run_on("asyncio", bench_overheads._fused(rounds=1, budget=0.0005))
    assert f"fused function of {bench_overheads.CHAIN} ops" in results
    report = Report(quick=True, rounds=1)
    t = report.table("a table", "µs", ratio_label="x base")
    t.add("base", Stat((1.0, 2.0, 3.0)), 1.0)
    report.target(1, "a target", "1.0x", True)
    report.series["memory"] = {"IN_BACKGROUND": [(1.0, 10.0), (2.0, 12.0)]}
    images = plot(report, tmp_path / "img")
    assert images == ["perf_memory.png"]
    assert (tmp_path / "img" / "perf_memory.png").stat().st_size > 0
    page = markdown(report, "python -m benchmarks --quick", images, "Some commentary.")
    assert "| base | 2.0 (1.0-3.0) | 1.00 |" in page
    assert "| a target | 1.0x | yes |" in page
    assert "issue" not in page.lower()  # a page for users: no tracker words
    assert "![perf_memory.png](img/perf_memory.png)" in page


async def test_engine_benchmark_measures_every_case() -> None:
    from benchmarks import bench_engine

    rows = await bench_engine._rows(rounds=1, n=8)
    assert len(rows) == 10
    assert "fused 3 ops 16 f32 vs one by one" in rows
    assert "10-op xp functions vs operators 256x256" in rows
    assert "minimal session: add 256x256" in rows
    for variant, baseline, ratio in rows.values():
        assert variant > 0
        assert baseline > 0
        assert ratio > 0


async def test_the_minimal_session_owns_its_buffers_as_the_reference_says() -> None:
    # The engine benchmark's reference row is only a floor if it does the work it claims.
    from benchmarks._minimal import MinimalSession

    m = MinimalSession()
    x = np.arange(16, dtype=np.float32)
    a, b = m.constant(x), m.constant(x * 2)
    c = await m.add(a, b)
    assert m.live_bytes == m.peak_bytes == 3 * x.nbytes
    d = await m.add(c, a)
    np.testing.assert_array_equal(m._buffers[d._rid][0], x * 4)
    assert not m._buffers[d._rid][0].flags.writeable
    del c
    e = await m.add(d, d)  # the next op frees what was dropped, before it allocates
    assert sorted(m._buffers) == sorted(h._rid for h in (a, b, d, e))
    assert m.live_bytes == m.peak_bytes == 4 * x.nbytes
    with pytest.raises(ValueError, match="shapes"):
        await m.add(a, m.constant(np.ones(3, np.float32)))
    m.close()
    with pytest.raises(RuntimeError, match="closed"):
        await m.add(a, b)


def test_pool_scenario_measures_every_variant() -> None:
    from benchmarks import bench_pool

    hop = run_on("asyncio", bench_pool._hop(rounds=1, n=64))
    for mode in ("one at a time", f"{bench_pool.IN_FLIGHT} in flight"):
        for label in (bench_pool.TO_THREAD, bench_pool.OWN, bench_pool.OWN_NORMAL, bench_pool.OLD, bench_pool.BARE):
            wall, cpu = hop[mode][label]
            assert wall.median > 0
            assert cpu.median >= 0
    lag = run_on("asyncio", bench_pool._lag(rounds=1, n=64))
    assert set(lag) == {"numpy, 4 sequential products", "ticker alone"} | {
        f"worker_priority={c.worker_priority!r}" for c in bench_pool.PRIORITIES
    }
    adds = run_on("asyncio", bench_pool._large_add(1, 1, (64,)))
    assert len(adds[64]) == 3


def test_a_benchmark_run_changes_no_tracked_file_unless_asked(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    from benchmarks import __main__ as suite

    def trivial(report: Any) -> None:
        report.sections.append(("trivial", "nothing measured"))

    monkeypatch.setitem(suite.SCENARIOS, "overheads", trivial)
    page = tmp_path / "performance.md"
    before = {p: p.stat().st_mtime_ns for p in (suite.ROOT / "docs").rglob("*") if p.is_file()}
    assert suite.main(["--only", "overheads", "--external", "no", "--out", str(page)]) == 0
    assert not page.exists()  # not asked: nothing written
    after = {p: p.stat().st_mtime_ns for p in (suite.ROOT / "docs").rglob("*") if p.is_file()}
    assert after == before
    assert suite.main(["--only", "overheads", "--external", "no", "--out", str(page), "--write-docs"]) == 0
    assert "nothing measured" in page.read_text()


def test_batching_scenario_measures_every_variant_and_records_its_targets() -> None:
    from benchmarks import bench_batching

    measured, _ = run_on("asyncio", bench_batching._measure(rounds=1, n=2, n_single=3, max_batch_size=512))
    assert set(measured["many"]) == {
        bench_batching.NUMPY,
        bench_batching.TO_THREAD,
        bench_batching.OP_BY_OP,
        bench_batching.FUSED,
        bench_batching.BATCHED,
        bench_batching.MINIMAL,
    }
    for rps, cycles in measured["many"].values():
        assert rps[0] > 0
        assert len(cycles) == bench_batching.CLIENTS * 2
    calls_per_batch, rows_per_batch, split_share = measured["stats"]
    assert calls_per_batch > 1  # 32 clients: coalesced
    assert rows_per_batch == calls_per_batch * bench_batching.ROWS
    assert 0.0 <= split_share <= 1.0  # the share of batches run in two parts
    report = Report(quick=True, rounds=1)
    bench_batching._report(report, "asyncio", measured, 512, 1)
    assert [t.number for t in report.targets] == [12, 12, 12]
    assert all(t.met is not None for t in report.targets)


def test_input_benchmark_times_every_way_to_the_same_array() -> None:
    from benchmarks import bench_input

    measured = run_on("asyncio", bench_input.measure(rounds=1, budget=0.0005))  # (it checks the arrays agree)
    assert set(measured) == set(bench_input.SIZES)
    ways = {bench_input.BASELINE, bench_input.PYDANTIC, bench_input.PYDANTIC_JSON, bench_input.PARSE_ROWS}
    for stats in measured.values():
        assert set(stats) == ways
        assert all(stat.median > 0 for stat in stats.values())


def test_web_benchmark_without_wrk_skips_and_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import bench_web

    monkeypatch.setattr("benchmarks.bench_web.shutil.which", lambda name: None)
    snippet = tmp_path / "web.md"
    assert bench_web.main(["--quick", "--markdown", str(snippet)]) == 0
    out = capsys.readouterr().out
    assert "skipped" in out
    assert "apt-get install wrk" in out
    assert not snippet.exists()


def test_web_benchmark_targets_are_ratios_to_the_same_run() -> None:
    from benchmarks.bench_web import Measured, targets

    def m(variant: str, rows: int, rps: float, health_ms: float, rss_after: int, loop_us: float = 1000) -> Measured:
        return Measured(variant, rows, requests=int(rps * 10), seconds=10.0, health=[health_ms / 1e3] * 10,
                        rss_after=rss_after, loop_cpu=loop_us * rps * 10 / 1e6)  # fmt: skip

    results = [
        m("aiotensor (op by op)", 16, 1100, 5.0, 120, loop_us=1030),
        m("aiotensor, no disconnect watch", 16, 1125, 5.0, 120, loop_us=1000),
        m("numpy in handler", 16, 1000, 50.0, 80),
        m("numpy to_thread", 16, 900, 6.0, 100),
        m("aiotensor (op by op)", 512, 60, 30.0, 200),
        m("numpy in handler", 512, 80, 400.0, 80),
        m("numpy to_thread", 512, 70, 100.0, 100),
    ]
    verdicts = {t: (measured, met) for t, measured, met in targets(results, subject="aiotensor (op by op)")}
    assert verdicts["16 rows: req/s >= 1.00x best baseline"] == ("1.10x (numpy in handler)", True)
    assert verdicts["16 rows: /health p99 <= to_thread's"] == ("5.0 vs 6.0 ms", True)
    assert verdicts["16 rows: RSS after <= 1.25x to_thread's"] == ("1.20x", True)
    assert verdicts["16 rows: disconnect watch costs <= 5% (loop CPU per request)"] == ("+3.0% (req/s -2.2%)", True)
    assert verdicts["512 rows: req/s >= 0.95x best baseline"] == ("0.75x (numpy in handler)", False)
    assert verdicts["512 rows: /health p99 <= 0.5x numpy in handler's"] == ("30.0 vs 400.0 ms (0.07x)", True)
    assert verdicts["512 rows: RSS after <= 1.25x to_thread's"] == ("2.00x", False)
    assert verdicts["zero errors"] == ("0", True)


def test_the_user_services_best_twin_includes_the_twin_answering_with_orjson() -> None:
    from benchmarks import bench_web
    from benchmarks.bench_web import Measured, best_baseline, targets_29

    def m(variant: str, rps: float) -> Measured:
        return Measured(variant, 16, requests=int(rps * 10), seconds=10.0, health=[0.005] * 10, rss_after=100)

    results = [
        m(bench_web.USER, 1000),
        m(bench_web.USER_MODEL, 900),
        m(bench_web.USER_NUMPY, 950),
        m(bench_web.USER_THREAD, 800),
        m(bench_web.USER_NUMPY_ORJSON, 1100),
        m("numpy in handler", 2000),  # the example's baseline: not the user service's twin
    ]
    best = best_baseline(results, user=True)
    assert best is not None
    assert best.variant == bench_web.USER_NUMPY_ORJSON
    verdicts = {t: (measured, met) for t, measured, met in targets_29(results)}
    key = f"{bench_web.USER}, 16 rows: req/s >= 1.00x best baseline"
    assert verdicts[key] == (f"0.91x ({bench_web.USER_NUMPY_ORJSON})", False)


def test_web_benchmark_quick_run_writes_only_where_asked(tmp_path: Path) -> None:
    import shutil

    from benchmarks import bench_web

    if shutil.which("wrk") is None:
        pytest.skip(f"wrk is not installed; {bench_web.INSTALL_HINT}")
    tracked = bench_web.DEFAULT_RESULTS
    before = tracked.stat().st_mtime_ns if tracked.exists() else None
    snippet = tmp_path / "web.md"
    argv = ["--quick", "--duration", "1", "--warmup", "0", "--after", "0.5", "--rows", "16"]
    argv += ["--variants", bench_web.EXAMPLE, "numpy to_thread", "--markdown", str(snippet)]
    assert bench_web.main(argv) == 0  # 0: no request failed
    text = snippet.read_text()
    assert f"| 16 | {bench_web.EXAMPLE} |" in text
    assert "| 16 | numpy to_thread |" in text
    assert "| 16 rows: req/s >= 1.00x best baseline |" in text
    assert "| zero errors | 0 | yes |" in text
    assert (tracked.stat().st_mtime_ns if tracked.exists() else None) == before


async def test_blocked_benchmark_measures_every_row() -> None:
    from benchmarks import bench_blocked

    found = await bench_blocked.measure(1, 0.0005, {"16 floats": (16,), "tiny": (64, 64)})
    assert set(found) == {"16 floats", "tiny", "standardization"}
    for ours, numpy in found.values():
        assert ours.median > 0
        assert numpy.median > 0


async def test_the_blocked_trace_stamps_a_split_run_in_order_and_puts_the_runtime_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from aiotensor._backends import _chunked, _jobs
    from aiotensor._programs import _blocked_layout, _blocked_run, _blocked_split, _compile
    from benchmarks import _blocked_trace, bench_blocked

    def replaced() -> tuple[Any, ...]:  # what the trace wraps, read where the runtime reads it
        return (
            _jobs.Job.run,
            _jobs._Inbox.drain,
            getattr(_blocked_layout, "in_parts"),  # noqa: B009
            getattr(_blocked_split, "_Blocks"),  # noqa: B009
        )

    wrapped = replaced()
    # Small runs that split (in two participants' blocks of 64 rows of 64).
    monkeypatch.setattr(_blocked_split, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(_blocked_split, "core_free", lambda: True)
    monkeypatch.setattr(_blocked_split, "SPLIT_BLOCK_ITEMS", 4096)
    monkeypatch.setattr(_blocked_run, "MIN_ITEMS", 256)
    monkeypatch.setattr(_blocked_run, "BLOCK_ITEMS", 1024)
    monkeypatch.setattr(_blocked_run, "BLOCK_FROM_ITEMS", 0)
    _compile._CACHE.clear()
    try:
        found, split_runs, numpy_us, hand_us = await _blocked_trace.trace(
            bench_blocked.chain, (256, 64), 4, at.SessionConfig(inline_threshold_us=0.0)
        )
    finally:
        _compile._CACHE.clear()
    assert replaced() == wrapped
    assert wrapped[3] is _chunked._Blocks
    assert split_runs == 4
    assert numpy_us > 0
    assert hand_us > 0
    order = ["job0", "split0", "first0", "split1", "job1", "settle", "resumed"]
    assert set(order) <= set(found)
    assert [found[name] for name in order] == sorted(found[name] for name in order)
    text = _blocked_trace.lines(found, split_runs, 4, numpy_us, hand_us)
    assert text[0].startswith("awaited split runs traced: 4 of 4 split")
    assert "hand split, two threads, no runtime" in text[-1]


def test_compare_revs_reads_the_rows_bench_blocked_prints() -> None:
    from benchmarks import bench_blocked, compare_revs

    report = Report(quick=True, rounds=2)
    for loop_name in ("asyncio", "uvloop"):
        t = report.table(f"blocked element-wise runs, {loop_name}: float32", "µs", ratio_label="x numpy")
        t.add("10-op chain 16 floats: aiotensor", Stat((12.5, 11.0, 14.25)), 0.96 if loop_name == "asyncio" else 1.5)
        t.add("10-op chain 16 floats: numpy", Stat((13.0, 12.0)), 1.0)
    stdout = "\n".join(["a line before any table", *bench_blocked.lines(report)])
    rows = compare_revs.parse("bench_blocked", stdout)
    assert rows == {
        ("blocked element-wise runs, asyncio: float32", "10-op chain 16 floats: aiotensor"): 0.96,
        ("blocked element-wise runs, asyncio: float32", "10-op chain 16 floats: numpy"): 1.0,
        ("blocked element-wise runs, uvloop: float32", "10-op chain 16 floats: aiotensor"): 1.5,
        ("blocked element-wise runs, uvloop: float32", "10-op chain 16 floats: numpy"): 1.0,
    }
    # bench_engine's rows (three numbers, the last the ratio) read as before.
    assert compare_revs.parse("bench_engine", "add, 1k floats   12.0  10.0  1.20") == {
        ("bench_engine", "add, 1k floats"): 1.2
    }


def test_gc_profile_reports_every_rung_and_generation(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import profile_gc, profile_web

    assert profile_gc.main(["--requests", "2", "--loop", "asyncio"]) == 0
    out = capsys.readouterr().out
    for stage in profile_gc.STAGES:
        assert profile_web.USER_RUNGS[stage] in out
    assert out.count("gen2:") == len(profile_gc.STAGES)


def test_request_session_profile_times_every_life_in_and_out_of_a_request(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import profile_request_session as prs

    assert prs.main(["--rounds", "1", "--requests", "1", "--loop", "asyncio", "--markdown"]) == 0
    out = capsys.readouterr().out
    for make in (prs.CONSTRUCTOR, prs.SESSIONS):
        for tensor in ("", ", one tensor"):
            for where in ("back to back, bare loop", "inside a request, the first", "inside a request, the later"):
                assert f"| {make}{tensor} | {where} |" in out


def test_the_batch_trace_summarizes_stamps_of_the_window_only() -> None:
    from benchmarks import trace_batches as tb

    events: list[tb.Event] = [
        (0.5, "req", None),  # before the window: counted in the app, not as a request of the window
        (1.0, "req", None),
        (2.0, "flush", 2),  # from here both requests in the app wait inside the batch ...
        (3.0, "kernel", (0.5, 0.25, 2, 1, 0)),  # 2 callers, 0.5 s: 250,000 µs per caller, CPU/wall 0.5
        (4.0, "resumed", 2),  # ... until here: 2 s of the 10 s window
        (5.0, "resp", None),
        (6.0, "resp", None),
        (7.0, "req", None),
        (7.5, "flush", 1),  # a batch of one: no µs per caller (a caller alone is not a batch's cost)
        (8.0, "kernel", (1.0, 1.0, 1, 1, 0)),
        (8.5, "resumed", 1),
        (9.0, "resp", None),
        (12.0, "flush", 3),  # after the window
    ]
    s = tb.summarize(events, 0.0, 10.0)
    assert s.requests == 3
    assert s.batches == 2
    assert s.callers_median == 1.5
    assert s.all_in_batches == pytest.approx((2.0 + 1.0) / 10.0)  # 2..4, and 7.5..8.5 (one request, in its batch)
    assert s.us_per_caller == {1: pytest.approx(250_000.0)}
    assert s.cpu_over_wall == pytest.approx(0.75)  # median of 0.5 and 1.0
    assert tb.summarize(events, 10.0, 11.0).batches == 0
    # A window that ends inside a batch: judged by the state then, not after the trace.
    assert tb.summarize(events, 0.0, 3.0).all_in_batches == pytest.approx(1.0 / 3.0)
    assert tb.summarize(events, 2.5, 3.0).all_in_batches == pytest.approx(1.0)
    assert tb.summarize(events, 3.0, 3.5).all_in_batches == pytest.approx(1.0)
    console = Console(record=True, width=120)
    console.print(tb.table(s, 100.0, None))
    text = console.export_text()
    assert "every request in the app waiting inside a batch" in text
    assert "n/a" in text  # no loop share off Linux
