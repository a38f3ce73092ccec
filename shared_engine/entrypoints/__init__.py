"""User-facing entry points: the offline `LLM` API (and, later, the OpenAI-compatible server)."""
