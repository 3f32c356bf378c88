"""Writes the surfaces derived from the op table as real source: ``python -m aiotensor._codegen``.

From each :class:`~aiotensor._opdef.OpDef` (its spec's signature and docstring):

- ``_generated_session_ops.py``: the session's coroutine methods (``await s.add(a, b)``);
- ``_generated_functional.py``: the module-level coroutine functions (``await at.add(a, b)``);
- ``_generated_operand.py``: the operators and ndarray-named methods that
  :class:`~aiotensor._operand.Operand` inherits (``a + b``, ``t.sum(axis=0)``: expressions);
- ``xp/_generated_*.py``: the lazy functions of :mod:`aiotensor.xp` and its ``linalg`` and
  ``fft`` extensions, one per standard name whose op is in the table (``_xpnames``).

Generated rather than built at import so that type checkers, IDEs and ``help()`` see
real signatures; ``tests/test_codegen.py`` fails when the files are stale. They are
written through ``ruff format`` (of the ``test`` extra), so they read like the
hand-written ones. Adding an op
is one ``@op`` entry in ``_ops/`` and a run of this module.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from pathlib import Path

from . import _ops as _ops
from . import _xpnames
from ._opdef import ALIASES, BINARY_OPERATORS, COMPARISON_OPERATORS, OPS, UNARY_OPERATORS, OpDef

__all__ = ["generate", "main"]

HERE = Path(__file__).parent
_RETURNS = {"one": "Tensor", "list": "list[Tensor]", "any": "Tensor | tuple[Tensor, ...]"}


def _result_type(d: OpDef) -> type | None:
    """The named tuple an op's results come in (``result=UniqueAllResult._make``), or None."""
    owner = getattr(d.result, "__self__", None)
    return owner if isinstance(owner, type) else None


def _returns(d: OpDef) -> str:
    """The return annotation of the op's coroutines (a ``result`` makes the list a tuple, maybe named)."""
    if d.result is None:
        return _RETURNS[d.returns]
    named = _result_type(d)
    if named is None:
        return "tuple[Tensor, ...]"
    return f"{named.__name__}[Tensor]" if getattr(named, "__parameters__", ()) else named.__name__


def _result_imports() -> str:
    """The type-checking imports of the named tuples ops return (``    from ._ops._search import ...``)."""
    by_module: dict[str, set[str]] = {}
    for d in OPS.values():
        named = _result_type(d)
        if named is not None:
            by_module.setdefault(named.__module__.replace("aiotensor.", "."), set()).add(named.__name__)
    return "".join(f"    from {m} import {', '.join(sorted(n, key=str.lower))}\n" for m, n in sorted(by_module.items()))


# Only operators whose op exists: a new op of the standard's name brings its operator.
_BINARY = [(stem, name) for stem, name in BINARY_OPERATORS if name in OPS]
_COMPARE = [(stem, name) for stem, name in COMPARISON_OPERATORS if name in OPS]
_UNARY = [(stem, name) for stem, name in UNARY_OPERATORS if name in OPS]
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


def _signature(d: OpDef, keep_name: bool) -> tuple[list[str], list[str], list[str], list[str], bool]:
    """The op's spec parameters as source: (parameter list, positional args, keyword-only names, ``**``
    names, whether the list has a ``*``).

    Without ``keep_name``, a ``name`` parameter is left out (aiotensor.xp's functions have none).
    """
    params = [p for p in inspect.signature(d.spec).parameters.values() if keep_name or p.name != "name"]
    parts: list[str] = []
    pos: list[str] = []
    kwonly: list[str] = []
    varkw: list[str] = []
    star = False
    for i, p in enumerate(params):
        text = p.name if p.annotation is inspect.Parameter.empty else f"{p.name}: {p.annotation}"
        if p.default is not inspect.Parameter.empty:
            text += f" = {p.default!r}"
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{text}")
            pos.append(f"*{p.name}")
            star = True
        elif p.kind is p.VAR_KEYWORD:
            parts.append(f"**{text}")
            varkw.append(p.name)
        elif p.kind is p.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(text)
            kwonly.append(p.name)
        else:
            parts.append(text)
            if p.name != "name":
                pos.append(p.name)
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params) or params[i + 1].kind is not p.POSITIONAL_ONLY):
            parts.append("/")
    return parts, pos, kwonly, varkw, star


