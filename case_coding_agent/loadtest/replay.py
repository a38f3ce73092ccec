"""`replay`: a session trace against an OpenAI-compatible server (nginx in front of the replicas), each
session a closed loop: turn 1 at its timestamp, turn k+1 the trace's gap after turn k finished (the tool
pause). Every turn streams `/v1/completions` with the session's whole prompt text, `max_tokens` = the
trace's output length (`ignore_eos`, greedy) and the session id in `X-Session-Id`.

Per turn it records the send time, the first and every later content chunk's arrival, the usage (prompt and
cached tokens) and the replica nginx chose (`X-Upstream-Addr`). Times are seconds since the replay began.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import httpx

from case_coding_agent.loadtest.trace import TraceRecord, sessions


@dataclass
class TurnResult:
    request_id: str
    session_id: str
    turn: int
    kind: str  # read, edit, cold (session_gen.py)
    start_s: float
    first_token_s: float | None = None
    end_s: float | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    chunk_times_s: list[float] = field(default_factory=list)  # every content chunk's arrival
    replica: str | None = None
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s

    @property
    def tpot_s(self) -> float | None:
        """(last chunk - first chunk) / (output tokens - 1): per-token decode time, speculation included."""
        if self.first_token_s is None or self.output_tokens < 2 or not self.chunk_times_s:
            return None
        return (self.chunk_times_s[-1] - self.first_token_s) / (self.output_tokens - 1)


async def run_turn(client: httpx.AsyncClient, base_url: str, model: str, record: TraceRecord,
                   prompt: str | list[int], kind: str, t0: float) -> TurnResult:
    body = {"model": model, "prompt": prompt, "max_tokens": record.output_length, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    out = TurnResult(record.request_id, record.session_id, record.turn, kind, time.monotonic() - t0)
    try:
        async with client.stream("POST", base_url + "/v1/completions", json=body,
                                 headers={"X-Session-Id": record.session_id}) as response:
            out.replica = response.headers.get("x-upstream-addr")
            if response.status_code != 200:
                out.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
                return out
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = json.dumps(chunk["error"])[:300]
                    break
                now = time.monotonic() - t0
                if chunk.get("choices") and chunk["choices"][0].get("text"):
                    out.first_token_s = out.first_token_s if out.first_token_s is not None else now
                    out.chunk_times_s.append(now)
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    out.prompt_tokens, out.output_tokens = usage["prompt_tokens"], usage["completion_tokens"]
                    out.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    except httpx.HTTPError as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    out.end_s = time.monotonic() - t0
    return out


async def replay(base_url: str, model: str, records: list[TraceRecord], prompts: dict[str, dict],
                 timeout_s: float = 1800.0, token_ids=None, deadline_s: float | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, on_deadline=None) -> list[TurnResult]:
    """Every session of `records` concurrently; `prompts`: request_id → prompts.jsonl row (its `append`
    text and `kind`). `token_ids(record) -> list[int]`: send those ids instead of the texts (dummy weights:
    `trace.synthetic_token_ids`). `deadline_s` (seconds from the start, None: none): turns still running then
    are cancelled (their connections closed) and not returned, nor are the turns not yet sent. Returns the
    turns that finished, in the order they did; `on_deadline()` is called if the deadline cut the replay (a
    session that stopped at a failed turn also returns fewer turns, without it). `transport`: httpx's (tests
    pass a mock server)."""
    results: list[TurnResult] = []
    t0 = time.monotonic()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s, connect=30), limits=limits,
                                 transport=transport) as client:
        async def session(turns: list[TraceRecord]) -> None:
            text, previous = "", None
            for i, record in enumerate(turns):
                row = prompts[record.request_id]
                text = token_ids(record) if token_ids else text + row["append"]
                due = record.timestamp / 1000 if previous is None else (
                    previous.end_s + (record.timestamp - turns[i - 1].timestamp) / 1000)
                await asyncio.sleep(max(0.0, due - (time.monotonic() - t0)))
                previous = await run_turn(client, base_url, model, record, text, row["kind"], t0)
                results.append(previous)
                if previous.error:
                    return

        try:
            await asyncio.wait_for(asyncio.gather(*(session(turns) for turns in sessions(records).values())),
                                   deadline_s)
        except TimeoutError:  # the finished turns are in results; say that the deadline cut the rest
            if on_deadline is not None:
                on_deadline()
    return results
