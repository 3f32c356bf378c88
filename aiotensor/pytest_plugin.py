"""pytest plugin for users' own tests: the ``eager_session`` fixture and ``--aiotensor-strategy``.

Installed with aiotensor and loaded by pytest through the ``pytest11`` entry point, so
nothing needs registering. In a test::

    import aiotensor.testing

    async def test_my_model(eager_session):
        y = await my_model(eager_session, ...)
        assert (await y.numpy()).shape == (4,)
        del y
        await aiotensor.testing.assert_no_leaks(eager_session)

``eager_session`` is an open :class:`~aiotensor.AsyncEagerSession`, closed after the
test. Its strategy comes from the ``eager_session_strategy`` fixture: ``IN_BACKGROUND``
by default, every strategy with ``pytest --aiotensor-strategy=all`` (or a comma list of
names), or chosen per test with
``@pytest.mark.parametrize("eager_session_strategy", [...])``.

The session is opened on the loop of the test, whichever plugin runs it:
pytest-asyncio (auto or strict mode) or anyio's plugin (``@pytest.mark.anyio`` on the
asyncio backend).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import pytest

from ._config import ResourceCleanupStrategy
from ._session import AsyncEagerSession

__all__ = ["eager_session", "eager_session_strategy"]

_OPTION = "--aiotensor-strategy"
_ASYNCIO_FIXTURE = "_aiotensor_session_asyncio"
_ANYIO_FIXTURE = "_aiotensor_session_anyio"
_LoopScope = Literal["function", "class", "module", "package", "session"]
_LOOP_SCOPES: tuple[_LoopScope, ...] = ("function", "class", "module", "package", "session")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--aiotensor-strategy``."""
    group = parser.getgroup("aiotensor")
    group.addoption(
        _OPTION,
        default=None,
        metavar="NAMES",
        help="cleanup strategy of the eager_session fixture: 'all', or a comma-separated list of"
        " in_background, on_safe_points, on_session_close (default in_background)",
    )


def _strategies(value: str) -> list[ResourceCleanupStrategy]:
    if value.strip().lower() == "all":
        return list(ResourceCleanupStrategy)
    chosen = []
    for part in value.split(","):
        key = part.strip().upper().replace("-", "_")
        if key not in ResourceCleanupStrategy.__members__:
            names = ", ".join(s.name.lower() for s in ResourceCleanupStrategy)
            raise pytest.UsageError(f"{_OPTION}: unknown strategy {part.strip()!r}; use 'all' or {names}")
        chosen.append(ResourceCleanupStrategy[key])
    return list(dict.fromkeys(chosen))


def pytest_configure(config: pytest.Config) -> None:
    """Check ``--aiotensor-strategy`` early, so a typo is a usage error, not N failures."""
    value = config.getoption(_OPTION)
    if value is not None:
        _strategies(value)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """With ``--aiotensor-strategy``, run each test using ``eager_session_strategy`` once per strategy."""
    value = metafunc.config.getoption(_OPTION)
    if value is None or "eager_session_strategy" not in metafunc.fixturenames:
        return
    for marker in metafunc.definition.iter_markers("parametrize"):
        names = marker.args[0] if marker.args else marker.kwargs.get("argnames", ())
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        if "eager_session_strategy" in names:
            return  # the test chose its strategies itself
    strategies = _strategies(value)
    metafunc.parametrize("eager_session_strategy", strategies, ids=[s.name for s in strategies])


@pytest.fixture
def eager_session_strategy() -> ResourceCleanupStrategy:
    """The cleanup strategy of ``eager_session`` (``IN_BACKGROUND`` unless parametrized)."""
    return ResourceCleanupStrategy.IN_BACKGROUND


async def _open(strategy: ResourceCleanupStrategy) -> AsyncIterator[AsyncEagerSession]:
    async with AsyncEagerSession(cleanup=strategy) as session:
        yield session


# The same fixture twice: pytest-asyncio in strict mode only runs fixtures it marked
# (pytest_asyncio.fixture), while anyio's plugin only runs unmarked ones.
@pytest.fixture
async def _aiotensor_session_anyio(eager_session_strategy: ResourceCleanupStrategy) -> AsyncIterator[AsyncEagerSession]:
    async for session in _open(eager_session_strategy):
        yield session


try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - pytest-asyncio is optional for users
    _HAVE_PYTEST_ASYNCIO = False
else:
    _HAVE_PYTEST_ASYNCIO = True

    def _asyncio_variant(loop_scope: _LoopScope) -> Any:
        @pytest_asyncio.fixture(loop_scope=loop_scope, name=f"{_ASYNCIO_FIXTURE}_{loop_scope}")
        async def fixture(eager_session_strategy: ResourceCleanupStrategy) -> AsyncIterator[AsyncEagerSession]:
            async for session in _open(eager_session_strategy):
                yield session

        return fixture

    # One per loop scope: the session must open on the loop the test runs on, and
    # pytest-asyncio fixes a fixture's loop when it is declared.
    for _scope in _LOOP_SCOPES:
        globals()[f"{_ASYNCIO_FIXTURE}_{_scope}"] = _asyncio_variant(_scope)


def _loop_scope(request: pytest.FixtureRequest) -> str:
    # The closest asyncio marker that names a loop scope, else the configured default.
    for marker in request.node.iter_markers("asyncio"):
        scope = marker.kwargs.get("loop_scope") or marker.kwargs.get("scope")
        if scope:
            return str(scope)
    return str(request.config.getini("asyncio_default_test_loop_scope") or "function")


@pytest.fixture
def eager_session(request: pytest.FixtureRequest, eager_session_strategy: ResourceCleanupStrategy) -> Any:
    """An open :class:`~aiotensor.AsyncEagerSession` for one test, closed (freeing everything) after it.

    Opened on the event loop of the test: use it from an async test run by
    pytest-asyncio or by anyio's plugin on the asyncio backend.
    """
    if _HAVE_PYTEST_ASYNCIO and request.node.get_closest_marker("asyncio") is not None:
        return request.getfixturevalue(f"{_ASYNCIO_FIXTURE}_{_loop_scope(request)}")
    if "anyio_backend" in request.fixturenames:
        return request.getfixturevalue(_ANYIO_FIXTURE)
    pytest.fail(
        "eager_session is an async fixture: request it from an async test run by pytest-asyncio"
        " (@pytest.mark.asyncio, or asyncio_mode = 'auto') or by anyio (@pytest.mark.anyio)",
        pytrace=False,
    )
