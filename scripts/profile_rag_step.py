"""Where one RAG-case step's GPU time goes (CUDA): a mixed step of N decodes whose contexts share a 4,096-token
system prompt (the same KV blocks) plus one prefill chunk, as the case's server runs it at 200 users.

Times the step as a CUDA-graph replay and eagerly, and splits the eager step's kernel time by kernel
(torch.profiler); repeats with the decodes' prefixes in distinct blocks to show what sharing saves.

    python scripts/profile_rag_step.py --out OUT.json [--model llama-3.1-8b] [--decodes 60] [--chunk 450]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.env_info import environment  # noqa: E402
from benchmarks.kernel_names import kernel_key  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.core.request import Request  # noqa: E402
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput  # noqa: E402
from shared_engine.model_executor.input_builder import build_inputs  # noqa: E402
from shared_engine.model_executor.model_runner import ModelRunner  # noqa: E402
from shared_engine.model_loader.model_source import resolve_model  # noqa: E402
from shared_engine.sampling_params import SamplingParams  # noqa: E402

BLOCK = 16


def make_step(decodes: int, chunk: int, prefix: int, suffix: tuple[int, int], shared: bool, seed: int = 0):
    rng = random.Random(seed)
    next_block = iter(range(1, 10**9))
    prefix_blocks = [next(next_block) for _ in range(prefix // BLOCK)]
    scheduled = []
    for i in range(decodes + 1):
        is_chunk = i == decodes
        own = chunk if is_chunk else rng.randint(*suffix)
        own_prefix = prefix_blocks if shared else [next(next_block) for _ in range(prefix // BLOCK)]
        total = prefix + own
        table = own_prefix + [next(next_block) for _ in range(-(-total // BLOCK) - len(own_prefix))]
        start = prefix if is_chunk else total - 1
        n = chunk if is_chunk else 1
        request = Request(f"r{i}", [5] * total, SamplingParams(max_tokens=1), max_tokens=1)
        scheduled.append(ScheduledRequest(request, [7] * n, start, table, True))
    used = max(max(s.block_table) for s in scheduled) + 1
    return SchedulerOutput(scheduled, num_batched_tokens=decodes + chunk), used


def cuda_time(fn, iters: int = 20) -> float:
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / iters


def kernel_breakdown(fn) -> dict[str, float]:
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type.name == "CUDA":
            name = event.name
            totals[kernel_key(name)] += event.device_time / 1e3  # ms
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


@torch.inference_mode()
def profile_step(runner: ModelRunner, out: SchedulerOutput) -> dict:
    """CUDA time of one step as a graph replay and eagerly (ms), and the eager step's kernel time by kernel."""
    inputs = build_inputs(out, BLOCK, runner.device, cascade=runner.enable_cascade)
    key = runner.graph_runner.select(inputs.meta, inputs.input_ids.shape[0])

    def eager():
        runner.model(inputs.input_ids, inputs.positions, runner.kv_caches, inputs.meta, runner.backend)

    def graphed():
        runner.graph_runner.run(key, inputs.input_ids, inputs.positions, inputs.meta)

    return {"graph_key": list(key) if key else None, "eager_ms": cuda_time(eager),
            "graph_ms": cuda_time(graphed) if key else None, "kernels_ms": kernel_breakdown(eager)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--decodes", type=int, default=60)
    p.add_argument("--chunk", type=int, default=450)
    p.add_argument("--prefix", type=int, default=4096)
    p.add_argument("--budget", type=int, default=512)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    config = EngineConfig.from_flat(model=args.model, load_format="dummy", max_model_len=12288,
                                    max_num_seqs=64, max_num_batched_tokens=args.budget)
    source = resolve_model(args.model, "dummy", None)
    config = config.with_model_len(12288)
    runner = ModelRunner(config, source)
    runner.allocate_kv_cache(args.decodes * (args.prefix + 2200) // BLOCK + 2000)
    runner.capture_cuda_graphs()
    results = {"environment": environment(), "args": vars(args) | {"out": str(args.out)}, "cases": {}}
    for shared in (True, False):
        out, _ = make_step(args.decodes, args.chunk, args.prefix, (1536, 1900), shared)
        case = profile_step(runner, out)
        case["decode_only"] = profile_step(runner, SchedulerOutput(out.scheduled[:-1], num_batched_tokens=args.decodes))
        results["cases"]["shared_prefix" if shared else "distinct_prefixes"] = case
        print(json.dumps(case)[:1500], flush=True)
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
