"""QACE reward service: an HTTP server (FastAPI/uvicorn) that micro-batches requests into one engine.

Needs the ``serve`` extra (``fastapi``, ``uvicorn``; the client needs ``httpx``). See docs/rewards.md.
"""
