"""`AsyncOutputStepper`: async output processing (opt-in, `enable_async_output_proc`), vLLM V0's
reordering of a step so that the host's output work for step n can overlap the device's step n+1.

Measured on the H200 at 200 RAG users (engine core process): a 31 ms step spent 0.5 ms scheduling,
29 ms in the model runner (27.5 ms GPU span) and 1.7 ms processing outputs, with the GPU idle during
scheduling, input building and output processing. Each `LLMEngine.step()` call here, with step n in
flight (launched by the previous call):

    (a) collect step n: its sampled token ids on the host;
    (b) `Scheduler.update_from_output(step n)`: tokens appended, and EOS, stop token ids, max_tokens
        and max_model_len finish requests and free their blocks, exactly as without the flag;
    (c) schedule step n+1 and launch it;
    (d) process step n's outputs (prompt logprobs, detokenisation, stop strings, `RequestOutput`s)
        while step n+1 runs, and return them.

`step()` therefore returns outputs one step late. `has_unfinished_requests()` stays true while a step
is in flight, so every loop that steps until it turns false (`LLM.generate`, the engine core process,
`AsyncEngine`) receives the last step's outputs; the call that collects the last step launches nothing.

Stop strings are only found in (d), after step n+1 was scheduled with the request in it. The request
is finished there at once, as an abort while a step runs: `finish_request` takes it out of its queue
and frees its blocks, its finished output is built in the same (d), and the sampler forgets it. When
step n+1 is collected, `update_from_output` skips finished requests, so that step's token for it is
dropped: never appended, reported or counted. Freeing the blocks before step n+1 completes is safe:
nothing is scheduled into them before step n+1 is collected, and the slot step n+1 writes lies in a
block that is not yet full, so it goes back to the free list, never to the prefix cache.

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
to 22-25 ms and the model runner's time equalled its GPU span. Off by default: not measured alone, nor on the
offline benchmarks, and every output reaches the client one step later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared_engine.core.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from shared_engine.engine.llm_engine import LLMEngine
    from shared_engine.model_executor.model_runner import LaunchedStep
    from shared_engine.outputs import RequestOutput


@dataclass
class _InFlightStep:
    """A launched step whose outputs have not been processed yet."""

    out: SchedulerOutput
    launched: LaunchedStep  # the runner's handle on the step's device work
    schedule_seconds: float
    launch_seconds: float  # host time of the runner's launch


class AsyncOutputStepper:
    """Runs `LLMEngine.step()` in the order (a) collect n, (b) update the scheduler, (c) launch n+1,
    (d) process n's outputs. Holds at most one step in flight."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.in_flight: _InFlightStep | None = None

    def step(self) -> list[RequestOutput]:
        """Collect the step in flight, launch the next one, and return the collected step's outputs."""
        engine = self.engine
        previous, self.in_flight = self.in_flight, None
        if previous is None:
            self.in_flight = self._launch()
            return []
        collecting = time.perf_counter()
        gpu_before = engine.runner.gpu_span_seconds
        result = engine.runner.collect(previous.launched)  # (a)
        collected = time.perf_counter()
        gpu_seconds = engine.runner.gpu_span_seconds - gpu_before
        now = time.time()
        tokens = {rid: r.token_id for rid, r in result.sampled.items()}
        updated = engine.scheduler.update_from_output(previous.out, tokens, now)  # (b)
        updated_seconds = time.perf_counter() - collected
        self.in_flight = self._launch()  # (c)
        processing = time.perf_counter()
        outputs = engine.process_outputs(result, updated, now)  # (d)
        output_seconds = updated_seconds + time.perf_counter() - processing
        # model runner: its launch plus the wait in collect (what the device had left when the host got there)
        model_seconds = previous.launch_seconds + (collected - collecting)
        engine.stats.on_step(
            previous.out, len(updated), previous.schedule_seconds + model_seconds + output_seconds,
            engine.scheduler, engine.block_manager,
            phases=(previous.schedule_seconds, model_seconds, output_seconds, gpu_seconds))
        return outputs

    def _launch(self) -> _InFlightStep | None:
        """Schedule the next step and start it on the device; None when there is nothing to run."""
        engine = self.engine
        started = time.perf_counter()
        out = engine.scheduler.schedule(time.time())
        if out.is_empty:
            return None
        scheduled = time.perf_counter()
        launched = engine.runner.launch(out)
        return _InFlightStep(out, launched, scheduled - started, time.perf_counter() - scheduled)
