"""The seams between layers, as protocols: what a lower module may ask of a higher one.

Tensors and expressions (``_tensor``, ``_expr``) sit below the engine that owns their
buffers, and the engine below the session facade that holds it (the import contract in
``pyproject.toml``). Where a lower module holds an object of a higher one, it is typed
by the protocol here, not ``Any``: :class:`EngineLike` is what a tensor or an
expression asks of its engine (``_engine.Engine`` implements it), :class:`SessionLike`
what the engine asks of its session (``_session.AsyncEagerSession`` implements it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ._types import NDArray

__all__ = ["EngineLike", "SessionLike"]


class SessionLike(Protocol):
    """The session facade as the engine and the default-session machinery see it."""

    @property
    def _engine(self) -> EngineLike: ...


class EngineLike(Protocol):
    """An engine as its tensors and expressions see it: fetches, peeks and evaluation."""

    @property
    def session(self) -> SessionLike:
        """The session facade this engine serves."""
        ...

    @property
    def ancestors(self) -> tuple[EngineLike, ...]:
        """The engines of the parent sessions, nearest first: their tensors are readable here."""
        ...

    async def fetch(self, tensors: list[Any], api: str) -> list[NDArray]:
        """Copies of the tensors' values, owned by the caller."""
        ...

    def fetch_now(self, t: Any) -> NDArray | None:
        """A copy of this engine's tensor's value if it takes no await, else ``None`` (then ``fetch``)."""
        ...

    def peek(self, t: Any) -> NDArray:
        """A read-only view of a local buffer, without suspending."""
        ...

    def evaluate_expr(self, expr: Any) -> Any:
        """``await expr``: its tensor at once, or a coroutine giving it."""
        ...

    async def run_values(self, fetches: list[Any], api: str, *, explicit: bool = True) -> list[Any]:
        """The numpy values of tensors and expressions (``e.eval()``, ``s.run``)."""
        ...
