"""examples/quickstart.ipynb, executed by nbclient on a real ipykernel.

The kernelspec is written at test time into a temporary prefix, pointing at this very
interpreter (``ipykernel.kernelspec.install``), and found through ``JUPYTER_PATH``: the
test needs nothing but ``pip install -e ".[test]"``, and never picks up some other
Python's ``python3`` kernel installed on the machine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ipykernel.kernelspec
import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOK = Path(__file__).resolve().parent.parent / "examples" / "quickstart.ipynb"
KERNEL = "aiotensor-test"
BUFFER = 100 * 100 * 8  # bytes of one buffer in the strategies cell
LOOP_BUFFERS = 1 + 4 * 50  # ones, then n=4 ops for m=50 iterations


def stdout_of(nb: Any, tag: str) -> str:
    """The printed output of the code cell tagged ``tag``."""
    (cell,) = [c for c in nb.cells if tag in c.metadata.get("tags", [])]
    return "".join(o["text"] for o in cell.outputs if o["output_type"] == "stream" and o["name"] == "stdout")


def fields(line: str) -> dict[str, str]:
    """``key=value`` pairs of a printed line."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


@pytest.fixture(scope="module")
def executed(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("jupyter")
    ipykernel.kernelspec.install(kernel_name=KERNEL, prefix=str(tmp))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("JUPYTER_PATH", str(tmp / "share" / "jupyter"))
        mp.setenv("JUPYTER_PLATFORM_DIRS", "1")  # silences jupyter_core's path-migration warning
        nb = nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]
        # Raises CellExecutionError, with the traceback, if any cell fails.
        NotebookClient(nb, kernel_name=KERNEL, timeout=60, resources={"metadata": {"path": str(tmp)}}).execute()
    return nb


def test_no_event_loop_patching() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)  # type: ignore[no-untyped-call]
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "nest_asyncio" not in code
    assert "asyncio.run" not in code
    assert "await " in code  # top-level await, natively


@pytest.mark.slow
def test_ops_and_stats(executed: Any) -> None:
    code = [c for c in executed.cells if c.cell_type == "code"]
    assert "InteractiveSession" in code[0].outputs[0]["data"]["text/plain"]
    printed = "".join(o.get("text", "") for o in code[1].outputs)
    assert "[[ 7. 10.]\n [15. 22.]]" in printed  # a @ a
    assert "[18., 26.]" in printed  # a + a @ a
    assert "SessionStats(live_tensors=3," in "".join(o.get("text", "") for o in code[2].outputs)


@pytest.mark.slow
def test_background_cleanup_happens_between_cells(executed: Any) -> None:
    drop = stdout_of(executed, "drop").splitlines()
    assert fields(drop[0])["live_bytes"] != "0"
    # Still pending when the cell that dropped it ended...
    assert fields(drop[1])["pending"] == "1"
    # ...and freed by the next cell, with no op run in between.
    after = fields(stdout_of(executed, "between-cells"))
    assert after == {"pending": "0", "freed": "1", "bytes_released": str(1000 * 1000 * 8), "ops_since": "0"}


@pytest.mark.slow
def test_three_strategies(executed: Any) -> None:
    header, *rows = stdout_of(executed, "strategies").splitlines()
    assert header.split() == ["strategy", "buffers", "peak_bytes", "live_bytes", "after_close"]
    table = {name: tuple(map(int, numbers)) for name, *numbers in (row.split() for row in rows)}
    assert set(table) == {"IN_BACKGROUND", "ON_SAFE_POINTS", "ON_SESSION_CLOSE"}
    for allocated, _peak, _live, after_close in table.values():
        assert allocated == LOOP_BUFFERS
        assert after_close == 0
    # Close-only holds every intermediate until close...
    assert table["ON_SESSION_CLOSE"][1:3] == (LOOP_BUFFERS * BUFFER, LOOP_BUFFERS * BUFFER)
    # ...safe points free the previous result before each op: at most two buffers live...
    assert table["ON_SAFE_POINTS"][1] == 2 * BUFFER
    # ...and the background task keeps up within a few buffers (it runs whenever an op awaits).
    assert table["IN_BACKGROUND"][1] <= 10 * BUFFER


@pytest.mark.slow
def test_the_notebook_says_what_it_showed(executed: Any) -> None:
    (summary,) = stdout_of(executed, "summary").splitlines()
    assert summary.startswith(f"What this showed: each strategy made {LOOP_BUFFERS} buffers of {BUFFER:,} bytes")
    assert f"ON_SESSION_CLOSE held all {LOOP_BUFFERS} until close, ON_SAFE_POINTS at most 2 at once" in summary


@pytest.mark.slow
def test_close_frees_everything(executed: Any) -> None:
    assert fields(stdout_of(executed, "close")) == {"closed": "True", "live_tensors": "0"}
