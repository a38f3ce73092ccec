"""Locate the illegal memory access the fused split-K merge hit in bench_decode_long.py at c518670 (H200).

Each step runs in its own process (a fault poisons the CUDA context) on the bench's problem: batch 1, 16k
tokens, 32 q / 8 kv heads, head_dim 128, bf16, block size 16, shuffled block table, max_context_len 131,072
(132 splits). A step prints OK (and the max |diff| against the two-kernel path) or the error:
  eager        50 fused launches on the default stream, each checked against the two-kernel path;
  graph        torch.cuda.graph: 200 fused launches captured after a sync, replayed 5 times, checked;
  side_sync    the bench's timing pattern (an eager launch, then triton's do_bench_cudagraph on its own
               stream) with a torch.cuda.synchronize() between them;
  side_overlap the same without the sync, as the bench did at c518670 (the eager launch and the side
               stream's launches may overlap and share the counter buffer);
  two_streams  fused launches on two streams at once, each with its own counter buffer;
  eager_2d, side_overlap_2d   eager and side_overlap with merge_2d=True (the merge in 2-D tiles, one query
               head at a time, its loop not pipelined).
With SANITIZE=1 the first failing step is run again under `compute-sanitizer --tool memcheck` (the first
errors and the kernel that made them; at most 60 s). Usage: python scripts/decode_fused_repro.py [--out FILE.json]
(about 50 s on an H200; a sanitizer run of the first failing step adds up to 60 s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

STEPS = ("eager", "graph", "side_sync", "side_overlap", "two_streams", "eager_2d", "side_overlap_2d")


def setup():
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from kernel_bench_common import paged_setup

    gen = torch.Generator(device="cuda").manual_seed(0)
    k_cache, v_cache, bt = paged_setup(1, 16384, 8, 128, 16, gen)
    lens = torch.full((1,), 16384, dtype=torch.int32, device="cuda")
    q = torch.randn(1, 32, 128, device="cuda", dtype=torch.bfloat16)
    return q, k_cache, v_cache, bt, lens


def run_step(step: str) -> dict:
    import torch
    import triton

    from kernels.paged_decode_attention import paged_decode_attention

    q, k_cache, v_cache, bt, lens = setup()

    merge_2d = step.endswith("_2d")
    step = step.removesuffix("_2d")

    def call(fuse, out=None, counters=None):
        return paged_decode_attention(q, k_cache, v_cache, bt, lens, 128**-0.5, out=out, fuse_reduce=fuse,
                                      max_context_len=131072, counters=counters, merge_2d=merge_2d and fuse)

    ref = call(False)
    torch.cuda.synchronize()
    diffs = []
    if step == "eager":
        for _ in range(50):
            diffs.append(call(True))
    elif step == "graph":
        out = torch.empty_like(q)
        call(True, out=out)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(200):
                call(True, out=out)
        for _ in range(5):
            out.fill_(float("nan"))
            g.replay()
            torch.cuda.synchronize()
            diffs.append(out.clone())
    elif step in ("side_sync", "side_overlap"):
        out = torch.empty_like(q)
        call(True, out=out)  # the bench's warm-up launch on the default stream
        if step == "side_sync":
            torch.cuda.synchronize()
        us = triton.testing.do_bench_cudagraph(lambda: call(True, out=out), rep=100, return_mode="median") * 1e3
        torch.cuda.synchronize()
        diffs.append(out)
        print(f"{step}: {us:.1f} us per call", flush=True)
    elif step == "two_streams":
        streams = [torch.cuda.Stream(), torch.cuda.Stream()]
        counters = [torch.zeros(8, dtype=torch.int32, device="cuda") for _ in streams]
        outs = [torch.empty_like(q) for _ in streams]
        torch.cuda.synchronize()
        for _ in range(20):
            for s, c, o in zip(streams, counters, outs):
                with torch.cuda.stream(s):
                    call(True, out=o, counters=c)
        torch.cuda.synchronize()
        diffs.extend(outs)
    torch.cuda.synchronize()
    return {"step": step + ("_2d" if merge_2d else ""), "ok": True,
            "max_abs_diff_vs_two_kernel": max((d.float() - ref.float()).abs().max().item() for d in diffs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--step", choices=STEPS, help="run one step in this process")
    ap.add_argument("--out", help="JSON results file (all steps)")
    args = ap.parse_args()
    if args.step:
        print("RESULT " + json.dumps(run_step(args.step)), flush=True)
        return
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": f"{root}:{os.environ.get('PYTHONPATH', '')}"}
    results = []
    for step in STEPS:
        cmd = [sys.executable, __file__, "--step", step]
        res = _run(cmd, env, 60)
        if not res["ok"] and os.environ.get("SANITIZE") and not any("sanitizer_tail" in r for r in results):
            san = _run(["compute-sanitizer", "--tool", "memcheck", "--print-limit", "4", *cmd], env, 60)
            res["sanitizer_tail"] = san["tail"]
        results.append(res)
        print(json.dumps({k: v for k, v in res.items() if k != "tail"} | {"tail": res["tail"][-600:]}), flush=True)
        if args.out:  # after every step: kept if a later one runs out of time
            Path(args.out).write_text(json.dumps(results, indent=1))


def _run(cmd: list[str], env: dict, timeout: int) -> dict:
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"cmd": " ".join(cmd[-2:]), "ok": False, "rc": "timeout", "tail": ""}
    text = p.stdout + p.stderr
    line = next((ln for ln in text.splitlines() if ln.startswith("RESULT ")), None)
    res = json.loads(line[7:]) if line else {"ok": False}
    return {"cmd": " ".join(cmd[-2:]), **res, "rc": p.returncode, "tail": text[-3000:]}


if __name__ == "__main__":
    main()
