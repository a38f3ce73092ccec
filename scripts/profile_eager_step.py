"""Where an eager (non-CUDA-graph) step's time goes: torch profiler + cProfile over a few prefill steps.

    python scripts/profile_eager_step.py --model llama-3.1-8b --load-format dummy --prompt-len 256
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    import torch

    from shared_engine import LLM, SamplingParams

    llm = LLM(args.model, load_format=args.load_format, max_model_len=4096, enable_prefix_caching=False)
    sp = SamplingParams(max_tokens=1, ignore_eos=True)
    ids = lambda k: [[100 + k + i % 5000 for i in range(args.prompt_len)]]
    for k in range(3):
        llm.generate(ids(k), sp, use_tqdm=False)
    torch.cuda.synchronize()
    times = []
    for k in range(args.repeats):
        t = time.perf_counter()
        llm.generate(ids(10 + k), sp, use_tqdm=False)
        torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - t))
    print("request ms", [round(x, 2) for x in times])
    prof = cProfile.Profile()
    prof.enable()
    llm.generate(ids(99), sp, use_tqdm=False)
    torch.cuda.synchronize()
    prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
    print(s.getvalue()[:6000])
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as tp:
        llm.generate(ids(98), sp, use_tqdm=False)
        torch.cuda.synchronize()
    print(tp.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=60))
    print(tp.key_averages().table(sort_by="cuda_time_total", row_limit=15, max_name_column_width=60))


if __name__ == "__main__":
    main()
