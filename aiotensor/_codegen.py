"""Writes the surfaces derived from the op table as real source: ``python -m aiotensor._codegen``.

From each :class:`~aiotensor._opdef.OpDef` (its spec's signature and docstring):

- ``_session_ops.py``: the session's coroutine methods (``await s.add(a, b)``);
- ``_functional.py``: the module-level coroutine functions (``await at.add(a, b)``);
- the operator and ndarray-named methods of :class:`~aiotensor._expr.Operand`, between
  the markers in ``_expr.py`` (``a + b``, ``t.sum(axis=0)``: expressions).

Generated rather than built at import so that type checkers, IDEs and ``help()`` see
real signatures; ``tests/test_codegen.py`` fails when the files are stale. Adding an op
is one ``@op`` entry in ``_ops/`` and a run of this module.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from . import _ops as _ops
from ._opdef import ALIASES, BINARY_OPERATORS, OPS, UNARY_OPERATORS, OpDef

__all__ = ["generate", "main"]

HERE = Path(__file__).parent
BEGIN, END = (
    "    # --- generated: operand methods (python -m aiotensor._codegen) ---\n",
    "    # --- end generated ---\n",
)
_RETURNS = {"one": "Tensor", "list": "list[Tensor]", "any": "Tensor | tuple[Tensor, ...]"}

_BINARY = BINARY_OPERATORS
_UNARY = UNARY_OPERATORS
# ndarray-named methods: (method, op, its parameters after self, how they reach the spec).
_REDUCE = "axis: AxisLike = None, keepdims: bool = False"
_METHODS = [
    *[(m, m, _REDUCE, "axis=axis, keepdims=keepdims") for m in ("sum", "prod", "mean", "max", "min", "std", "var")],
    *[
        (m, m, "axis: int | None = None, keepdims: bool = False", "axis=axis, keepdims=keepdims")
        for m in ("argmax", "argmin")
    ],
    ("reshape", "reshape", "shape: ShapeLike", "shape"),
    ("astype", "astype", "dtype: DTypeLike", "dtype"),
    ("transpose", "permute_dims", "axes: Sequence[int] | None = None", "axes"),
    ("clip", "clip", "min: TensorLike | None = None, max: TensorLike | None = None", "min, max"),
    ("squeeze", "squeeze", "axis: AxisLike = None", "axis"),
]


def _params(d: OpDef) -> tuple[str, str, bool]:
    """The op's parameter list (with ``name``), the call passing them to its spec, and whether it has ``name``."""
    sig = inspect.signature(d.spec)
    parts: list[str] = []
    call: list[str] = []
    has_name = "name" in sig.parameters
    star = False
    slash_done = False
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        text = p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{text}")
            call.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{text}")
            call.append(f"**{p.name}")
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(text)
            call.append(f"{p.name}={p.name}")
        else:
            parts.append(text)
            if p.name != "name":
                call.append(p.name)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
            slash_done = True
    if not has_name and not any(p.kind is p.VAR_KEYWORD for p in params):
        if not star:
            parts.append("*")
        parts.append("name: str | None = None")
        has_name = True
    del slash_done
    return ", ".join(parts), ", ".join(call), has_name


