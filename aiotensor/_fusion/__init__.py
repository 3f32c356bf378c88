"""Fused and batched functions: several ops run as one kernel.

Fused functions (:func:`~aiotensor.function`): ``_function`` holds ``FusedFunction`` (the
call: arguments read, placement, the kernel run), ``_fused_ops`` its ``ops``
(``FusedOps``, the driver of the one step executor), ``_fused_value`` the values they take
and return (``FusedValue``), ``_remote`` a call on a backend out of this process, and
``_arguments`` the reading of a call's arguments (buffers, expressions, placement keys).
Batched functions (:func:`~aiotensor.batched`: concurrent calls grouped into one kernel
call): ``_batching`` the function and its calls, ``_batch_task`` a group's task and
kernel call, ``_batch_delivery`` the sessions and each caller's rows, ``_batch_kernel``
the kernel. Both drive the one step executor (``aiotensor._programs._interpreter``) with
the user's Python, and the one cost model (``aiotensor._programs._placement``) decides inline or
pool for them, learnt from their runs. Importing this package imports none of them: callers import the module they use.
"""
