"""The load test's two shapes as capacity-model workloads (sim_isolation.py; modelled, not measured).

`cpu_trace`: the CPU load test (run_loadtest.py, profile cpu) as an open-loop trace: 6 well-behaved tenants
by true Zipf (s 1.1) sending 0.5 requests/s in all (Poisson; the load test's 4 users at one request per
8 s), 38-token prompts, 16-token answers; 2 whales that, in the first half of every 30 s, each send a
340-token document for a 32-token answer every 4 s (about what the gateway let through in the measured runs).

`H200Load`: h200_quick.py's shape (async_users.py against the gateway, the_fix/config_h200.yaml): 48 users
each sending one request every 4 s to one of 28 tenants by Zipf (s 1.1), a 36-token prompt of which the
first 32 (the chat template and the question, one of 8 per tenant) are cached after the first time, 64-token
answers (ignore_eos); 2 whales, each with the gateway's 4 concurrent requests (its `max_concurrency`, the
limit that bound in the measured run: 144 answers in 60 s, 24 per whale per burst), closed loop in the ON
half of every 20 s: a slot sends its next 264-token document (16 tokens shared per whale, 248 uncached)
for 256 answer tokens within 50 ms of its previous answer's end (8 users per whale retrying every 0.4 s).
The four slots of a whale start together and end together, so its documents arrive in clusters, as in
the measured samples (logs/fix/samples-the_fix.jsonl at aab412d: the p99 tail's requests each overlapped a
cluster of eight whale documents arriving within about 50 ms).
"""

from __future__ import annotations

import heapq
import math
import random

import numpy as np

from case_multilora.loadtest.zipf import zipf_choice
from shared_engine.sim.workload import RequestSpec

CPU_WELL_BEHAVED = [("t1", "acme"), ("t2", "json"), ("t3", "french"), ("t4", "upper"), ("t5", "acme"),
                    ("t6", "json")]
CPU_WHALES = [("w1", "french"), ("w2", "upper")]


def cpu_trace(duration_s: float, whales: bool, seed: int = 0) -> list[RequestSpec]:
    rng = random.Random(seed)
    out, t, n = [], 0.0, 0
    while True:
        t += rng.expovariate(0.5)
        if t >= duration_s:
            break
        tenant, adapter = CPU_WELL_BEHAVED[zipf_choice(rng, len(CPU_WELL_BEHAVED), 1.1)]
        out.append(RequestSpec(f"wb-{n}", t, [rng.randrange(100, 40000) for _ in range(38)], 16, adapter,
                               tenant=tenant))
        n += 1
    if whales:
        for k, (tenant, adapter) in enumerate(CPU_WHALES):
            for start in np.arange(0.0, duration_s, 30.0):
                for j, at in enumerate(np.arange(start + 0.5 * k, start + 15.0, 4.0)):
                    out.append(RequestSpec(f"{tenant}-{int(start)}-{j}", float(at),
                                           [rng.randrange(100, 40000) for _ in range(340)], 32, adapter,
                                           tenant=tenant))
    return out


class H200Load:
    """`TraceWorkload`'s interface (`peek_time`, `pop_due`, `on_finish`); whales' next documents are made
    as their answers end. Tenants t1..t28 (adapter = tenant name), whales w1, w2. Times in seconds."""

    USERS, PACING_S, TENANTS, ZIPF_S = 48, 4.0, 28, 1.1
    PROMPT_PREFIX, QUESTION, ANSWER = 28, 8, 64
    WHALE_SLOTS, WHALE_SHARED, WHALE_UNIQUE, WHALE_ANSWER = 4, 16, 248, 256
    PERIOD_S, RETRY_S = 20.0, 0.05

    def __init__(self, duration_s: float, whales: bool, seed: int = 0) -> None:
        self.rng = rng = random.Random(seed)
        self.duration_s = duration_s
        self._heap: list[tuple[float, int, RequestSpec]] = []
        self._n = 0
        tenants = [f"t{i + 1}" for i in range(self.TENANTS)]
        prefix = {t: self._ids(self.PROMPT_PREFIX) for t in tenants}
        questions = {t: [self._ids(self.QUESTION) for _ in range(8)] for t in tenants}
        for _ in range(self.USERS):
            at = rng.uniform(0, self.PACING_S)
            while at < duration_s:
                tenant = tenants[zipf_choice(rng, self.TENANTS, self.ZIPF_S)]
                self._push(RequestSpec(f"wb-{self._n}", at, prefix[tenant] + rng.choice(questions[tenant]),
                                       self.ANSWER, tenant, tenant=tenant))
                at += self.PACING_S
        self._whale_prefix = {w: self._ids(self.WHALE_SHARED) for w in ("w1", "w2")}
        if whales:
            for whale in self._whale_prefix:
                for start in np.arange(0.0, duration_s, self.PERIOD_S):
                    for _ in range(self.WHALE_SLOTS):
                        self._whale(whale, float(start) + rng.uniform(0, 0.02))

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(100, 100000) for _ in range(n)]

    def _whale(self, whale: str, at: float) -> None:
        if at >= self.duration_s or at % self.PERIOD_S >= self.PERIOD_S / 2:
            return  # OFF half: the slot waits for the next burst (started in __init__)
        self._push(RequestSpec(f"{whale}-{self._n}", at, self._whale_prefix[whale] + self._ids(self.WHALE_UNIQUE),
                               self.WHALE_ANSWER, whale, tenant=whale))

    def _push(self, spec: RequestSpec) -> None:
        heapq.heappush(self._heap, (spec.arrival_time, self._n, spec))
        self._n += 1

    def peek_time(self) -> float:
        return self._heap[0][0] if self._heap else math.inf

    def pop_due(self, now: float) -> list[RequestSpec]:
        due = []
        while self._heap and self._heap[0][0] <= now:
            due.append(heapq.heappop(self._heap)[2])
        return due

    def on_finish(self, spec: RequestSpec, output_token_ids: list[int], now: float) -> None:
        if spec.tenant.startswith("w"):
            self._whale(spec.tenant, now + self.rng.uniform(0, self.RETRY_S))
