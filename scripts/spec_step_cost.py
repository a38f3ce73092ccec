"""Per-run step accounting for scripts/bench_spec_decode.py: `StepLog` counts a run's steps, verify steps and
host seconds proposing (by wrapping the SpecDecoder's hooks); `StepCost` reports where the steps spent their
time from the engine's, runner's and draft runner's own counters (differences over the run);
`set_speculation` switches one engine's speculation off and on between runs, `spec_counts` reads its counters."""

from __future__ import annotations

import time


class StepLog:
    """Counts one run's steps and the steps that verified drafts (wraps `SpecDecoder.on_step`), and the host
    seconds spent proposing (wraps `SpecDecoder.propose`: for a draft model its forwards and their one wait)."""

    def __init__(self, spec) -> None:
        self.steps = self.spec_steps = 0
        self.propose_seconds = 0.0
        original, original_propose = spec.on_step, spec.propose

        def on_step(out, seconds):
            self.steps += 1
            self.spec_steps += out.has_drafts
            original(out, seconds)

        def propose(running):
            started = time.perf_counter()
            original_propose(running)
            self.propose_seconds += time.perf_counter() - started

        spec.on_step, spec.propose = on_step, propose

    @staticmethod
    def remove(spec) -> None:
        del spec.on_step, spec.propose  # back to the class's methods


_RUNNER_COUNTERS = ("graph_steps", "mixed_graph_steps", "varlen_graph_steps", "decode_row_steps")
# GPU ms per step: propose = whole proposals, their step 0 included (which now also computes the verified
# positions' draft KV, the mirror's work before); first_step = that step 0 where it ran as a forward of its own
# (not inside a fused graph); mirror = mirror forwards (now steps with a prompt chunk only; before, every
# speculative step's too, so before/after compare propose + mirror)
_DRAFT_COUNTERS = ("num_proposal_steps", "num_mirror_forwards", "num_mirrored_tokens", "num_deferred_steps",
                   "num_owed_tokens", "num_caught_up_tokens", "num_fused_proposals", "propose_gpu_seconds",
                   "first_step_gpu_seconds", "mirror_gpu_seconds")


class StepCost:
    """Where a run's steps spent their time, from the engine's own counters (differences over the run): per
    step, ms scheduling / in the model runner / processing outputs / the runner's GPU span (CUDA events, first
    kernel to sampled ids), the wall time, and how many target steps replayed a CUDA graph (the rest ran
    eagerly); with a draft model, its proposal forwards, mirrored and caught-up tokens and their GPU time."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.before = self._snapshot()
        self.started = time.perf_counter()

    def _draft(self):
        return getattr(self.engine.runner, "draft_runner", None)

    def _snapshot(self) -> dict:
        stats, runner = self.engine.stats, self.engine.runner
        snap = {"steps": stats.num_steps, "phases": list(stats.phase_seconds_total),
                **{name: getattr(runner, name, 0) for name in _RUNNER_COUNTERS}}
        draft = self._draft()
        if draft is not None:
            snap.update({name: getattr(draft, name, 0) for name in _DRAFT_COUNTERS},
                        draft_graph_steps=draft.runner.graph_steps)
        return snap

    def report(self) -> dict:
        wall = time.perf_counter() - self.started
        now, before = self._snapshot(), self.before
        steps = max(now["steps"] - before["steps"], 1)
        phases = [1e3 * (a - b) / steps for a, b in zip(now["phases"], before["phases"])]
        row = {"engine_steps": now["steps"] - before["steps"], "wall_ms_per_step": 1e3 * wall / steps,
               "schedule_ms_per_step": phases[0], "model_ms_per_step": phases[1], "output_ms_per_step": phases[2],
               "gpu_span_ms_per_step": phases[3],
               **{f"target_{name}": now[name] - before[name] for name in _RUNNER_COUNTERS}}
        row["target_eager_steps"] = row["engine_steps"] - row["target_graph_steps"]
        for name in (*_DRAFT_COUNTERS, "draft_graph_steps"):
            if name in now and name in before:
                value = now[name] - before[name]
                row[f"draft_{name}" if not name.startswith("draft_") else name] = (
                    1e3 * value / steps if name.endswith("_seconds") else value)
        for name in ("draft_propose_gpu_seconds", "draft_first_step_gpu_seconds", "draft_mirror_gpu_seconds"):
            if name in row:
                row[name.replace("_seconds", "_ms_per_step")] = row.pop(name)
        return row


def set_speculation(engine, spec, on: bool, reset_prefix_cache: bool = True) -> None:
    """Speculation on or off in one engine; off also stops a draft model's KV mirror (its cost); with
    `reset_prefix_cache` the next run starts from an empty prefix cache (none reuses the previous run's prompt
    blocks)."""
    from shared_engine.spec_decode.draft_model_runner import DraftModelRunner

    draft = spec.proposer
    while draft is not None and not isinstance(draft, DraftModelRunner):
        draft = getattr(draft, "draft", None)
    engine.spec = spec if on else None
    engine.runner.draft_runner = draft if on else None
    if reset_prefix_cache:
        engine.block_manager.reset_prefix_cache()


def spec_counts(engine) -> tuple[int, int, int]:
    s = engine.stats.spec
    return s.num_drafts_total, s.num_draft_tokens_total, s.num_accepted_tokens_total
