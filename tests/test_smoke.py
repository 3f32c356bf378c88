"""The issue's first example, end to end."""

from __future__ import annotations

import numpy as np

import aiotensor as at


async def test_quickstart_example() -> None:
    async with at.AsyncEagerSession() as s:
        a = await s.constant([1.0, 2.0], name="a")
        b = await s.constant([2.0, 3.0], name="b")
        c = await s.add(a, b)
        np.testing.assert_array_equal(await c.numpy(), [3.0, 5.0])
        d = await (a * b)
        np.testing.assert_array_equal(await d.numpy(), [2.0, 6.0])
    assert s.closed
    assert s.stats().live_tensors == 0
