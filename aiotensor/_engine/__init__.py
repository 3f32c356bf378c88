"""The engine of a session: one op application, expressions, fetches, lifecycle, and which session evaluates.

``_core`` holds :class:`~aiotensor._engine._core.Engine`: its state and the path of one
op, with the methods of its other concerns bound from ``_lean``, ``_call``,
``_admission``, ``_expressions``, ``_fetch`` and ``_lifecycle``; ``_session_rule`` is
the one rule of which session evaluates. Importing this package imports none of them:
callers import the module they use.
"""
