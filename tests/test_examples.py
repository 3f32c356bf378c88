"""The example scripts run and print what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_basics_example_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / "basics.py")], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "a + b = [3. 5.]" in proc.stdout
    assert "z placed on /cpu:0" in proc.stdout
    assert "exp: z on /cpu:0" in proc.stderr  # log_device_placement
    for strategy in ("IN_BACKGROUND", "ON_SAFE_POINTS", "ON_SESSION_CLOSE"):
        assert strategy in proc.stdout