def _params(d: OpDef) -> tuple[str, str, bool]:
    """The op's parameter list (with ``name``), the call passing them to its spec, and whether it has ``name``."""
    parts, pos, kwonly, varkw, star = _signature(d, keep_name=True)
    has_name = "name" in inspect.signature(d.spec).parameters
    call = [*pos, *(f"{k}={k}" for k in kwonly), *(f"**{k}" for k in varkw)]
    if not has_name and not varkw:
        if not star:
            parts.append("*")
        parts.append("name: str | None = None")
        has_name = True
    return ", ".join(parts), ", ".join(call), has_name


def _doc(d: OpDef, indent: str) -> str:
    doc = inspect.cleandoc(d.spec.__doc__ or "")
    lines = doc.splitlines()
    body = "\n".join((indent + line) if line else "" for line in lines[1:])
    return f'{indent}"""{lines[0]}' + (f"\n{body}\n{indent}" if len(lines) > 1 else "") + '"""\n'


def _body(d: OpDef, call: str, target: str, has_name: bool, indent: str) -> str:
    name = "name" if has_name else "None"
    ret = _returns(d)
    if d.lean:
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


_HEADER = '''"""{doc}

Generated by ``python -m aiotensor._codegen`` from the op table (``_opdef.py``, ``_ops/``): do not edit.
Each op is a thin forwarder: its spec checks the arguments, ``Engine.op`` does the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ._opdef import OPS
'''


def _natural(name: str) -> list[str | int]:
    """Sort key ordering digit runs by value (``log2`` before ``log10``), as ruff's RUF022 wants ``__all__``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _surface() -> list[tuple[str, OpDef]]:
    """Each public name with its op: every op, then the aliases."""
    return [(d.name, d) for d in OPS.values()] + [(alias, OPS[name]) for alias, name in ALIASES.items()]


def _bindings() -> str:
    return "".join(f'_{d.name} = OPS["{d.name}"]\n' for d in OPS.values())


def session_ops() -> str:
    """The source of ``_generated_session_ops.py``."""
    out = [
        _HEADER.format(doc="The session's op methods (``await s.add(a, b)``)."),
        "\nif TYPE_CHECKING:\n    from ._engine._core import Engine\n"
        + _result_imports()
        + "    from ._tensor import Tensor\n"
        "    from ._types import AxisLike, DTypeLike, ShapeLike, TensorLike\n\n",
        '__all__ = ["SessionOps"]\n\n',
        _bindings(),
        "\n\nclass SessionOps:\n"
        '    """Every op of the library as a coroutine method; the session provides ``_engine``."""\n\n'
        "    __slots__ = ()\n    _engine: Engine\n",
    ]
    for alias, d in _surface():
        params, call, has_name = _params(d)
        out.append(f"\n    async def {alias}(self, {params}) -> {_returns(d)}:\n")
        out.append(_doc(d, "        "))
        out.append(_body(d, call, "self._engine", has_name, "        "))
    return "".join(out)


def functional() -> str:
    """The source of ``_generated_functional.py``."""
    out = [
        _HEADER.format(
            doc="Module-level ops: ``await at.add(a, b)`` runs in the session of its tensor arguments."
            "\n\nWith no tensor argument (``at.zeros(3)``) an op uses the default session (``with"
            " s.as_default():``\nor the open ``InteractiveSession``); with neither it raises"
            " :class:`NoSessionError`. When the\ndefault session is a child (``parent=``) of the"
            " tensors' session, the child runs the op and owns\nthe result. Each function is the"
            " session method of the same name."
        ).replace(
            "from ._opdef import OPS\n",
            "from ._engine._session_rule import engine_of\n"
            "from ._generated_session_ops import SessionOps\n"
            "from ._opdef import OPS\n",
        ),
        "\nif TYPE_CHECKING:\n" + _result_imports() + "    from ._tensor import Tensor\n"
        "    from ._types import AxisLike, DTypeLike, ShapeLike, TensorLike\n\n",
        "__all__ = [\n"
        + "".join(f'    "{n}",\n' for n in sorted((name for name, _ in _surface()), key=_natural))
        + "]\n\n",
        _bindings(),
    ]
    for alias, d in _surface():
        params, call, has_name = _params(d)
        sig = inspect.signature(d.spec)
        kw = [p.name for p in sig.parameters.values() if p.kind is p.KEYWORD_ONLY]
        pos = [p.name for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        var = [p.name for p in sig.parameters.values() if p.kind is p.VAR_POSITIONAL]
        varkw = [p.name for p in sig.parameters.values() if p.kind is p.VAR_KEYWORD]
        items = [*[p for p in pos if p != "name"], *[f"*{v}" for v in var]]
        # (a trailing comma only where a 1-tuple needs it: ruff format would explode the rest)
        seen = "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
        seen_kw = "{" + ", ".join(f'"{k}": {k}' for k in kw) + "}" if kw else "None"
        if varkw:
            seen_kw = varkw[0]
        out.append(f"\n\nasync def {alias}({params}) -> {_returns(d)}:\n")
        out.append(_doc(d, "    "))
        out.append(_body(d, call, f'engine_of({seen}, {seen_kw}, "{d.name}")', has_name, "    "))
    out.append(
        "\n\n# The public namespace is aiotensor's; each function's docstring is its session method's.\n"
        "for _name in __all__:\n"
        "    _fn = globals()[_name]\n"
        '    _fn.__module__ = "aiotensor"\n'
        "    _fn.__doc__ = getattr(SessionOps, _name).__doc__\n"
    )
    return "".join(out)


def operand() -> str:
    """The source of ``_generated_operand.py``."""
    names = sorted({n for _, n in (*_BINARY, *_COMPARE, *_UNARY)} | {n for _, n, _, _ in _METHODS} | {"getitem"})
    out = [
        '''"""The operators and ndarray-named methods of tensors and expressions (``a + b``, ``t.sum(axis=0)``).

