"""Record engine step time against batch composition: the data the capacity model calibrates from.

Drives the real `LLMEngine` (scheduler + model runner + sampler + output builder, exactly what a served step
costs) through fixed scenarios: single prefills of growing length, decode batches of growing size at short
and long contexts, and decodes mixed with a prefill chunk. Every step's composition (each scheduled
request's start position, new-token count and whether it samples) is stored with its wall time and (CUDA)
its device span, plus the device's measured copy bandwidth and matmul rate, so any step-time model can be
refit from the file. Steps run synchronously (async scheduling off), so each timed `engine.step()` is one
whole step, host and device.

    # this CPU, the default model (a few minutes; committed as the CPU calibration)
    python scripts/profile_steps.py --out shared_engine/sim/profiles/cpu-2core_smollm2-135m.json
    # a GPU, dummy weights of a preset
    python scripts/profile_steps.py --model llama-3.1-8b --load-format dummy \
        --out shared_engine/sim/profiles/h200_llama-3.1-8b.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402


def measure_ceilings(device: str, dtype) -> dict:
    """Copy bandwidth (read + write bytes / s) and dense matmul rate (FLOP/s) in the model's dtype."""
    import torch

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    numel = (1 << 28 if device == "cuda" else 1 << 25) // 4  # 256 MiB on GPU, 32 MiB of fp32 on CPU
    src = torch.ones(numel, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    copy_s = _best_of(lambda: dst.copy_(src), sync)
    n = 8192 if device == "cuda" else 1024
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    mm_s = _best_of(lambda: a @ b, sync)
    return {"copy_bytes_per_s": 2 * src.numel() * 4 / copy_s, "matmul_flops_per_s": 2 * n**3 / mm_s,
            "matmul_n": n, "copy_bytes": 2 * src.numel() * 4}


def _best_of(fn, sync, repeats: int = 5) -> float:
    fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - started)
    return best


class StepRecorder:
    """Wraps `scheduler.schedule` to keep each step's composition; times `engine.step()`."""

    def __init__(self, engine, sync) -> None:
        self.engine = engine
        self.sync = sync
        self.steps: list[dict] = []
        self._last = None
        original = engine.scheduler.schedule

        def schedule(*args, **kwargs):
            self._last = original(*args, **kwargs)
            return self._last

        engine.scheduler.schedule = schedule

    def run(self, scenario: str, requests: list[tuple[int, int]], late: list[tuple[int, int]] = (),
            late_after: int = 2) -> None:
        from shared_engine import SamplingParams

        rng = random.Random(len(self.steps))
        pending = [(rng.choices(range(100, 10000), k=p), o) for p, o in late]
        for prompt_len, out_len in requests:
            self._add(rng.choices(range(100, 10000), k=prompt_len), out_len, SamplingParams)
        step = 0
        while self.engine.has_unfinished_requests():
            if step == late_after:
                for ids, out_len in pending:
                    self._add(ids, out_len, SamplingParams)
            started = time.perf_counter()
            gpu_before = self.engine.runner.gpu_span_seconds
            self.engine.step()
            self.sync()
            seconds = time.perf_counter() - started
            out = self._last
            if out is not None and not out.is_empty:
                items = [[s.start_position, s.num_new_tokens, int(s.needs_sample)] for s in out.scheduled]
                # gpu_seconds: the step's device span (CUDA; 0 on the CPU), the rest of `seconds` is the host's
                self.steps.append({"scenario": scenario, "seconds": seconds, "items": items,
                                   "gpu_seconds": self.engine.runner.gpu_span_seconds - gpu_before,
                                   "num_preempted": len(out.preempted_request_ids)})
            step += 1

    def _add(self, ids: list[int], out_len: int, params_cls) -> None:
        rid = f"p{len(self.steps)}-{random.random()}"
        self.engine.add_request(rid, ids, params_cls(temperature=0.0, max_tokens=out_len, ignore_eos=True))


