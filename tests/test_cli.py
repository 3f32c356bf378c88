"""The ``aiotensor`` command: the demo's numbers, its output, ``info``, and bad arguments."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import aiotensor as at
from aiotensor._backends import _affinity
from aiotensor._cli import collect_info, main, run_demo

SIZE = 256
TENSOR = SIZE * 4  # float32


def aiotensor_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m aiotensor ARGS`` in a fresh interpreter (what a user's shell runs)."""
    return subprocess.run(
        [sys.executable, "-m", "aiotensor", *args], capture_output=True, text=True, timeout=60, check=False
    )


async def test_demo_holds_what_each_strategy_promises(strategy: at.ResourceCleanupStrategy) -> None:
    n, m = 4, 6
    seen: list[int] = []
    r = await run_demo(strategy, n, m, SIZE, on_iteration=seen.append)
    assert seen == list(range(1, m + 1))
    assert len(r.live_per_iteration) == m
    assert r.error is None
    assert r.closed_bytes == 0
    assert r.final_bytes <= r.peak_bytes
    if strategy is at.ResourceCleanupStrategy.ON_SESSION_CLOSE:
        # every intermediate is held until close: the input plus n*m results
        assert r.peak_bytes == r.final_bytes == (n * m + 1) * TENSOR
        assert r.live_per_iteration == [(i * n + 1) * TENSOR for i in range(1, m + 1)]
    else:
        # a bounded handful of buffers, whatever n and m are
        assert r.peak_bytes <= 4 * TENSOR
        assert max(r.live_per_iteration) <= 4 * TENSOR
    if strategy is at.ResourceCleanupStrategy.IN_BACKGROUND:
        assert r.final_bytes == 2 * TENSOR  # the input and the last result, freed while idle


async def test_demo_stops_a_strategy_at_the_memory_limit() -> None:
    r = await run_demo(at.ResourceCleanupStrategy.ON_SESSION_CLOSE, 4, 50, SIZE, memory_limit=20 * TENSOR)
    assert r.error is not None
    assert "memory_limit" in r.error
    # the over-limit result was allocated by its kernel, counted in the peak, then freed at once
    assert r.peak_bytes <= 21 * TENSOR
    assert r.final_bytes <= 20 * TENSOR
    assert r.closed_bytes == 0
    ok = await run_demo(at.ResourceCleanupStrategy.IN_BACKGROUND, 4, 50, SIZE, memory_limit=20 * TENSOR)
    assert ok.error is None


@pytest.mark.slow
def test_demo_command_prints_the_table_and_draws_the_plot(tmp_path: Path) -> None:
    png = tmp_path / "live.png"
    proc = aiotensor_cmd("demo", "-n", "3", "-m", "5", "--size", str(SIZE), "--plot", str(png))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for strategy in at.ResourceCleanupStrategy:
        assert strategy.name in out
    assert "5/5" in out  # the finished progress bars, printed once on a non-tty
    assert "after close" in out
    assert "live at end: after a 10 ms idle moment, with the input and the last result held." in out  # 2 buffers
    assert "Traceback" not in proc.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a non-tty gets no cursor movement or colour codes
    assert "\x1b[" not in out


def test_demo_without_rich_prints_a_plain_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "rich", None)
    assert main(["demo", "-n", "2", "-m", "3", "--size", "16", "-s", "on_session_close"]) == 0
    out = capsys.readouterr().out
    assert "ON_SESSION_CLOSE" in out
    assert f"{(2 * 3 + 1) * 16 * 4:,}" in out  # peak bytes, exact
    assert "IN_BACKGROUND" not in out


def test_plot_without_matplotlib_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["demo", "-m", "2", "--plot", str(tmp_path / "x.png")]) == 1
    err = capsys.readouterr().err
    assert "pip install 'aiotensor[demo]'" in err
    assert not (tmp_path / "x.png").exists()


def test_uvloop_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)
    assert main(["demo", "-m", "2", "--loop", "uvloop"]) == 1
    assert "aiotensor[uvloop]" in capsys.readouterr().err


