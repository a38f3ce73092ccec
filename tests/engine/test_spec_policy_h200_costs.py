"""The auto policy against the step times measured on the H200 at c518670 (issue 17;
benchmarks/results/spec_decode_h200_replay_c518670.json: llama-3.1-8b dummy, 1000-token prompts, 128 output
tokens, forced acceptance 0.8): step counts, not wall time. Where a speculative step costs more than its
accepted tokens pay for (batch 64 / 256 / 448: 2.7x / 4.6x / 4.0x a plain step at k = 3), the policy drafts on
its one probe step only (it drafted on the first 16, 14-15% of the run's steps, at c518670) and never makes the
async stepper resolve a step it declines early, so a declined step takes the path of speculation unconfigured;
at batch 1 (1.4x) it drafts on nearly every step."""

from __future__ import annotations

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared_engine import SamplingParams
from shared_engine.config.speculative_config import SpeculativeConfig
from shared_engine.core.request import Request
from shared_engine.engine.async_output import AsyncOutputStepper
from shared_engine.spec_decode.spec_decoder import SpecDecoder

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks/results/spec_decode_h200_replay_c518670.json"
OUTPUT_LEN = 128
CACHED_PREFILL_TOKENS = 8  # per request: the 1000-token prompt's last partial block (the rest from the cache)


def _measured() -> dict[int, dict]:
    """batch -> {"plain": seconds per step, k: seconds per step of policy `always` at acceptance 0.8}."""
    body = json.loads(RESULTS.read_text())
    rows = body["results"]["batch1"] + body["results"]["throughput"]
    table = {}
    for row in rows:
        batch = row["batch"]
        off_seconds = batch * OUTPUT_LEN / row["off_tokens_per_s"]
        entry = {"plain": off_seconds / OUTPUT_LEN}
        for run in row["runs"]:
            if run["policy"] == "always" and run["draft_token_probability"] == 0.8:
                entry[run["k"]] = run["seconds"] / run["steps"]
        table[batch] = entry
    return table


def _run(batch: int, k: int) -> tuple[int, int, int]:
    """One 128-token run of `batch` requests through `SpecDecoder` in the async stepper's order, each step
    costing what c518670 measured for its kind. Returns (steps, steps with drafts, steps resolved early)."""
    costs = _measured()[batch]
    spec = SpecDecoder(SpeculativeConfig(method="ngram", num_speculative_tokens=k, policy="auto"), 4096)
    rng = random.Random(0)
    requests = [Request(f"r{i}", [1, 2, 3], SamplingParams(max_tokens=OUTPUT_LEN), max_tokens=OUTPUT_LEN)
                for i in range(batch)]
    produced = [1] * batch  # the prefill's token
    prefill = SimpleNamespace(num_batched_tokens=batch * CACHED_PREFILL_TOKENS, has_drafts=False)
    spec.on_step(prefill, costs["plain"] * 1.5)
    engine = SimpleNamespace(spec=spec, scheduler=SimpleNamespace(num_running=batch))
    steps = drafted = early = 0
    previous = SimpleNamespace(out=SimpleNamespace(has_drafts=False))
    while min(produced) < OUTPUT_LEN:
        live = [i for i in range(batch) if produced[i] < OUTPUT_LEN]
        engine.scheduler.num_running = len(live)
        resolved = AsyncOutputStepper._needs_resolved_drafts(engine, previous)
        early += resolved
        ks = [0] * len(live)
        if resolved:  # the stepper proposes only after resolving (the policy's `num_drafts`)
            ks = spec.policy.num_drafts([requests[i] for i in live], len(live))
        tokens = len(live) + sum(ks)
        for i, d in zip(live, ks):
            accepted = 0
            while accepted < d and rng.random() < 0.8:
                accepted += 1
            requests[i].num_draft_tokens_total += d
            requests[i].num_accepted_tokens_total += accepted
            produced[i] = min(OUTPUT_LEN, produced[i] + accepted + 1)
        out = SimpleNamespace(num_batched_tokens=tokens, has_drafts=any(ks))
        # a speculative step at its measured cost; a shrinking tail's steps priced like the full batch's
        spec.on_step(out, costs[k] if any(ks) else costs["plain"])
        previous = SimpleNamespace(out=out)
        steps += 1
        drafted += any(ks)
    return steps, drafted, early


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("batch", [64, 256, 448])
def test_no_speculation_where_it_cannot_pay(batch, k):
    costs = _measured()[batch]
    assert costs[k] / costs["plain"] > 2.5  # what the measurement says: a speculative step costs > 2.5 plain
    steps, drafted, early = _run(batch, k)
    assert drafted == 1  # the one probe (c518670's policy: 16, i.e. 14-15% of the steps)
    assert early <= 5  # the probe and the first fitted decisions (a handful of steps); then overlapped
    assert steps <= OUTPUT_LEN


@pytest.mark.parametrize("k", [3, 5])
def test_batch1_speculates_nearly_every_step(k):
    costs = _measured()[1]
    assert costs[k] / costs["plain"] < 1.5
    steps, drafted, _ = _run(1, k)
    assert drafted >= 0.8 * (steps - 9)  # all but the plain steps before the fit (`_MIN_STEPS`)
    assert steps < 0.7 * OUTPUT_LEN  # so the run takes far fewer steps than plain decoding's 128
