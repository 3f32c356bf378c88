"""Fused and batched functions: several ops run as one kernel.

``_function`` holds fused functions (:func:`~aiotensor.function`: ``FusedOps``,
``FusedValue``, ``FusedFunction``), ``_batching`` batched functions
(:func:`~aiotensor.batched`: concurrent calls grouped into one kernel call), whose kernel
is ``_batch_kernel``; ``_placement`` decides inline or pool for both, learnt from their
runs. Importing this package imports none of them: callers import the module they use.
"""
