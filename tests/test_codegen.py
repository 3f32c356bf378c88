"""The generated surfaces: current with the op table, and derived from it completely."""

from __future__ import annotations

import inspect

import aiotensor as at
from aiotensor import _codegen
from aiotensor._expr import Operand
from aiotensor._fusion._fused_ops import FusedOps
from aiotensor._generated_operand import OperandMethods
from aiotensor._opdef import ALIASES, OPS


def test_generated_files_are_current() -> None:
    stale = [path.name for path, text in _codegen.generate().items() if path.read_text() != text]
    assert stale == [], f"run `python -m aiotensor._codegen`: {stale} are stale"


def test_every_op_has_every_surface() -> None:
    for name, d in OPS.items():
        method = getattr(at.AsyncEagerSession, name)
        assert inspect.iscoroutinefunction(method), name
        assert inspect.iscoroutinefunction(getattr(at, name)), name
        assert name in at.__all__
        assert callable(getattr(FusedOps, name))
        assert inspect.getdoc(method) == inspect.cleandoc(d.doc or ""), name
    for alias, target in ALIASES.items():
        assert getattr(at, alias).__doc__ == getattr(at.AsyncEagerSession, target).__doc__


def test_operand_methods_and_operators_come_from_the_table() -> None:
    for stem, _ in _codegen._BINARY:
        assert f"__{stem}__" in vars(OperandMethods)
        assert f"__r{stem}__" in vars(OperandMethods)
    for method, *_ in _codegen._METHODS:
        assert method in vars(OperandMethods)
    for stem, _ in _codegen._COMPARE:  # element-wise comparisons (issue 28), hash by identity
        assert f"__{stem}__" in vars(OperandMethods)
    assert {f"__{stem}__" for stem, _ in _codegen._COMPARE} == {
        "__eq__",
        "__ne__",
        "__lt__",
        "__le__",
        "__gt__",
        "__ge__",
    }
    assert issubclass(Operand, OperandMethods)
    assert Operand.__hash__ is object.__hash__  # type: ignore[comparison-overlap]
