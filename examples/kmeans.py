"""k-means clustering written as numpy-style array code with ``aiotensor.xp``.

Comparisons are element-wise (``lab == k`` is a mask), a boolean mask selects rows
(``x[lab == k]``), and every ``xp`` function builds an expression that runs, in one
dispatch, when awaited. The converged inertia is read with ``float(t)``: a tensor's
value is in memory, so it converts without an await.

Run: python examples/kmeans.py
"""

from __future__ import annotations

import asyncio

import numpy as np

import aiotensor as at
from aiotensor import xp

K = 3
TRUE_CENTRES = np.array([[0.0, 0.0], [5.0, 5.0], [0.0, 6.0]])


def squared_distances(x: at.Tensor, centres: at.Tensor) -> at.Expr:
    """The (points, clusters) squared distances, as one expression."""
    return xp.sum((x[:, None, :] - centres[None, :, :]) ** 2, axis=2)


async def kmeans(x: at.Tensor, k: int, max_iter: int = 100) -> tuple[at.Tensor, at.Tensor, float, int]:
    """Lloyd's algorithm: (centres, labels, inertia, iterations)."""
    # Farthest-point start: the first point, then each time the point farthest from the centres so far.
    centres = await x[:1]
    for _ in range(k - 1):
        far = xp.argmax(xp.min(squared_distances(x, centres), axis=1))
        centres = await xp.concat([centres, x[far][None, :]], axis=0)
    labels = await xp.argmin(squared_distances(x, centres), axis=1)
    iterations, converged = 0, False
    while not converged and iterations < max_iter:
        iterations += 1
        # Each centre moves to the mean of its points: a boolean mask per cluster.
        centres = await xp.stack([xp.mean(x[labels == j], axis=0) for j in range(k)])
        new_labels = await xp.argmin(squared_distances(x, centres), axis=1)
        converged = bool(await xp.all(new_labels == labels))  # a local tensor: bool() needs no await
        labels = new_labels
    inertia = float(await xp.sum(xp.min(squared_distances(x, centres), axis=1)))
    return centres, labels, inertia, iterations


async def main() -> None:
    rng = np.random.default_rng(0)
    points = np.concatenate([rng.normal(c, 0.8, size=(500, 2)) for c in TRUE_CENTRES])
    async with at.AsyncEagerSession() as s:
        x = await s.constant(points)
        centres, labels, inertia, iterations = await kmeans(x, K)
        _, counts = await s.run(xp.unique_counts(labels))
        found = centres.tolist()
    order = sorted(range(K), key=lambda j: found[j])
    described = ", ".join(f"({found[j][0]:.1f}, {found[j][1]:.1f}) with {counts[j]} points" for j in order)
    print(f"k-means found {K} clusters in {len(points)} points after {iterations} iterations: {described}.")
    print(f"Their inertia (sum of squared distances to the nearest centre) is {inertia:.1f}.")


if __name__ == "__main__":
    asyncio.run(main())
