"""Where a real decode step's time goes (CUDA): runs the engine on N identical requests and traces a window of
steady decode steps with torch.profiler, then splits the window's wall time into GPU kernel time by kernel
and GPU idle time (the gaps between kernels, when the device waits for the host).

    python scripts/profile_decode_loop.py --out OUT.json [--model llama-3.1-8b] [--batch 1]
        [--input-len 32] [--output-len 160] [--trace-steps 32] [--enable-async-output-proc] [--async-scheduling]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.env_info import environment  # noqa: E402
from benchmarks.kernel_names import kernel_key  # noqa: E402


def summarise(prof, steps: int) -> dict:
    """Per-step kernel milliseconds by kernel, and the device's busy and idle time over the traced window."""
    kernels = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                     if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
    if not kernels:
        return {}
    totals: dict[str, float] = defaultdict(float)
    busy = 0.0
    covered_to = kernels[0][0]
    for start, end, name in kernels:
        totals[kernel_key(name)] += (end - start) / 1e3
        busy += max(0.0, end - max(start, covered_to)) / 1e3  # union of kernel intervals (ms)
        covered_to = max(covered_to, end)
    window = (covered_to - kernels[0][0]) / 1e3
    return {"steps": steps, "window_ms_per_step": window / steps, "gpu_busy_ms_per_step": busy / steps,
            "gpu_idle_ms_per_step": (window - busy) / steps,
            "kernels_ms_per_step": {k: v / steps for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=160)
    p.add_argument("--trace-steps", type=int, default=32)
    p.add_argument("--enable-async-output-proc", action="store_true")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from torch.profiler import ProfilerActivity, profile

    from shared_engine import LLM, SamplingParams

    llm = LLM(args.model, load_format="dummy", max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=max(8, args.batch), enable_async_output_proc=args.enable_async_output_proc,
              async_scheduling=args.async_scheduling)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate([[5] * 16], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    for i in range(args.batch):
        engine.add_request(f"r{i}", [5 + i] * args.input_len, params)
    warm = args.output_len - args.trace_steps - 8  # steps before the traced window: prefill and early decodes
    for _ in range(warm):
        engine.step()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(args.trace_steps):
            engine.step()
        sync()
    while engine.has_unfinished_requests():
        engine.step()
    result = {"environment": environment(), "args": vars(args) | {"out": str(args.out)},
              "decode": summarise(prof, args.trace_steps)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["decode"], indent=1))


if __name__ == "__main__":
    main()
