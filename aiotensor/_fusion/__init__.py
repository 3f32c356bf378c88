"""Fused and batched functions: several ops run as one kernel.

``_function`` holds fused functions (:func:`~aiotensor.function`: ``FusedOps``,
``FusedValue``, ``FusedFunction``), ``_batching`` batched functions
(:func:`~aiotensor.batched`: concurrent calls grouped into one kernel call), whose kernel
is ``_batch_kernel``. Both drive the one step executor (``aiotensor._programs._interpreter``) with
the user's Python, and the one cost model (``aiotensor._programs._placement``) decides inline or
pool for them, learnt from their runs. Importing this package imports none of them: callers import the module they use.
"""
