"""An MLP served by FastAPI on uvicorn/uvloop, one aiotensor session per request.

``app`` is the aiotensor service; ``baselines`` holds the same service written with
plain NumPy in the handler and with ``asyncio.to_thread``, for ``benchmarks/bench_web.py``;
``server`` starts any of them as a real uvicorn process on 127.0.0.1.
"""
