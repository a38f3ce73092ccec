"""`AppSettings`: the app's whole configuration, read once from the environment.

| variable | default | meaning |
|---|---|---|
| `ENGINE_URL` | `http://127.0.0.1:8000/v1` | the engine's OpenAI base URL |
| `ENGINE_MODEL` | unset (the engine's only model) | `model` sent in each request |
| `ENGINE_API_KEY` | unset | bearer token for the engine (its `--api-key`) |
| `CHROMA_URL` | unset | a Chroma server, e.g. `http://127.0.0.1:8001`; unset: embedded Chroma in `CHROMA_DIR` |
| `CHROMA_DIR` | `$SHARED_ENGINE_CACHE/rag_chroma` | the embedded store's directory |
| `CHROMA_COLLECTION` | `python_docs` | collection name |
| `SYSTEM_PROMPT_TOKENS` | 4096 (the brief's 4k prompt) | system prompt budget; the CPU runs use 1024 |
| `RAG_TOP_K` | 4 | excerpts retrieved per question |
| `RAG_MAX_TOKENS` | 256 | answer length cap per request |
| `RAG_REPETITION_PENALTY` | 1.1 | vLLM's `repetition_penalty` (1 = off): small models loop without it |
| `RAG_CONTEXT_FIRST` | 0 | 1: the first attempt's order (excerpts before the system prompt) |
| `RAG_CORPUS_TOPICS` | unset (every topic) | comma-separated pydoc topics to ingest (a small corpus for smoke tests) |
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("SHARED_ENGINE_CACHE", Path.home() / ".cache" / "shared_engine"))


def _flag(value: str) -> bool:
    return value.strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class AppSettings:
    engine_url: str = "http://127.0.0.1:8000/v1"
    engine_model: str | None = None
    engine_api_key: str | None = None
    chroma_url: str | None = None
    chroma_dir: Path = cache_root() / "rag_chroma"
    collection: str = "python_docs"
    system_prompt_tokens: int = 4096
    top_k: int = 4
    max_tokens: int = 256
    repetition_penalty: float = 1.1
    context_first: bool = False
    corpus_topics: tuple[str, ...] = ()  # empty: the whole corpus

    def __post_init__(self) -> None:
        if not 1 <= self.top_k <= 20:
            raise ValueError(f"RAG_TOP_K must be in [1, 20], got {self.top_k}")
        if not 1 <= self.max_tokens <= 4096:
            raise ValueError(f"RAG_MAX_TOKENS must be in [1, 4096], got {self.max_tokens}")
        if self.system_prompt_tokens < 64:
            raise ValueError(f"SYSTEM_PROMPT_TOKENS must be at least 64, got {self.system_prompt_tokens}")
        if not 0 < self.repetition_penalty <= 2:
            raise ValueError(f"RAG_REPETITION_PENALTY must be in (0, 2], got {self.repetition_penalty}")

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> AppSettings:
        """Settings from `env` (default: `os.environ`); unset or empty variables keep the defaults.

        Raises:
            ValueError: a number that does not parse or is out of range.
        """
        env = os.environ if env is None else env
        get = lambda name: env.get(name) or None
        kwargs = {
            "engine_url": get("ENGINE_URL"), "engine_model": get("ENGINE_MODEL"),
            "engine_api_key": get("ENGINE_API_KEY"), "chroma_url": get("CHROMA_URL"),
            "chroma_dir": Path(get("CHROMA_DIR")) if get("CHROMA_DIR") else cache_root() / "rag_chroma",
            "collection": get("CHROMA_COLLECTION"),
            "system_prompt_tokens": get("SYSTEM_PROMPT_TOKENS"), "top_k": get("RAG_TOP_K"),
            "max_tokens": get("RAG_MAX_TOKENS"), "repetition_penalty": get("RAG_REPETITION_PENALTY"),
            "context_first": _flag(get("RAG_CONTEXT_FIRST")) if get("RAG_CONTEXT_FIRST") else None,
            "corpus_topics": tuple(t.strip() for t in get("RAG_CORPUS_TOPICS").split(",") if t.strip())
            if get("RAG_CORPUS_TOPICS") else None,
        }
        for name in ("system_prompt_tokens", "top_k", "max_tokens"):
            if kwargs[name] is not None:
                kwargs[name] = int(kwargs[name])
        if kwargs["repetition_penalty"] is not None:
            kwargs["repetition_penalty"] = float(kwargs["repetition_penalty"])
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
