"""`StreamingChatUser`: a locust user that streams chat completions and reports time to first token and
inter-token latency as their own rows (request types "TTFT" and "ITL") through `events.request.fire`.

Locust's own row for a streamed request measures only the time to the response headers; these rows
time the first SSE chunk that carries content and the gaps between later ones. Subclass it in a
locustfile (cases set `prompts`, `max_tokens`, `model`, `wait_time`), e.g. `scripts/locust_chat.py`:

    locust -f scripts/locust_chat.py --headless -u 20 -r 5 -t 60s --host http://127.0.0.1:8000 --csv out
"""

from __future__ import annotations

import json
import random
import time

from locust import HttpUser, between, task

DEFAULT_PROMPTS = [
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a hash table is in two sentences.",
    "Write a haiku about autumn.",
]


class StreamingChatUser(HttpUser):
    abstract = True
    wait_time = between(0.5, 1.5)
    prompts: list[str] = DEFAULT_PROMPTS
    max_tokens = 32
    model: str | None = None
    name = "/v1/chat/completions"

    def _fire(self, kind: str, seconds: float, length: int = 0, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(request_type=kind, name=self.name, response_time=seconds * 1000,
                                             response_length=length, exception=exception, context={})

    @task
    def chat(self) -> None:
        body = {"messages": [{"role": "user", "content": random.choice(self.prompts)}],
                "max_tokens": self.max_tokens, "stream": True}
        if self.model:
            body["model"] = self.model
        start = last = time.perf_counter()
        first = True
        with self.client.post("/v1/chat/completions", json=body, stream=True, catch_response=True,
                              name=self.name) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            done = False
            for line in response.iter_lines(decode_unicode=True):
                if not line or not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    done = True
                    break
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    response.failure(chunk["error"]["message"])
                    return
                content = "".join((c["delta"].get("content") or "") for c in chunk["choices"])
                if not content:
                    continue
                now = time.perf_counter()
                self._fire("TTFT" if first else "ITL", now - (start if first else last), len(content))
                first, last = False, now
            if not done:
                response.failure("stream ended without [DONE]")
            else:
                response.success()
