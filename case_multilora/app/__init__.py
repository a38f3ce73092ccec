"""The multi-LoRA case's gateway: API key -> tenant -> adapter, per-tenant cache salt, rate limits and metrics,
streaming proxy to the engine's OpenAI API (`server.create_app`)."""
