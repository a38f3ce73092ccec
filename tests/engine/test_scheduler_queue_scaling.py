"""The scheduler's host work per step does not grow with the waiting queue, and its decisions stay the same.

- Decisions: seeded workloads (shared prefix, prefix caching, a small KV pool that forces preemption, partial-
  prefill caps, a prefix computed while others wait for it) driven in the async-scheduling order; every step's
  SchedulerOutput (ids, positions, token counts, samples, preemptions) is hashed and compared with the digest
  recorded at d850a4a, before the admission walk and the pending-block bookkeeping changed.
- Complexity: counts, not timings: prefix-cache lookups per step with 200 and with 4,000 waiting, and the
  pending-block entries a finished request's `free` looks at (its own, not every request's).
"""

from __future__ import annotations

import hashlib
import random

import pytest

from shared_engine.config import SchedulerConfig
from shared_engine.core.block_manager import BlockManager
from shared_engine.core.request import Request
from shared_engine.core.scheduler import Scheduler
from shared_engine.sampling_params import SamplingParams

_PARAMS = SamplingParams(temperature=0.0, max_tokens=None, ignore_eos=True)


def _workload(n: int, seed: int, prefix_len: int = 48) -> list[Request]:
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 5000) for _ in range(prefix_len)]
    return [Request(f"r{i}", prefix + [rng.randrange(10, 5000) for _ in range(rng.randint(1, 220))], _PARAMS,
                    max_tokens=rng.randint(2, 24)) for i in range(n)]


def _drive(sched: Scheduler, requests: list[Request], max_steps: int = 100_000, on_step=None) -> str:
    """Run to completion in the engine's async-scheduling order (schedule n+1, resolve n, apply n+1); the
    digest of every step's decisions."""
    for r in requests:
        sched.add_request(r)
    digest = hashlib.sha256()
    prev = None
    for _ in range(max_steps):
        if not (sched.has_unfinished_requests() or prev is not None):
            break
        out = sched.schedule(0.0)
        if prev is not None:
            sched.resolve(prev, {s.request_id: (1,) for s in prev.scheduled if s.needs_sample}, 0.0)
        if not out.is_empty:
            sched.apply_launched(out, 0.0)
        sched.block_manager.check_integrity()
        digest.update(repr(([(s.request_id, s.start_position, len(s.token_ids), s.needs_sample, len(s.block_table))
                             for s in out.scheduled], out.preempted_request_ids)).encode())
        if on_step is not None:
            on_step(out)
        prev = None if out.is_empty else out
    assert not sched.has_unfinished_requests()
    return digest.hexdigest()[:16]


CASES = {  # name: (scheduler config, blocks, workload size); digests recorded at d850a4a
    "kv_bound_preempting": (dict(max_num_seqs=24, max_num_batched_tokens=256), 120, 300),
    "seq_bound": (dict(max_num_seqs=8, max_num_batched_tokens=512), 2000, 300),
    "partial_prefill_caps": (dict(max_num_seqs=32, max_num_batched_tokens=256, max_num_partial_prefills=2,
                                  max_long_partial_prefills=1, long_prefill_token_threshold=64), 400, 300),
}
DIGESTS = {"kv_bound_preempting": "6e7e6a1ae44d8991", "partial_prefill_caps": "84bcdfe8eede0311",
           "seq_bound": "b311d45f869287fc"}


@pytest.mark.parametrize("name", sorted(CASES))
def test_decisions_unchanged(name):
    config, blocks, n = CASES[name]
    sched = Scheduler(SchedulerConfig(**config), BlockManager(blocks, 16, enable_prefix_caching=True), 4096)
    digest = _drive(sched, _workload(n, seed=len(name)))
    assert digest == DIGESTS[name], digest


def _lookups_per_step(config: dict, blocks: int, n: int, steps: int, avoid_full_hits: bool = False) -> list[int]:
    """Prefix-cache lookups (`find_cached_prefix` calls) in each of the first `steps` steps with `n` queued."""
    bm = BlockManager(blocks, 16, enable_prefix_caching=True)
    sched = Scheduler(SchedulerConfig(**config), bm, 4096)
    requests = _workload(n, seed=3)
    if avoid_full_hits:  # no prompt of 16k + 1 tokens: none could pass a full partial-prefill cap
        for r in requests:
            if len(r.prompt_token_ids) % 16 == 1:
                r.prompt_token_ids.append(11)
    calls, counts = [0], []
    lookup = bm.find_cached_prefix

    def counted(request):
        calls[0] += 1
        return lookup(request)

    bm.find_cached_prefix = counted

    def on_step(out):
        counts.append(calls[0])
        calls[0] = 0
        if len(counts) == steps:
            raise _Enough

    with pytest.raises(_Enough):
        _drive(sched, requests, on_step=on_step)
    return counts


class _Enough(Exception):
    pass


@pytest.mark.parametrize("name", ["kv_bound_preempting", "seq_bound"])
def test_lookups_per_step_do_not_grow_with_the_queue(name):
    config, blocks, _ = CASES[name]
    short, long = (_lookups_per_step(config, blocks, n, steps=60) for n in (200, 4000))
    # steps 1-2: the first request computes the shared prefix and every other one is looked up and deferred
    # (`is_prefix_pending`; run_batch prefills a batch's shared prefix first, so its rows never meet this)
    assert short[:2] == [200, 199] and long[:2] == [4000, 3999]
    # then the same first requests decide the same steps: 20x the queue, not one more lookup
    assert short[2:] == long[2:]
    assert max(long[2:]) <= config["max_num_seqs"] + 1


def test_lookups_per_step_with_the_partial_prefill_slots_taken():
    """At d850a4a every waiting request was looked up (hashed, walked through the prefix cache) at every step
    whose partial-prefill slots were taken: 4,000 waiting meant ~4,000 lookups a step."""
    config, blocks, _ = CASES["partial_prefill_caps"]
    short, long = (_lookups_per_step(config, blocks, n, steps=60, avoid_full_hits=True) for n in (200, 4000))
    assert short[2:] == long[2:]  # steps 1-2: the shared prefix is pending (above)
    assert max(long[2:]) <= config["max_num_seqs"] + 1


class _CountingDict(dict):
    iterations = 0

    def items(self):
        _CountingDict.iterations += 1
        return super().items()

    def __iter__(self):
        _CountingDict.iterations += 1
        return super().__iter__()


def test_free_looks_only_at_its_own_pending_blocks():
    """`free` used to scan every pending prefix block (every running prefill's) for the finished request's."""
    config, blocks, _ = CASES["kv_bound_preempting"]
    bm = BlockManager(blocks, 16, enable_prefix_caching=True)
    bm._pending = _CountingDict()
    _CountingDict.iterations = 0
    sched = Scheduler(SchedulerConfig(**config), bm, 4096)
    _drive(sched, _workload(100, seed=5))
    assert sched.num_preemptions_total > 0  # preemptions free requests mid-prefill, with pending blocks
    assert _CountingDict.iterations == 0
    assert not bm._pending
