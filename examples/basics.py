"""The core API in one script: sessions, ops, the three strategies and the TF1 patterns.

Run: python examples/basics.py
"""

from __future__ import annotations

import asyncio
import logging

import numpy as np

import aiotensor as at


async def main() -> None:
    # A session owns every buffer it creates; leaving the block frees them all.
    async with at.AsyncEagerSession() as s:
        a = await s.constant([1.0, 2.0], name="a")
        b = await s.constant([2.0, 3.0], name="b")
        c = await s.add(a, b)
        print("a + b =", await c.numpy())
        print("a * b =", await (await (a * b)).numpy())
        print("run:", await s.run({"c": c, "pair": (a, b)}))
        print(s.stats())

    # n ops in a loop of m iterations, keeping only the last result: n*m buffers without cleanup.
    for strategy in at.ResourceCleanupStrategy:
        async with at.AsyncEagerSession(cleanup=strategy) as s:
            x = await s.random_normal((1000,), seed=0)
            last = x
            for _ in range(50):
                y = x
                for _ in range(10):
                    y = await s.tanh(y)
                last = y
            print(f"{strategy.name:17} peak {s.stats().peak_bytes:>9,} bytes; last mean {float(np.mean(last)):.4f}")

    # TF1 patterns: as_default, eval, soft placement and placement logging.
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    config = at.SessionConfig(allow_soft_placement=True, log_device_placement=True)
    async with at.AsyncEagerSession(config=config) as s:
        with s.as_default():
            w = await at.ones((2, 2), name="w")
            prod = await at.matmul(w, w, name="prod")
        print("eval:", await prod.eval())
        with s.device("/gpu:0"):  # no GPU here: soft placement runs it on /cpu:0
            z = await s.exp(prod, name="z")
        print("z placed on", z.device)


if __name__ == "__main__":
    asyncio.run(main())
