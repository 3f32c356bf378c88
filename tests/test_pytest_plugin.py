"""The pytest plugin, as a user meets it: a test file of theirs, run by a real pytest."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

USER_TESTS = """
import numpy as np
import pytest

import aiotensor as at
from aiotensor.testing import assert_no_leaks


async def scale(session, values, factor):
    x = await session.constant(values)
    return await session.multiply(x, factor)


{marker}
async def test_scale(eager_session, eager_session_strategy):
    assert eager_session.cleanup is eager_session_strategy
    y = await scale(eager_session, [1.0, 2.0], 3.0)
    np.testing.assert_array_equal(await y.numpy(), [3.0, 6.0])
    del y
    await assert_no_leaks(eager_session)
    print("STRATEGY", eager_session_strategy.name)
"""

INI = """
[pytest]
asyncio_mode = {mode}
asyncio_default_fixture_loop_scope = function
filterwarnings = error
"""


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """pytest in-process on the user's project; hypothesis's plugin alone would add ~0.8 s a run."""
    return pytester.runpytest("-p", "no:hypothesispytest", "-p", "no:cacheprovider", *args)


def user_project(pytester: pytest.Pytester, *, mode: str = "auto", marker: str = "") -> None:
    pytester.makeini(INI.format(mode=mode))
    pytester.makepyfile(test_user=USER_TESTS.format(marker=marker))


def test_fixture_in_auto_mode(pytester: pytest.Pytester) -> None:
    user_project(pytester)
    result = run(pytester, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*STRATEGY IN_BACKGROUND*"])


def test_option_runs_every_strategy(pytester: pytest.Pytester) -> None:
    user_project(pytester)
    result = run(pytester, "-v", "--aiotensor-strategy=all")
    result.assert_outcomes(passed=3)
    result.stdout.fnmatch_lines_random(
        [
            "*test_scale?IN_BACKGROUND? PASSED*",
            "*test_scale?ON_SAFE_POINTS? PASSED*",
            "*test_scale?ON_SESSION_CLOSE? PASSED*",
        ]
    )


def test_option_takes_a_list_and_rejects_typos(pytester: pytest.Pytester) -> None:
    user_project(pytester)
    result = run(pytester, "-v", "--aiotensor-strategy=on_safe_points,on-session-close")
    result.assert_outcomes(passed=2)
    bad = run(pytester, "--aiotensor-strategy=eventually")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    bad.stderr.fnmatch_lines(["*unknown strategy 'eventually'*"])


def test_fixture_in_strict_mode(pytester: pytest.Pytester) -> None:
    # strict mode (pytest-asyncio's default) runs only fixtures it marked: the plugin
    # hands such a test its pytest_asyncio fixture, with no deprecation warning.
    user_project(pytester, mode="strict", marker="@pytest.mark.asyncio")
    run(pytester, "-W", "error").assert_outcomes(passed=1)


def test_fixture_on_a_module_scoped_loop(pytester: pytest.Pytester) -> None:
    # the session opens on the loop the test runs on, whatever its scope
    user_project(pytester, mode="strict", marker='@pytest.mark.asyncio(loop_scope="module")')
    run(pytester).assert_outcomes(passed=1)


def test_fixture_under_anyio(pytester: pytest.Pytester) -> None:
    user_project(pytester, mode="strict", marker="@pytest.mark.anyio")
    # anyio runs tests on trio too when it is installed; sessions need asyncio (see test_anyio)
    pytester.makeconftest("import pytest\n\n@pytest.fixture\ndef anyio_backend():\n    return 'asyncio'\n")
    run(pytester).assert_outcomes(passed=1)


def test_parametrizing_the_strategy_per_test(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="auto"))
    pytester.makepyfile(
        test_param="""
import pytest
import aiotensor as at

@pytest.mark.parametrize("eager_session_strategy", [at.ResourceCleanupStrategy.ON_SAFE_POINTS])
async def test_one(eager_session):
    assert eager_session.cleanup is at.ResourceCleanupStrategy.ON_SAFE_POINTS
"""
    )
    # the test's own parametrization wins over the command line
    run(pytester, "--aiotensor-strategy=all").assert_outcomes(passed=1)


def test_a_leak_fails_the_users_test_with_the_tensor_named(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="auto"))
    pytester.makepyfile(
        test_leak="""
from aiotensor.testing import assert_no_leaks

CACHE = []

async def test_leaky(eager_session):
    CACHE.append(await eager_session.zeros((8,), name="cached"))
    await assert_no_leaks(eager_session)
"""
    )
    result = run(pytester, "--aiotensor-strategy=all")
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(["*1 tensor handle(s) still alive*", "*cached: float64[[]8[]], 64 bytes on /cpu:0*"])


def test_a_sync_test_gets_a_clear_failure(pytester: pytest.Pytester) -> None:
    pytester.makeini(INI.format(mode="auto"))
    pytester.makepyfile(test_sync="def test_sync(eager_session):\n    pass\n")
    result = run(pytester)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*eager_session is an async fixture*"])
