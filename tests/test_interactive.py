"""InteractiveSession and get_default_session."""

from __future__ import annotations

import numpy as np
import pytest

import aiotensor as at


async def test_interactive_session_is_the_process_wide_default() -> None:
    assert at.get_default_session() is None
    s = at.InteractiveSession()
    try:
        assert at.get_default_session() is s
        t = await at.constant([1.0, 2.0])
        assert t.session is s
        np.testing.assert_array_equal(await t.eval(), [1.0, 2.0])
        async with at.AsyncEagerSession() as scoped:
            with scoped.as_default():
                assert at.get_default_session() is scoped  # the context default wins
            assert at.get_default_session() is s
    finally:
        await s.close()
    assert at.get_default_session() is None
    with pytest.raises(at.NoSessionError, match="no session"):
        await at.zeros(2)


async def test_a_second_interactive_session_warns_and_takes_over() -> None:
    first = at.InteractiveSession()
    with pytest.warns(RuntimeWarning, match="replaces it as the default"):
        second = at.InteractiveSession(cleanup=at.ResourceCleanupStrategy.ON_SAFE_POINTS)
    try:
        assert at.get_default_session() is second
        await first.close()  # closing the old one leaves the new default alone
        assert at.get_default_session() is second
    finally:
        await second.close()
    assert at.get_default_session() is None
