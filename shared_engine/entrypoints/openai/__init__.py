"""The OpenAI-compatible HTTP server (`python -m shared_engine serve`).

Needs the `server` extra (fastapi, uvicorn, pydantic, prometheus-client); nothing outside this package
imports it, so `import shared_engine` and the offline `LLM` API work without those packages.
"""