def test_demo_runs_on_uvloop(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("uvloop")
    assert main(["demo", "-n", "2", "-m", "2", "--size", "8", "--loop", "uvloop", "-s", "in_background"]) == 0
    assert "IN_BACKGROUND" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "-n", "0"], "expected a positive integer, got 0"),
        (["demo", "-m", "ten"], "expected a positive integer, got 'ten'"),
        (["demo", "--strategy", "sometimes"], "unknown strategy 'sometimes'"),
        (["demo", "--plot", "live.txt"], "must end in .png"),
        (["demo", "--plot", "/no/such/dir/live.png"], "no directory"),
        (["demo", "--loop", "trio"], "invalid choice: 'trio'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "the following arguments are required"),
    ],
    ids=["zero-ops", "non-integer", "strategy", "plot-suffix", "plot-dir", "loop", "command", "nothing"],
)
def test_bad_arguments_exit_2_with_usage(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert "usage: aiotensor" in captured.err
    assert captured.out == ""


@pytest.mark.slow
def test_bad_arguments_in_a_shell_give_no_traceback() -> None:
    for args, message in [(["demo", "-m", "ten"], "got 'ten'"), (["frobnicate"], "invalid choice")]:
        proc = aiotensor_cmd(*args)
        assert proc.returncode == 2
        assert message in proc.stderr
        assert "usage: aiotensor" in proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_info_reports_versions_devices_pool_and_blas() -> None:
    proc = aiotensor_cmd("info", "--json")
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    assert info["aiotensor"] == at.__version__
    assert info["numpy"] == np.__version__
    assert info["devices"] == ["/cpu:0"]
    assert isinstance(info["pool_workers"], int)
    assert info["pool_workers"] >= 1
    assert info["worker_priority"].startswith("low (")  # SessionConfig's default, as the platform applies it
    assert isinstance(info["blas"], list)  # threadpoolctl is a test extra
    assert all(b["threads"] >= 1 for b in info["blas"])
    assert info["blocked"]["block_items"] > 0  # the blocked-evaluation constants
    assert info["batch_split"]["min_us"] > 0  # when a batch runs in two parts
    inline = info["inline"]  # where a cheap kernel runs, idle loop and busy loop
    assert inline["inline_threshold_us"] == at.SessionConfig().inline_threshold_us
    assert 0 < inline["busy_inline_us"] <= inline["inline_threshold_us"]
    assert 0 < inline["idle_below"] < inline["busy_above"] < 1


def test_info_text_and_without_threadpoolctl(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "threadpoolctl", None)
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    lines = dict(line.split(":", 1) for line in out.splitlines())
    assert lines["aiotensor"].strip() == at.__version__
    assert lines["devices"].strip() == "/cpu:0"
    assert lines["worker priority"].strip().startswith("low (")
    assert "threadpoolctl is not installed" in lines["BLAS"]
    info = collect_info()
    assert f"in blocks of {info['blocked']['block_items']:,} " in lines["blocked runs"]
    assert f"(at most {info['blocked']['parked_max_bytes']:,})" in lines["blocked runs"]
    assert 0 <= info["blocked"]["parked_bytes"] <= info["blocked"]["parked_max_bytes"]
    assert f"one-part kernel took {info['batch_split']['min_us']:g} µs or more" in lines["batched kernels"]
    steered = "runs off the core of the thread computing the first" in lines["split parts"]
    assert steered is info["parts_steered"] is _affinity.can_steer()
    busy = info["inline"]
    assert (
        f"{busy['busy_inline_us']:g} µs while its thread is busy (over {busy['busy_above']:.0%}"
        in lines["inline kernels"]
    )


def test_importing_aiotensor_imports_neither_rich_nor_matplotlib() -> None:
    code = "import sys, aiotensor, aiotensor._cli\nprint(sorted(m for m in ('rich', 'matplotlib') if m in sys.modules))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert proc.stdout.strip() == "[]"
