"""Locust users of the RAG chatbot: each asks a question from `questions.txt`, reads the streamed answer,
thinks (exponential, the workload's mean), asks again. TTFT and ITL are their own rows (request types "TTFT"
and "ITL"), fired through `events.request.fire`: locust's own row for a streamed request times only the
response headers.

    # the whole case (the app retrieves, builds the prompt, streams from the engine)
    locust -f case_rag_chatbot/loadtest/locustfile.py --headless -u 8 -r 2 -t 5m --host http://127.0.0.1:8080 \
        --csv case_rag_chatbot/loadtest/out/app
    # the engine directly: the app's prompt (its system prompt and prompt builder, no retrieval)
    locust -f case_rag_chatbot/loadtest/locustfile.py --headless -u 8 -r 2 -t 5m --host http://127.0.0.1:8000 \
        --rag-target engine --csv case_rag_chatbot/loadtest/out/engine

Options: `--rag-target app|engine`, `--rag-profile cpu|h200` (think time and answer length from
`workload.yaml`), `--think-time-mean-s`, `--max-tokens`, `--system-prompt-tokens` (engine target).
The app target posts `{"question": ..., "max_tokens": ...}` to `/chat` (`app/server.py`) and times its SSE
stream: each `event: token` (`data: {"text": ...}`) is a token event; `sources` and `done` are not, and an
`error` event fails the request.
"""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

from locust import HttpUser, events, task

HERE = Path(__file__).resolve().parent
CASE_DIR = HERE.parent
QUESTIONS = [line.strip() for line in (HERE / "questions.txt").read_text().splitlines()
             if line.strip() and not line.startswith("#")]


@events.init_command_line_parser.add_listener
def _options(parser) -> None:
    parser.add_argument("--rag-target", choices=["app", "engine"], default="app")
    parser.add_argument("--rag-profile", default="cpu", help="workload.yaml profile (think time, answer length)")
    parser.add_argument("--think-time-mean-s", type=float, default=0.0, help="0: the profile's")
    parser.add_argument("--max-tokens", type=int, default=0, help="0: the profile's longest answer")
    parser.add_argument("--system-prompt-tokens", type=int, default=0, help="engine target; 0: the profile's")


def _profile(name: str) -> dict:
    import yaml

    return yaml.safe_load((CASE_DIR / "workload.yaml").read_text())["profiles"][name]


def _engine_messages(question: str, system_prompt_tokens: int) -> list[dict]:
    """The app's own system prompt and prompt order, without retrieval (the app is not in the path)."""
    if str(CASE_DIR) not in sys.path:
        sys.path.insert(0, str(CASE_DIR))
    from app.prompt import build_messages
    from app.system_prompt import load_system_prompt

    return build_messages(load_system_prompt(system_prompt_tokens), [], question, context_first=False)


class RagChatUser(HttpUser):
    def on_start(self) -> None:
        o = self.environment.parsed_options
        profile = _profile(o.rag_profile)
        self.think_mean = o.think_time_mean_s or float(profile["think_time_s"]["mean"])
        self.max_tokens = o.max_tokens or int(profile["answer_tokens"]["max"])
        self.target = o.rag_target
        self.system_prompt_tokens = o.system_prompt_tokens or int(profile["system_prompt_tokens"])
        self.rng = random.Random()

    def wait_time(self) -> float:
        return self.rng.expovariate(1.0 / self.think_mean)

    def _fire(self, kind: str, name: str, seconds: float, length: int = 0) -> None:
        self.environment.events.request.fire(request_type=kind, name=name, response_time=seconds * 1000,
                                             response_length=length, exception=None, context={})

    @task
    def ask(self) -> None:
        question = self.rng.choice(QUESTIONS)
        if self.target == "app":
            path, body = "/chat", {"question": question, "max_tokens": self.max_tokens}
        else:
            path = "/v1/chat/completions"
            body = {"messages": _engine_messages(question, self.system_prompt_tokens), "stream": True,
                    "max_tokens": self.max_tokens}
        start = last = time.perf_counter()
        first = True
        with self.client.post(path, json=body, stream=True, catch_response=True, name=path) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            for line in response.iter_lines(decode_unicode=True):
                text = _token_text(line)
                if text is None:
                    continue
                if isinstance(text, Exception):
                    response.failure(str(text))
                    return
                now = time.perf_counter()
                self._fire("TTFT" if first else "ITL", path, now - (start if first else last), len(text))
                first, last = False, now
            if first:
                response.failure("no answer text in the stream")
            else:
                response.success()


def _token_text(line: str | None):
    """The answer text an SSE line carries, None for anything else (sources, usage, [DONE], blank), or an
    Exception for an error event. Engine chunks (`choices[].delta.content`) and the app's events
    (`{"type": "token", "text": ...}` or `{"delta": ...}`) are both understood."""
    if not line or not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        return payload  # a plain-text data line is answer text
    if not isinstance(event, dict):
        return None
    if "error" in event:
        return RuntimeError(str(event["error"]))
    if event.get("choices"):
        text = "".join((c.get("delta") or {}).get("content") or "" for c in event["choices"])
        return text or None
    for key in ("text", "delta", "token", "content"):
        if isinstance(event.get(key), str) and event.get("type", "token") in ("token", "delta", "text"):
            return event[key] or None
    return None
