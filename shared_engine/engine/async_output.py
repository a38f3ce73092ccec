"""`AsyncOutputStepper`: async output processing (opt-in, `enable_async_output_proc`), vLLM V0's
reordering of a step so that the host's output work for step n can overlap the device's step n+1, and
async scheduling (`async_scheduling`, vLLM's flag of that name; on by default on CUDA), which also
schedules and launches step n+1 before step n's tokens are known.

Measured on the H200 at 200 RAG users (engine core process): a 31 ms step spent 0.5 ms scheduling,
29 ms in the model runner (27.5 ms GPU span) and 1.7 ms processing outputs, with the GPU idle during
scheduling, input building and output processing. Each `LLMEngine.step()` call here, with step n in
flight (launched by the previous call):

    (a) collect step n: its sampled token ids on the host;
    (b) `Scheduler.resolve(step n)`: tokens in place, and EOS, stop token ids, max_tokens and
        max_model_len finish requests and free their blocks, exactly as without the flag;
    (c) schedule step n+1 and launch it;
    (d) process step n's outputs (prompt logprobs, detokenisation, stop strings, `RequestOutput`s)
        while step n+1 runs, and return them; then `Scheduler.apply_launched(step n+1)`.

`step()` therefore returns outputs one step late. `has_unfinished_requests()` stays true while a step
is in flight, so every loop that steps until it turns false (`LLM.generate`, the engine core process,
`AsyncEngine`) receives the last step's outputs; the call that collects the last step launches nothing.

Stop strings are only found in (d), after step n+1 was scheduled with the request in it. The request
is finished there at once, as an abort while a step runs: `finish_request` takes it out of its queue
and frees its blocks, its finished output is built in the same (d), and the sampler forgets it. When
step n+1 is collected, `resolve` skips finished requests, so that step's token for it is
dropped: never appended, reported or counted. Freeing the blocks before step n+1 completes is safe
because every step runs on one CUDA stream, in launch order: the slot step n+1 writes for the request lies
in a block that is not yet full (never registered in the prefix cache, which registers only blocks whose
tokens a collected step computed), and a later step that reuses the block runs after step n+1's write.
With async output processing nothing is even scheduled into it before step n+1 is collected; with async
scheduling blocks freed by `resolve(n)`, a stop string, an abort or a preemption can go to another request
in the next `schedule`, whose step is enqueued behind step n+1. A second stream (e.g. for copies) would
break this and must synchronise with the compute stream.

What differs from running without the flag:
- blocks a stop string frees reach the scheduler one step later (step n+2, not n+1), so batches and
  preemptions can differ under KV pressure;
- the dropped step-n+1 row of an unseeded random request draws from the shared random stream, so
  other unseeded random requests can sample differently (greedy and seeded requests cannot);
- the step time logged for step n is its scheduling + model runner + output processing time.

On CUDA the model runner's `launch` enqueues step n+1 (inputs, graph replay, sampling, the copy of its
sampled ids to pinned host memory) and returns without waiting, so (d) runs while the device works;
`collect` waits for the copy. What still runs with the device idle: collecting, updating the scheduler,
scheduling and building step n+1's inputs. Measured on one H200 at the RAG case's 200 users together with
cascade attention (5de82f5, `case_rag_chatbot/the_fix/one_replica_h200.json`): the mean step went from 31 ms
to 22-25 ms and the model runner's time equalled its GPU span. Off by default: every output reaches the
client one step later. Offline (llama-3.1-8b 1000 x 1000 on one H200, a97166f) it changed nothing: 117.3 s
against 117.7 s, because what it leaves on the critical path (collect, update, schedule, build inputs) is
most of the host's ~4 ms per step; batch-1 decode: 5.06 ms per token both ways.

Async scheduling (`async_scheduling`) takes the rest off the critical path. Each call, with step n in flight:

    (1) schedule step n+1 from what step n will have done (`Scheduler.apply_launched`): its requests'
        progress is advanced and each sampling request's last output token is a placeholder;
    (2) launch step n+1: a placeholder input is replaced on the device by step n's sampled id, so the
        launch does not wait for step n;
    (3) collect step n and `Scheduler.resolve` it: placeholders become tokens, blocks it filled join the
        prefix cache, EOS / stop token ids / max_tokens / max_model_len finish requests;
    (4) process step n's outputs as in (d) above, then `apply_launched(step n+1)`.

The device has step n+1 queued before the host waits for step n, so it idles only when the host's whole
round (3)-(4)-(1)-(2) takes longer than a step. What differs from the synchronous step besides the one-step
delay: a request that EOS or a stop token id ends at step n was already scheduled into step n+1, whose row
for it is wasted and whose token is dropped (as for stop strings above); blocks it frees reach the scheduler
a step later; blocks step n filled reach the prefix cache a step later. A request whose placeholder is its
last token by length (max_tokens, max_model_len) is not scheduled again. When step n+1 has a request with
repetition / presence / frequency penalties or a grammar (which read the output tokens), step n is
collected before step n+1 is launched. Greedy and seeded outputs are the same as without the flag (tests/engine).

Speculative decoding: a step with draft tokens yields 1 to k + 1 tokens per request, so the placeholder
for its row stands for a run whose length (and so the next step's positions) is known only when the step
is collected; and the proposer drafts from resolved tokens. So when the step in flight has drafts, or the
policy may speculate in the next step, step n is collected and resolved before step n+1 is proposed and
scheduled (the order of async output processing); when the policy has turned speculation off (large
batches) the steps overlap as above. What the policy is told a step cost (`SpecDecoder.on_step`): its device
span plus the device's idle time before a launch that had to wait for the step in flight to be resolved (the
host's collect-to-launch time then), charged to the step whose drafts made the wait necessary, or else to the
step launched after it (the policy's wish to draft there, or penalties), so speculation is priced with the host
work it puts on the critical path.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared_engine.core.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from shared_engine.engine.llm_engine import LLMEngine
    from shared_engine.model_executor.model_runner import LaunchedStep, StepResult
    from shared_engine.outputs import RequestOutput


@dataclass
class _InFlightStep:
    """A launched step whose outputs have not been processed yet."""

    out: SchedulerOutput
    launched: LaunchedStep  # the runner's handle on the step's device work
    schedule_seconds: float
    launch_seconds: float  # host time of the runner's launch
    bubble_seconds: float = 0.0  # the device idle before this launch, charged to this step (module docstring)


@dataclass
class _Collected:
    """A collected step: its tokens resolved in the scheduler, its outputs not yet processed."""

    step: _InFlightStep
    result: StepResult
    updated: list  # requests that got a token
    wait_seconds: float  # host time in the runner's collect (what the device had left)
    resolve_seconds: float
    gpu_seconds: float
    now: float
    returned: float  # perf_counter when the collect returned (the device idle from then on if nothing is queued)
    bubble_after: float = 0.0  # the device idle before the next launch, charged to this step (it had drafts)


class AsyncOutputStepper:
    """Runs `LLMEngine.step()` with at most one step in flight. `overlap_scheduling=False` (async output
    processing): collect n, resolve n, schedule and launch n+1, process n. `overlap_scheduling=True` (async
    scheduling): schedule and launch n+1, collect n, resolve n, process n."""

    def __init__(self, overlap_scheduling: bool = False) -> None:
        # no reference to the engine (it is passed to `step`): an engine <-> stepper cycle would keep a
        # deleted engine's model and KV cache on the device until the garbage collector runs
        self.overlap_scheduling = overlap_scheduling
        self.in_flight: _InFlightStep | None = None

    def step(self, engine: LLMEngine) -> list[RequestOutput]:
        """Launch the next step, collect the one in flight, and return the collected step's outputs."""
        previous, self.in_flight = self.in_flight, None
        collected = None
        if previous is not None and (not self.overlap_scheduling or self._needs_resolved_drafts(engine, previous)):
            collected = self._collect(engine, previous)
        started = time.perf_counter()
        if collected is not None or previous is None:
            engine.propose_drafts()
        out = engine.scheduler.schedule(time.time())
        scheduled = time.perf_counter()
        launched = None
        if not out.is_empty:
            if previous is not None and collected is None and self._needs_resolved_history(out):
                collected = self._collect(engine, previous)
            launched = engine.runner.launch(out, None if previous is None else previous.launched)
            done = time.perf_counter()
            launched = _InFlightStep(out, launched, scheduled - started, done - scheduled)
            if collected is not None:  # the device waited for this launch since the collect returned
                if previous.out.has_drafts:
                    collected.bubble_after = done - collected.returned
                else:
                    launched.bubble_seconds = done - collected.returned
        if previous is not None and collected is None:
            collected = self._collect(engine, previous)
        outputs = self._process(engine, collected) if collected is not None else []
        if launched is not None:
            engine.scheduler.apply_launched(out, time.time())
            self.in_flight = launched
        return outputs

    @staticmethod
    def _needs_resolved_drafts(engine: LLMEngine, previous: _InFlightStep) -> bool:
        """Speculative decoding: the step in flight has drafts, or the next step may have some."""
        spec = engine.spec
        return spec is not None and (previous.out.has_drafts or spec.wants_drafts(engine.scheduler.num_running))

    @staticmethod
    def _needs_resolved_history(out: SchedulerOutput) -> bool:
        """Whether the step's sampling reads output tokens (penalties, a grammar's state), so the step in
        flight must be resolved before it is launched."""
        return any(item.request.sampling_params.needs_output_history for item in out.scheduled
                   if item.needs_sample)

    @staticmethod
    def _collect(engine: LLMEngine, step: _InFlightStep) -> _Collected:
        collecting = time.perf_counter()
        gpu_before = engine.runner.gpu_span_seconds
        result = engine.runner.collect(step.launched)
        collected = time.perf_counter()
        now = time.time()
        updated = engine.scheduler.resolve(step.out, result.token_ids(), now)
        return _Collected(step, result, updated, collected - collecting, time.perf_counter() - collected,
                          engine.runner.gpu_span_seconds - gpu_before, now, collected)

    @staticmethod
    def _process(engine: LLMEngine, c: _Collected) -> list[RequestOutput]:
        """Step n's outputs (prompt logprobs, detokenisation, stop strings) and its stats line entry."""
        processing = time.perf_counter()
        outputs, num_tokens = engine.process_outputs(c.step.out, c.result, c.updated, c.now)
        output_seconds = c.resolve_seconds + time.perf_counter() - processing
        # model runner: its launch plus the wait in collect (what the device had left when the host got there)
        model_seconds = c.step.launch_seconds + c.wait_seconds
        engine.stats.on_step(
            c.step.out, num_tokens, c.step.schedule_seconds + model_seconds + output_seconds,
            engine.scheduler, engine.block_manager,
            phases=(c.step.schedule_seconds, model_seconds, output_seconds, c.gpu_seconds))
        if engine.spec is not None:  # the step's cost for the policy: the device's span (and idle) where there is one
            engine.spec.on_step(c.step.out, c.gpu_seconds + c.step.bubble_seconds + c.bubble_after if c.gpu_seconds
                                else c.step.schedule_seconds + model_seconds + output_seconds)
        return outputs
