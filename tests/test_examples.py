"""The example scripts run and print what they promise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

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


def _numpy_kmeans(points: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """The example's algorithm in numpy: (centres, inertia)."""

    def dist(c: np.ndarray) -> np.ndarray:
        d: np.ndarray = ((points[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
        return d

    centres = points[:1]
    for _ in range(k - 1):
        centres = np.concatenate([centres, points[dist(centres).min(axis=1).argmax()][None]])
    labels = dist(centres).argmin(axis=1)
    while True:
        centres = np.stack([points[labels == j].mean(axis=0) for j in range(k)])
        new = dist(centres).argmin(axis=1)
        if (new == labels).all():
            break
        labels = new
    return centres, float(dist(centres).min(axis=1).sum())


def test_kmeans_example_finds_the_clusters_numpy_finds() -> None:
    proc = subprocess.run(
        [sys.executable, "-W", "error", str(EXAMPLES / "kmeans.py")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    rng = np.random.default_rng(0)
    truth = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 6.0]])
    points = np.concatenate([rng.normal(c, 0.8, size=(500, 2)) for c in truth])
    centres, inertia = _numpy_kmeans(points, 3)
    assert "k-means found 3 clusters in 1500 points" in proc.stdout
    for c in sorted(centres.tolist()):
        assert f"({c[0]:.1f}, {c[1]:.1f}) with " in proc.stdout
    assert f"is {inertia:.1f}." in proc.stdout
    assert np.abs(np.sort(centres, axis=0) - np.sort(truth, axis=0)).max() < 0.2