def _doc(d: OpDef, indent: str) -> str:
    doc = inspect.cleandoc(d.spec.__doc__ or "")
    lines = doc.splitlines()
    body = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}' + (f"\n{body}\n{indent}" if len(lines) > 1 else "") + '"""\n'


def _body(d: OpDef, call: str, target: str, has_name: bool, indent: str) -> str:
    name = "name" if has_name else "None"
    ret = _RETURNS[d.returns]
    if d.elementwise:
        # The engine's synchronous lean path first: one coroutine frame fewer when it applies.
        args = f"({call}{',' if call.count(',') == 0 and call else ''})"
        return (
            f"{indent}engine = {target}\n"
            f"{indent}r = engine.lean(_{d.name}, {args}, {name})\n"
            f"{indent}if r is None:\n"
            f"{indent}    r = await engine.op(_{d.name}, {args}, None, None, {name})\n"
            f"{indent}return r\n"
        )
    if d.plain:
        prepared = f"({call}{',' if call.count(',') == 0 and call else ''}), None, None"
        return f"{indent}r: {ret} = await {target}.op(_{d.name}, {prepared}, {name})\n{indent}return r\n"
    return (
        f"{indent}p_args, p_kwargs, p_nbytes = _{d.name}.spec({call})\n"
        f"{indent}r: {ret} = await {target}.op(_{d.name}, p_args, p_kwargs, p_nbytes, {name})\n"
        f"{indent}return r\n"
    )


_HEADER = '''"""{doc} Generated by ``python -m aiotensor._codegen`` from the op table: do not edit."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._opdef import OPS
'''


def _surface() -> list[tuple[str, OpDef]]:
    """Each public name with its op: every op, then the aliases."""
    return [(d.name, d) for d in OPS.values()] + [(alias, OPS[name]) for alias, name in ALIASES.items()]


def _bindings() -> str:
    return "".join(f'_{d.name} = OPS["{d.name}"]\n' for d in OPS.values())


def session_ops() -> str:
    """The source of ``_session_ops.py``."""
    out = [
        _HEADER.format(doc="The session's op methods (``await s.add(a, b)``)."),
        "\nif TYPE_CHECKING:\n    from ._engine import Engine\n    from ._tensor import Tensor\n"
        "    from ._types import AxisLike, DTypeLike, ShapeLike, TensorLike\n\n",
        '__all__ = ["SessionOps"]\n\n',
        _bindings(),
        "\n\nclass SessionOps:\n"
        '    """Every op of the library as a coroutine method; the session provides ``_engine``."""\n\n'
        "    __slots__ = ()\n    _engine: Engine\n",
    ]
    for alias, d in _surface():
        params, call, has_name = _params(d)
        out.append(f"\n    async def {alias}(self, {params}) -> {_RETURNS[d.returns]}:\n")
        out.append(_doc(d, "        "))
        out.append(_body(d, call, "self._engine", has_name, "        "))
    return "".join(out)


def functional() -> str:
    """The source of ``_functional.py``."""
    out = [
        _HEADER.format(
            doc="Module-level ops: ``await at.add(a, b)`` runs in the session of its tensor arguments."
            "\n\nWith no tensor argument (``at.zeros(3)``) an op uses the default session (``with"
            " s.as_default():``\nor the open ``InteractiveSession``); with neither it raises"
            " :class:`NoSessionError`. When the\ndefault session is a child (``parent=``) of the"
            " tensors' session, the child runs the op and owns\nthe result. Each function is the"
            " session method of the same name.\n\n"
        ).replace(
            "from ._opdef import OPS\n",
            "from ._engine import engine_of\nfrom ._opdef import OPS\nfrom ._session_ops import SessionOps\n",
        ),
        "\nif TYPE_CHECKING:\n    from ._tensor import Tensor\n"
        "    from ._types import AxisLike, DTypeLike, ShapeLike, TensorLike\n\n",
        "__all__ = [\n" + "".join(f'    "{n}",\n' for n in sorted(name for name, _ in _surface())) + "]\n\n",
        _bindings(),
    ]
    for alias, d in _surface():
        params, call, has_name = _params(d)
        sig = inspect.signature(d.spec)
        kw = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
        pos = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var = [p.name for p in sig.parameters.values() if p.kind is p.VAR_POSITIONAL]
        varkw = [p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
        seen = "(" + ", ".join([*[p for p in pos if p != "name"], *[f"*{v}" for v in var]]) + ",)"
        seen_kw = "{" + ", ".join(f'"{k}": {k}' for k in kw) + "}" if kw else "None"
        if varkw:
            seen_kw = varkw[0]
        out.append(f"\n\nasync def {alias}({params}) -> {_RETURNS[d.returns]}:\n")
        out.append(_doc(d, "    "))
        out.append(_body(d, call, f"engine_of({seen}, {seen_kw})", has_name, "    "))
    out.append(
        "\n\n# The public namespace is aiotensor's; each function's docstring is its session method's.\n"
        "for _name in __all__:\n"
        "    _fn = globals()[_name]\n"
        '    _fn.__module__ = "aiotensor"\n'
        "    _fn.__doc__ = getattr(SessionOps, _name).__doc__\n"
    )
    return "".join(out)


def operand_methods() -> str:
    """The generated region of ``Operand`` in ``_expr.py``."""
    out = [BEGIN]
    for stem, name in _BINARY:
        doc = OPS[name].spec.__doc__ or ""
        first = doc.strip().splitlines()[0].rstrip(".")
        out.append(
            f"    def __{stem}__(self, other: TensorLike) -> Expr:\n"
            f'        """{first}, as an expression."""\n'
            f"        return Expr(_{OPS[name].name}, (self, other), None, None)\n\n"
            f"    def __r{stem}__(self, other: TensorLike) -> Expr:\n"
            f'        """{first} (reflected), as an expression."""\n'
            f"        return Expr(_{OPS[name].name}, (other, self), None, None)\n\n"
        )
    for stem, name in _UNARY:
        first = (OPS[name].spec.__doc__ or "").strip().splitlines()[0].rstrip(".")
        out.append(
            f"    def __{stem}__(self) -> Expr:\n"
            f'        """{first}, as an expression."""\n'
            f"        return Expr(_{name}, (self,), None, None)\n\n"
        )
    out.append(
        "    def __getitem__(self, key: Any) -> Expr:\n"
        '        """``x[key]`` with numpy indexing, as an expression."""\n'
        "        return Expr(_getitem, *_getitem.spec(self, key))\n\n"
    )
    for method, name, params, call in _METHODS:
        first = (OPS[name].spec.__doc__ or "").strip().splitlines()[0].rstrip(".")
        # numpy functions call these methods on non-ndarrays (np.mean(t) calls t.mean(axis=...,
        # dtype=..., out=...)): with numpy's extra keywords, answer as numpy would on np.asarray(t).
        keywords = ", ".join(f'"{k}": {k}' for k in (c.split("=")[0] for c in call.split(", ")))
        passed = f"{{{keywords}}}" if "=" in call else f"({call},)"
        out.append(
            f"    def {method}(self, {params}, **numpy_kwargs: Any) -> Expr:\n"
            f'        """{first}, as an expression (see ``AsyncEagerSession.{name}``)."""\n'
            f"        if numpy_kwargs:\n"
            f'            return _numpy_method(self, "{method}", {passed}, numpy_kwargs)\n'
            f"        return Expr(_{name}, *_{name}.spec(self, {call}))\n\n"
        )
    out[-1] = out[-1][:-1]
    out.append(END)
    return "".join(out)


def _expr_source(current: str) -> str:
    head, rest = current.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    names = sorted({n for _, n in _BINARY} | {n for _, n in _UNARY} | {n for _, n, _, _ in _METHODS} | {"getitem"})
    bindings = "".join(f'_{n} = OPS["{n}"]\n' for n in names)
    marker = "\n# generated bindings\n"
    tail = tail.split(marker)[0].rstrip("\n") + "\n" + marker + bindings
    return head + operand_methods() + tail


def generate() -> dict[Path, str]:
    """Every generated file's path and its up-to-date source."""
    expr = HERE / "_expr.py"
    return {
        HERE / "_session_ops.py": session_ops(),
        HERE / "_functional.py": functional(),
        expr: _expr_source(expr.read_text()),
    }


def main() -> int:
    """Write the generated files; with ``--check``, only report which are stale (exit 1)."""
    stale = [path for path, text in generate().items() if not path.exists() or path.read_text() != text]
    if "--check" in sys.argv:
        for path in stale:
            print(f"stale: {path}")
        return 1 if stale else 0
    for path, text in generate().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