Generated by ``python -m aiotensor._codegen`` from the op table (``_opdef.py``, ``_ops/``): do not edit.
Each method builds an :class:`~aiotensor._expr.Expr` of its op (checked by the op's spec where
it has one); :class:`~aiotensor._operand.Operand`, which tensors and expressions share, inherits them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._opdef import OPS

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ._expr import Expr
    from ._types import AxisLike, DTypeLike, ShapeLike, TensorLike

__all__ = ["OperandMethods"]

''',
        "".join(f'_{n} = OPS["{n}"]\n' for n in names),
        "\n\nclass OperandMethods:\n"
        '    """The operators and ndarray-named methods of :class:`~aiotensor._operand.Operand`, as expressions."""\n\n'
        "    __slots__ = ()\n\n",
    ]
    for stem, name in _BINARY:
        doc = OPS[name].spec.__doc__ or ""
        first = doc.strip().splitlines()[0].rstrip(".")
        out.append(
            f"    def __{stem}__(self, other: TensorLike) -> Expr:\n"
            f'        """{first}, as an expression."""\n'
            f"        return _expr.Expr(_{OPS[name].name}, (self, other), None, None)\n\n"
            f"    def __r{stem}__(self, other: TensorLike) -> Expr:\n"
            f'        """{first} (reflected), as an expression."""\n'
            f"        return _expr.Expr(_{OPS[name].name}, (other, self), None, None)\n\n"
        )
    for stem, name in _COMPARE:
        first = (OPS[name].spec.__doc__ or "").strip().splitlines()[0].rstrip(".")
        ignore = "  # type: ignore[override]" if stem in ("eq", "ne") else ""  # object's return bool
        out.append(
            f"    def __{stem}__(self, other: TensorLike) -> Expr:{ignore}\n"
            f'        """{first}, as an expression."""\n'
            f"        return _expr.Expr(_{name}, (self, other), None, None)\n\n"
        )
    for stem, name in _UNARY:
        first = (OPS[name].spec.__doc__ or "").strip().splitlines()[0].rstrip(".")
        out.append(
            f"    def __{stem}__(self) -> Expr:\n"
            f'        """{first}, as an expression."""\n'
            f"        return _expr.Expr(_{name}, (self,), None, None)\n\n"
        )
    if "positive" not in OPS:  # until the table has the op: +x is x[...] (a copy of any dtype)
        out.append(
            "    def __pos__(self) -> Expr:\n"
            '        """Element-wise ``+x`` (a copy), as an expression."""\n'
            "        return _expr.Expr(_getitem, (self, Ellipsis), None, None)\n\n"
        )
    out.append(
        "    def __getitem__(self, key: Any) -> Expr:\n"
        '        """``x[key]`` with numpy indexing, as an expression."""\n'
        "        return _expr.Expr(_getitem, *_getitem.spec(self, key))\n\n"
    )
    for method, name, params, call in _METHODS:
        first = (OPS[name].spec.__doc__ or "").strip().splitlines()[0].rstrip(".")
        # numpy functions call these methods on non-ndarrays (np.mean(t) calls t.mean(axis=...,
        # dtype=..., out=...)): with numpy's extra keywords, answer as numpy would on np.asarray(t).
        keywords = ", ".join(f'"{k}": {k}' for k in (c.split("=")[0] for c in call.split(", ")))
        # (a trailing comma only where a 1-tuple needs it: ruff format would explode the rest)
        passed = f"{{{keywords}}}" if "=" in call else f"({call}{',' if ',' not in call else ''})"
        out.append(
            f"    def {method}(self, {params}, **numpy_kwargs: Any) -> Expr:\n"
            f'        """{first}, as an expression (see ``AsyncEagerSession.{name}``)."""\n'
            f"        if numpy_kwargs:\n"
            f'            return _expr.numpy_method(self, "{method}", {passed}, numpy_kwargs)\n'
            f"        return _expr.Expr(_{name}, *_{name}.spec(self, {call}))\n\n"
        )
    out[-1] = out[-1][:-1]
    out.append(
        "\n\n# Last: _operand's Operand inherits the class above, and these methods build _expr's Expr\n"
        "# (_expr imports _operand, which imports this module, first: its Expr exists by the time a method runs).\n"
        "from . import _expr  # noqa: E402\n"
    )
    return "".join(out)


def _xp_params(d: OpDef) -> tuple[str, str, str]:
    """The op's parameters without ``name``; its positional args and keyword args as call source."""
    parts, pos, kwonly, varkw, _ = _signature(d, keep_name=False)
    args = "(" + ", ".join(pos) + ("," if len(pos) == 1 else "") + ")"
    kw = [*(f'"{k}": {k}' for k in kwonly), *(f"**{k}" for k in varkw)]
    kwargs = "{" + ", ".join(kw) + "}" if kw else "None"
    return ", ".join(parts), args, kwargs


def xp_functions(names: list[str], extension: str | None) -> str:
    """The source of one generated module of :mod:`aiotensor.xp` (``extension``: None, linalg or fft)."""
    where = f"aiotensor.xp.{extension}" if extension else "aiotensor.xp"
    chosen = [
        (n, OPS[_xpnames.op_for(n, extension)])
        for n in names
        if n not in _xpnames.HAND_WRITTEN
        and not (extension == "linalg" and n in _xpnames.LINALG_MAIN)
        and _xpnames.op_for(n, extension) in OPS
    ]
    out = [
        f'"""The lazy functions of ``{where}`` that are one op of the table each.\n\n'
        'Generated by ``python -m aiotensor._codegen`` from the op table and ``_xpnames``: do not edit.\n"""\n\n'
        "from __future__ import annotations\n\n"
        "from typing import TYPE_CHECKING\n\n"
        "from .._opdef import OPS\n"
        "from ._node import node, results\n\n"
        "if TYPE_CHECKING:\n"
        "    # (the names the ops' annotations may use)\n"
        "    from collections.abc import Callable, Sequence\n"
        "    from typing import Any, Literal\n\n"
        "    from .._expr import Expr\n"
        "    from .._types import AxisLike, DTypeLike, ShapeLike, TensorLike\n\n"
        "__all__ = [" + ", ".join(f'"{n}"' for n in sorted((n for n, _ in chosen), key=_natural)) + "]\n\n",
    ]
    out += [f'_{d.name} = OPS["{d.name}"]\n' for d in dict.fromkeys(d for _, d in chosen)]
    for n, d in chosen:
        params, args, kwargs = _xp_params(d)
        many = d.returns != "one"  # several results: a tuple of expressions reading one node
        out.append(f"\n\ndef {n}({params}) -> {'tuple[Expr, ...]' if many else 'Expr'}:\n")
        doc = inspect.cleandoc(d.spec.__doc__ or "").splitlines() or [n]
        body = "\n".join(("    " + line) if line else "" for line in doc[1:])
        out.append(f'    """{doc[0]}\n\n    Lazy: an expression, evaluated when awaited (see ``{d.name}``).\n')
        out.append((f"{body}\n" if body else "") + '    """\n')
        out.append(f"    return {'results' if many else 'node'}(_{d.name}, {args}, {kwargs})\n")
    return "".join(out)


def _formatted(path: Path, source: str) -> str:
    """``source`` as ``ruff format`` writes it with the project's settings: formatted like the rest."""
    done = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--stdin-filename", str(path), "-"],
        input=source,
        capture_output=True,
        text=True,
        check=True,
        cwd=HERE.parent,
    )
    return done.stdout


def generate() -> dict[Path, str]:
    """Every generated file's path and its up-to-date source."""
    xp = HERE / "xp"
    modules = {
        HERE / "_generated_operand.py": operand(),
        HERE / "_generated_session_ops.py": session_ops(),
        HERE / "_generated_functional.py": functional(),
        xp / "_generated_main.py": xp_functions(list(_xpnames.MAIN), None),
        xp / "_generated_linalg.py": xp_functions(list(_xpnames.LINALG), "linalg"),
        xp / "_generated_fft.py": xp_functions(list(_xpnames.FFT), "fft"),
    }
    return {path: _formatted(path, text) for path, text in modules.items()}


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
