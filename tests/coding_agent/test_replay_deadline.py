"""The replay's deadline (`run_case --deadline-s`, which the H200 run script sets so a run that cannot finish the
trace inside the device's 10-minute limit still leaves a results file): turns that finished by then are returned,
a turn still streaming is cancelled and left out, later turns are never sent."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from case_coding_agent.loadtest.replay import replay
from case_coding_agent.loadtest.trace import TraceRecord


def record(session: str, turn: int, ts: int) -> TraceRecord:
    return TraceRecord(timestamp=ts, input_length=4, output_length=2, hash_ids=[1], session_id=session, turn=turn,
                       request_id=f"{session}-{turn}")


class SlowStream(httpx.AsyncByteStream):
    """Server-sent events of one completion, the first chunk after `delay_s`."""

    def __init__(self, delay_s: float):
        self.delay_s = delay_s

    async def __aiter__(self):
        await asyncio.sleep(self.delay_s)
        yield b'data: {"choices": [{"text": "x"}]}\n\n'
        usage = {"prompt_tokens": 4, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": 0}}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


def test_a_deadline_returns_the_finished_turns_and_cancels_the_rest():
    sent = []

    async def handler(request: httpx.Request) -> httpx.Response:
        session = request.headers["x-session-id"]
        sent.append(session)
        return httpx.Response(200, stream=SlowStream(30.0 if session == "slow" else 0.0))

    records = [record("fast", 1, 0), record("fast", 2, 100), record("slow", 1, 0), record("late", 1, 20_000)]
    prompts = {r.request_id: {"append": "hi ", "kind": "read"} for r in records}
    started, cut = time.monotonic(), []
    turns = asyncio.run(replay("http://engine", "m", records, prompts, deadline_s=1.0,
                               transport=httpx.MockTransport(handler), on_deadline=lambda: cut.append(1)))
    assert cut == [1]
    assert time.monotonic() - started < 10  # not the slow turn's 30 s
    assert sorted(t.request_id for t in turns) == ["fast-1", "fast-2"]
    assert all(t.error is None and t.output_tokens == 1 and t.first_token_s is not None for t in turns)
    assert sorted(sent) == ["fast", "fast", "slow"]  # the session due at 20 s never sent its turn


def test_before_the_deadline_every_turn_finishes():
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=SlowStream(0.05))

    records = [record("a", 1, 0), record("a", 2, 10), record("b", 1, 0)]
    prompts = {r.request_id: {"append": "hi ", "kind": "read"} for r in records}
    cut = []
    turns = asyncio.run(replay("http://engine", "m", records, prompts, deadline_s=30.0,
                               transport=httpx.MockTransport(handler), on_deadline=lambda: cut.append(1)))
    assert sorted(t.request_id for t in turns) == ["a-1", "a-2", "b-1"] and cut == []


def test_a_failed_turn_ends_its_session_without_counting_as_a_cut():
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500 if request.headers["x-session-id"] == "a" else 200, stream=SlowStream(0.0))

    records = [record("a", 1, 0), record("a", 2, 10), record("b", 1, 0)]
    prompts = {r.request_id: {"append": "hi ", "kind": "read"} for r in records}
    cut = []
    turns = asyncio.run(replay("http://engine", "m", records, prompts, deadline_s=30.0,
                               transport=httpx.MockTransport(handler), on_deadline=lambda: cut.append(1)))
    assert sorted((t.request_id, t.error is None) for t in turns) == [("a-1", False), ("b-1", True)]
    assert cut == []  # fewer turns than the trace, but no deadline fired
