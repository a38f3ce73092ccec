"""K6 (handed.md H14): batching never changes greedy results (fp32 CPU path: identical tokens)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

PROMPT = "The three most important inventions in history are"
OTHERS = ["Write a haiku about the sea.", "1, 2, 3, 4,", "def fibonacci(n):", "The weather today is",
          "Translate to French: good morning", "My favourite food is", "Once upon a time"]


def _tokens(server, prompt: str) -> list[str]:
    body = {"prompt": prompt, "max_tokens": 24, "temperature": 0, "logprobs": 0, "ignore_eos": True}
    r = server.post("/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_h14_alone_equals_batched(server):
    alone = _tokens(server, PROMPT)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: _tokens(server, p), [PROMPT, *OTHERS]))
    assert results[0] == alone
