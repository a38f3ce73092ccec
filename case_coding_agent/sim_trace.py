"""`SessionTraceWorkload`: a case trace replayed in the simulator (`shared_engine/sim`) as the load test
replays it: each session a closed loop, turn 1 at its timestamp, turn k+1 the trace's gap after turn k
finished (simulated time). Prompts are `trace.synthetic_token_ids` (the trace's block sharing, Mooncake's
granularity: a turn's last partial block never matches the next turn's full one, so hits are counted to
`block_tokens`, as a Mooncake replay counts them).

`route(records, policy, n)` splits the trace over replicas the way the compared routers do: `session_hash`
keeps a session on one replica (crc32 of the id, as nginx's hash sees a stable key); `round_robin` sends each
request to a replica picked by the crc32 of its request id. The simulator runs replicas apart, so a router
that deals requests out in the order they arrive (which depends on finish times) cannot be modelled; under
many interleaved closed-loop sessions, which replica a session's next turn meets is close to a coin flip,
and dealing in the trace's order would instead pin sessions to replicas whenever their turns alternate
regularly (two sessions a, b, a, b, ... on two replicas).
"""

from __future__ import annotations

import heapq
import math
import zlib

from case_coding_agent.loadtest.trace import TraceRecord, sessions, synthetic_token_ids
from shared_engine.sim.workload import RequestSpec


class SessionTraceWorkload:
    """Interface of `shared_engine.sim.workload.TraceWorkload` (peek_time, pop_due, on_finish)."""

    def __init__(self, records: list[TraceRecord], block_tokens: int, vocab_size: int,
                 max_model_len: int) -> None:
        self.block_tokens, self.vocab_size, self.max_model_len = block_tokens, vocab_size, max_model_len
        self._sessions = sessions(records)
        self._heap: list[tuple[float, str, int]] = []  # (due time s, session, turn index)
        self.records: dict[str, TraceRecord] = {}
        for session_id, turns in self._sessions.items():
            heapq.heappush(self._heap, (turns[0].timestamp / 1000, session_id, 0))

    def peek_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> list[RequestSpec]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            t, session_id, i = heapq.heappop(self._heap)
            r = self._sessions[session_id][i]
            self.records[r.request_id] = r
            ids = synthetic_token_ids(r, self.block_tokens, self.vocab_size)
            max_tokens = max(1, min(r.output_length, self.max_model_len - len(ids)))
            due.append(RequestSpec(r.request_id, t, ids, max_tokens, session=None, session_id=session_id))
        return due

    def on_finish(self, spec: RequestSpec, output_token_ids: list[int], now: float) -> None:
        turns = self._sessions[spec.session_id]
        i = next(k for k, r in enumerate(turns) if r.request_id == spec.request_id)
        if i + 1 < len(turns):
            gap_s = (turns[i + 1].timestamp - turns[i].timestamp) / 1000
            heapq.heappush(self._heap, (now + gap_s, spec.session_id, i + 1))


def route(records: list[TraceRecord], policy: str, num_replicas: int) -> list[list[TraceRecord]]:
    """The trace's records per replica. Raises ValueError on an unknown policy."""
    out: list[list[TraceRecord]] = [[] for _ in range(num_replicas)]
    if policy == "session_hash":
        for r in records:
            out[zlib.crc32(r.session_id.encode()) % num_replicas].append(r)
    elif policy == "round_robin":
        for r in records:
            out[zlib.crc32(r.request_id.encode()) % num_replicas].append(r)
    else:
        raise ValueError(f"policy must be session_hash or round_robin, got {policy!r}")
    return out
