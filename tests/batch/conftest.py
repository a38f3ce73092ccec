"""Fixtures for the batch case: one default-model `LLM` for the module, and small batch files."""

from __future__ import annotations

import json

import pytest

SYSTEM = "Summarise the support ticket as JSON with keys issue, product, sentiment, next_action."


def chat_row(custom_id, text: str, max_tokens: int = 4, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                     "temperature": 0.0, "max_completion_tokens": max_tokens, **body}}


def write_lines(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


@pytest.fixture(scope="module")
def batch_llm(default_model_dir):
    from shared_engine import LLM

    return LLM(str(default_model_dir), max_model_len=512, max_num_seqs=16, max_num_batched_tokens=1024,
               kv_cache_memory=64 * 2**20)
