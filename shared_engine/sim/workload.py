"""`WorkloadGenerator`: turns a `WorkloadSpec` into requests with real token-id prompts, as they arrive.

Prompts are built from token ids with genuine shared structure, so the engine's prefix cache finds what a
real deployment's would: every request of a session starts with the same system prompt ids, and turn k of
a multi-turn session is turn k-1's prompt plus its generated tokens plus a new message. Sessions drive
their own next turn (a turn arrives `think_time_s` after the previous one finished), so prompts are
generated lazily and memory stays bounded by what is in flight.

Replicas: requests are routed at random with sessions kept on one replica, so replica r of n sees the
arrival rate / n (Poisson splitting), users r, r+n, ..., and its share of the request count.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from shared_engine.sim.workload_spec import WorkloadSpec

_FIRST_TOKEN_ID = 10  # leave the lowest ids (specials in most vocabularies) out of prompts


@dataclass
class Session:
    """One conversation: shared system prompt ids, the turns so far, and how many turns are left."""

    system_ids: list[int]
    adapter: str | None
    turns_left: int
    user: int | None = None  # closed loop: the user that owns it
    history: list[int] = field(default_factory=list)


@dataclass
class RequestSpec:
    request_id: str
    arrival_time: float  # seconds
    prompt_token_ids: list[int]
    max_tokens: int
    lora_name: str | None = None
    session: Session | None = None
    tenant: str | None = None  # whose fair-share counter it charges (`--scheduling-policy fair`)
    session_id: str | None = None  # an agent session's id: its finished turn's prefix is pinned (`--session-pin-ttl`)


class TraceWorkload:
    """A fixed list of requests (tests, replays). Same interface as `WorkloadGenerator`."""

    def __init__(self, requests: list[RequestSpec]) -> None:
        self._pending = sorted(requests, key=lambda r: r.arrival_time)[::-1]  # ties keep the list's order

    def peek_time(self) -> float:
        return self._pending[-1].arrival_time if self._pending else math.inf

    def pop_due(self, now: float) -> list[RequestSpec]:
        due = []
        while self._pending and self._pending[-1].arrival_time <= now:
            due.append(self._pending.pop())
        return due

    def on_finish(self, spec: RequestSpec, output_token_ids: list[int], now: float) -> None:
        return None


class WorkloadGenerator:
    def __init__(self, spec: WorkloadSpec, vocab_size: int, max_model_len: int, replica: int = 0,
                 num_replicas: int = 1) -> None:
        self.spec = spec
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        self.rng = np.random.default_rng([spec.seed, replica])
        self.prefix_rng_seed = spec.seed  # system prompts are the same on every replica
        self.replica, self.num_replicas = replica, num_replicas
        total = spec.num_requests
        self.max_requests = math.inf if total is None else total // num_replicas + (replica < total % num_replicas)
        self.end_time = math.inf if spec.duration_s is None else spec.duration_s
        self.num_issued = 0
        self._ids = itertools.count()
        self._heap: list[tuple[float, int, object]] = []  # (time, tie-break, RequestSpec | "start" | Session)
        self._system_prompts = self._make_system_prompts()
        arrival = spec.arrival
        if arrival.is_closed_loop:
            for user in range(replica, arrival.num_users, num_replicas):  # each thinks before its first request
                start = arrival.think_time_s.sample_one(self.rng)
                self._push(start, self._new_session(user))
        else:
            self._arrival = arrival.scaled(1.0 / num_replicas)
            self._push(self._arrival.next_gap(self.rng), "start")

    # ---- the simulator's interface -------------------------------------------------------------------
    def peek_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> list[RequestSpec]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            time, _, item = heapq.heappop(self._heap)
            if item == "start":
                if self._can_issue(time):
                    self._push(time + self._arrival.next_gap(self.rng), "start")
                    item = self._new_session(None)
                else:
                    continue
            request = self._next_turn(item, time)
            if request is not None:
                due.append(request)
        return due

    def on_finish(self, spec: RequestSpec, output_token_ids: list[int], now: float) -> None:
        """Schedule the session's next turn (or, closed loop, the user's next session)."""
        session = spec.session
        if session is None:
            return
        session.history = spec.prompt_token_ids[len(session.system_ids):] + list(output_token_ids)
        think = self.spec.prefix.think_time_s.sample_one(self.rng)
        if session.turns_left > 0:
            self._push(now + think, session)
        elif session.user is not None:
            user_think = self.spec.arrival.think_time_s.sample_one(self.rng)
            self._push(now + user_think, self._new_session(session.user))

    # ---- internals -----------------------------------------------------------------------------------
    def _push(self, time: float, item) -> None:
        heapq.heappush(self._heap, (time, next(self._ids), item))

    def _can_issue(self, time: float) -> bool:
        return self.num_issued < self.max_requests and time <= self.end_time

    def _make_system_prompts(self) -> list[list[int]]:
        p = self.spec.prefix
        rng = np.random.default_rng([self.prefix_rng_seed, 1_000_003])
        return [self._tokens(rng, p.system_prompt_len) for _ in range(p.num_system_prompts)]

    def _tokens(self, rng: np.random.Generator, n: int) -> list[int]:
        return rng.integers(_FIRST_TOKEN_ID, self.vocab_size, size=n).tolist()

    def _new_session(self, user: int | None) -> Session:
        p, a = self.spec.prefix, self.spec.adapters
        system = self._system_prompts[int(self.rng.integers(len(self._system_prompts)))]
        turns = p.turns_per_session.sample_one(self.rng)
        adapter = None
        if a.num_adapters and self.rng.random() >= a.base_fraction:
            weights = np.arange(1, a.num_adapters + 1, dtype=float) ** -(a.zipf_s if a.popularity == "zipf" else 0)
            adapter = f"adapter-{int(self.rng.choice(a.num_adapters, p=weights / weights.sum()))}"
        return Session(system, adapter, turns, user)

    def _next_turn(self, session: Session, time: float) -> RequestSpec | None:
        if not self._can_issue(time):
            return None
        message_len = self.spec.prompt_len.sample_one(self.rng)
        max_tokens = self.spec.output_len.sample_one(self.rng)
        prefix = session.system_ids + session.history
        if len(prefix) + message_len + max_tokens > self.max_model_len:
            prefix = session.system_ids  # the conversation outgrew the context: start it afresh
        room = self.max_model_len - len(prefix)
        message_len = max(1, min(message_len, room - 1))
        max_tokens = max(1, min(max_tokens, self.max_model_len - len(prefix) - message_len))
        if len(prefix) + message_len + max_tokens > self.max_model_len:
            return None  # the system prompt alone leaves no room
        message = self._tokens(self.rng, message_len)
        session.turns_left -= 1
        self.num_issued += 1
        rid = f"r{self.replica}-{self.num_issued}"
        tenant = session.adapter if self.spec.adapters.tenant_per_adapter else None
        return RequestSpec(rid, time, prefix + message, max_tokens, session.adapter, session, tenant)
