"""Multi-op kernels, below the engine: expressions compiled into programs and every op run by one interpreter.

``_compile`` turns an expression into a :class:`~aiotensor._programs._program.Program`
(order, common subexpressions, drop after last use, the compiled-program cache);
``_program`` holds the program and its steps; ``_interpreter`` is the one step executor
of multi-op kernels (programs, fused and batched functions); ``_placement`` is the one
cost model that decides inline or pool; ``_blocked`` rewrites runs of element-wise
steps on large inputs into one blocked step (its kernels: ``_blocked_run`` with
``_blocked_layout`` and ``_blocked_split``, ``_blocked_var``, ``_blocked_center``).
Importing this package imports none of them: callers import the module they use.
"""
