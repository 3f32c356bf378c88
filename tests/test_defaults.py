"""get_default_session precedence: the context's default, then the interactive one."""

from __future__ import annotations

import asyncio
import contextvars

import aiotensor as at
from aiotensor import _defaults


async def _default_in_task() -> at.AsyncEagerSession | None:
    return at.get_default_session()


async def test_context_default_is_invisible_to_other_contexts() -> None:
    async with at.AsyncEagerSession() as s:
        with s.as_default():
            assert at.get_default_session() is s
            other = contextvars.Context()  # a fresh context, as another request's task would have
            assert other.run(at.get_default_session) is None
            assert await asyncio.create_task(_default_in_task()) is s  # tasks inherit a copy
        assert at.get_default_session() is None


def test_replace_interactive_only_removes_the_current_one() -> None:
    a = at.AsyncEagerSession()
    b = at.AsyncEagerSession()
    assert _defaults.replace_interactive(None, a) is None
    assert _defaults.replace_interactive(b, None) is a  # b is not current: nothing changes
    assert at.get_default_session() is a
    assert _defaults.replace_interactive(a, None) is a
    assert at.get_default_session() is None
