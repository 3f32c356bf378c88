"""An MLP served by FastAPI on uvicorn/uvloop, one aiotensor session per request.

``app.app`` is the aiotensor service (``app.fused_app`` the same with each forward pass
fused into one op); ``baselines`` holds the same service written with plain NumPy in
the handler and with ``asyncio.to_thread``, for ``benchmarks/bench_web.py``; ``server``
starts any of them as a real uvicorn process on 127.0.0.1.

Run: ``uvicorn --app-dir examples web_service.app:app --loop uvloop``.
"""
