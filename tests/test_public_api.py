"""The flat public namespace: __all__ matches what is exported, and everything is documented."""

from __future__ import annotations

import inspect

import aiotensor as at


def test_all_lists_exactly_the_public_names() -> None:
    public = {name for name in vars(at) if not name.startswith("_")}
    modules = {name for name in public if inspect.ismodule(getattr(at, name))}
    assert set(at.__all__) - {"__version__"} == public - modules
    assert len(at.__all__) == len(set(at.__all__))


def test_every_public_name_has_a_docstring() -> None:
    undocumented = [name for name in at.__all__ if name != "__version__" and not inspect.getdoc(getattr(at, name))]
    assert undocumented == []


def test_module_level_ops_mirror_session_methods() -> None:
    for name in ("add", "matmul", "sum", "constant", "apply"):
        fn = getattr(at, name)
        method = getattr(at.AsyncEagerSession, name)
        assert fn.__doc__ == method.__doc__
        assert "self" not in inspect.signature(fn).parameters
        assert inspect.iscoroutinefunction(fn)


def test_every_op_is_on_an_api_page() -> None:
    # Each op of the table is rendered by the API reference (a ``members:`` entry of a page in docs/api/).
    from pathlib import Path

    from aiotensor.testing import op_names

    pages = "".join(p.read_text() for p in (Path(__file__).parent.parent / "docs" / "api").glob("*.md"))
    listed = {line.strip()[2:] for line in pages.splitlines() if line.strip().startswith("- ")}
    missing = sorted(name for name in op_names(aliases=True) if name not in listed)
    assert missing == []
