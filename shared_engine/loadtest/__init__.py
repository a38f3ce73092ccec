"""Reusable load tests against the OpenAI-compatible server (locust; needs the `test` extra)."""