def scenarios(budget: int, max_len: int, quick: bool, gpu: bool = False) -> list[tuple[str, list, list]]:
    """(name, requests at once [(prompt, output)], requests added after two steps).

    CPU: sized for a few minutes on 2 cores (decode batches up to 48 at short context, up to 16 at 384
    tokens, one long-context pair). GPU: batches up to 448 and contexts up to 4k. Both end with decodes
    mixed with a prefill chunk."""
    lengths = [16, 64, 128, 256, 512, 1024] + ([2048, 4096, 8192] if gpu else []) if not quick else [16, 128]
    cases = [(f"prefill-{n}", [(n, 1)], []) for n in lengths if n <= min(budget, max_len - 1)]
    grid = [(32, [1, 2, 4, 8, 16, 32, 48]), (384, [1, 4, 16]), (1024, [2])] if not quick else [(32, [1, 4])]
    if gpu and not quick:  # up to the offline benchmarks' shapes: 448 decodes at 2k context, 8k-token chunks
        grid = [(128, [1, 8, 32, 64, 128, 256, 448]), (1024, [1, 16, 64, 128, 256, 448]), (2000, [64, 384]),
                (4000, [4, 16])]
    for ctx, batches in grid:
        if ctx + 12 > max_len:  # profile at the workload's max_model_len: skip contexts it cannot hold
            continue
        for b in batches:
            # Every request outlives the batch's prefill steps (ceil(b * ctx / budget)), so the scenario
            # ends with 12 steps of all b decoding at once: the large decode batches the offline runs spend
            # most of their time in (with 12 outputs each, a 448 x 1k batch never ran more than ~45 at once).
            out_len = 12 + -(-b * ctx // budget)
            prompt = min(ctx, max_len - out_len)  # keep prompt + outputs within max_model_len
            cases.append((f"decode-b{b}-ctx{ctx}", [(prompt, out_len)] * b, []))
    if not quick:
        mixed = [(8, 256), (16, 128), (4, 512)]
        if gpu:
            mixed += [(64, 2048), (256, 4000), (256, 8000)]
        for b, p in mixed:
            if p <= budget and p + 2 <= max_len:
                cases.append((f"mixed-b{b}-prefill{p}", [(48, 10)] * b, [(p, 2)]))
    return cases


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model dir or preset; default: the embedded default model")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs per engine (tensor parallelism)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a handful of scenarios (smoke test)")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    import torch

    from shared_engine import LLM, SamplingParams

    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
              enable_prefix_caching=False, async_scheduling=False,  # one step per engine.step(), timed whole
              tensor_parallel_size=args.tensor_parallel_size)
    engine = llm.engine
    device = engine.runner.device.type
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    llm.generate([[5] * 32] * 2, SamplingParams(max_tokens=4), use_tqdm=False)  # warm-up
    recorder = StepRecorder(engine, sync)
    started = time.perf_counter()
    for repeat in range(args.repeats):
        for name, now, late in scenarios(args.max_num_batched_tokens, args.max_model_len, args.quick,
                                         device == "cuda"):
            recorder.run(name, now, late)
            print(f"[{time.perf_counter() - started:6.1f}s] repeat {repeat} {name}: {len(recorder.steps)} steps",
                  flush=True)
    ceilings = measure_ceilings(device, engine.runner.dtype)
    result = {
        "what": "engine step wall time (LLMEngine.step) against batch composition",
        "command": "python " + " ".join(sys.argv),
        "environment": environment(),
        "load_average": _load_average(),
        "model": engine.source.name,
        "model_config": engine.source.config,
        "dtype": engine.runner.dtype_name,
        "device": device,
        "engine_config": engine.config.to_flat(),
        "ceilings": ceilings,
        "item_fields": ["start_position", "num_new_tokens", "needs_sample"],
        "steps": recorder.steps,
        "elapsed_s": time.perf_counter() - started,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, separators=(",", ":")) + "\n")
    print(f"wrote {len(recorder.steps)} steps to {out}; ceilings {ceilings}")
    llm.shutdown()


def _load_average() -> list[float] | str:
    try:
        return list(os.getloadavg())
    except OSError:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


if __name__ == "__main__":
    main()
