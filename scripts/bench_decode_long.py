"""Decode attention at small batch and long context on a CUDA GPU: batch 1, 2, 4 x 16k-128k tokens (32 q / 8 kv
heads, head_dim 128, bf16, block size 16, shuffled block tables), timed as CUDA graph replays with
max_context_len 131,072 (what the engine's graphs pass at llama-3.1-8b's full context), with the current split
heuristic and with the previous one (two programs per SM, at most 64 splits). Reports KV bytes read over the
measured device-to-device copy bandwidth; issue 21's target is >= 70% at batch 1-4, 16k-128k.

Usage: python scripts/bench_decode_long.py --out benchmarks/results/decode_long_h200.json [--sweep]
(about 30 s on an H200: JIT of two kernels, 24 graph timings, one reference check at 16k). `--sweep` also
times batch 1 at 16k and 128k over splits x BLOCK_N x pipeline stages x warps (180 graph timings, 18
compiles; about 60 s more), to find what removes the ~14 us fixed cost per call seen at 284c523.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernel_bench_common import BF16, DEV, NUM_SMS, measure_ceilings, paged_setup, rel_err  # noqa: E402

from kernels.paged_decode_attention import (  # noqa: E402
    choose_num_splits,
    paged_decode_attention,
    paged_decode_attention_ref,
)

HQ, HK, D, BS = 32, 8, 128, 16
MAX_MODEL_LEN = 131072


def previous_splits(batch: int, ctx: int) -> int:
    return choose_num_splits(batch, HK, ctx, NUM_SMS, small_batch_programs_per_sm=2, max_splits=64)


def bench_decode_long(copy_gbs: float, gen) -> list[dict]:
    rows = []
    for batch in (1, 2, 4):
        for ctx in (16384, 32768, 65536, 131072):
            rows.append(time_case(batch, ctx, copy_gbs, gen))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    return rows


def time_case(batch: int, ctx: int, copy_gbs: float, gen) -> dict:
    k_cache, v_cache, bt = paged_setup(batch, ctx, HK, D, BS, gen)
    lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
    out = torch.empty_like(q)
    nbytes = 2 * batch * ctx * HK * D * 2
    row = {"batch": batch, "context": ctx}
    for name, splits in (("current", choose_num_splits(batch, HK, MAX_MODEL_LEN, NUM_SMS)),
                         ("previous", previous_splits(batch, MAX_MODEL_LEN))):
        def fn(s=splits):
            paged_decode_attention(q, k_cache, v_cache, bt, lens, D**-0.5, out=out, num_splits=s,
                                   max_context_len=MAX_MODEL_LEN)

        fn()  # compile outside the graph
        us = triton.testing.do_bench_cudagraph(fn, rep=100) * 1e3
        row[name] = {"num_splits": splits, "us": us, "pct_copy_bw": 100 * nbytes / us / 1e3 / copy_gbs}
    if batch == 1 and ctx == 16384:
        paged_decode_attention(q, k_cache, v_cache, bt, lens, D**-0.5, out=out, max_context_len=MAX_MODEL_LEN)
        ref = paged_decode_attention_ref(q, k_cache, v_cache, bt, lens, D**-0.5)
        row["rel_err_vs_ref"] = rel_err(out, ref)
    return row


SWEEP_SPLITS = (16, 33, 66, 132, 256)
SWEEP_CONFIGS = [(bn, st, w) for bn in (32, 64, 128) for st in (2, 3, 4) for w in (4, 8)]


def sweep(copy_gbs: float, gen) -> list[dict]:
    rows = []
    for ctx in (16384, 131072):
        found = sweep_context(ctx, copy_gbs, gen)
        ok = [r for r in found if "us" in r]
        if ok:
            print(f"sweep best at {ctx}: {json.dumps(min(ok, key=lambda r: r['us']))}", flush=True)
        rows.extend(found)
        torch.cuda.empty_cache()
    return rows


def sweep_context(ctx: int, copy_gbs: float, gen) -> list[dict]:
    k_cache, v_cache, bt = paged_setup(1, ctx, HK, D, BS, gen)
    lens = torch.full((1,), ctx, dtype=torch.int32, device=DEV)
    q = torch.randn(1, HQ, D, device=DEV, dtype=BF16)
    out = torch.empty_like(q)
    nbytes = 2 * ctx * HK * D * 2

    def fn(**kw):
        paged_decode_attention(q, k_cache, v_cache, bt, lens, D**-0.5, out=out, max_context_len=MAX_MODEL_LEN, **kw)

    rows = []
    for block_n, stages, warps in SWEEP_CONFIGS:
        for splits in SWEEP_SPLITS:
            kw = dict(num_splits=splits, block_n=block_n, num_stages=stages, num_warps=warps)
            row = {"batch": 1, "context": ctx, **kw}
            try:
                fn(**kw)
                us = triton.testing.do_bench_cudagraph(lambda kw=kw: fn(**kw), rep=40) * 1e3
                row.update(us=us, pct_copy_bw=100 * nbytes / us / 1e3 / copy_gbs)
            except Exception as e:  # e.g. out of shared memory: record and go on
                row["error"] = str(e)[:200]
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    ap.add_argument("--sweep", action="store_true", help="also sweep splits and kernel configs at batch 1")
    args = ap.parse_args()
    commit = os.environ.get("GIT_COMMIT") or subprocess.run(  # the device copy has no .git
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    ceilings = measure_ceilings()
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
               "commit": commit or "unknown", "command": "python scripts/bench_decode_long.py --out " + args.out,
               "shapes": {"num_q_heads": HQ, "num_kv_heads": HK, "head_dim": D, "block_size": BS, "dtype": "bf16",
                          "max_context_len": MAX_MODEL_LEN, "timing": "do_bench_cudagraph median, rep 100 ms"},
               "ceilings": ceilings, "decode_long": bench_decode_long(ceilings["copy_GBps"], gen)}
    if args.sweep:
        results["sweep"] = sweep(ceilings["copy_GBps"], gen)
    Path(args.out).write_text(json.dumps(results, indent=1))
    print(f"\n{results['gpu']}  copy {ceilings['copy_GBps']:.0f} GB/s")
    print("batch | context | current splits, us, % bw | previous splits, us, % bw")
    for r in results["decode_long"]:
        c, p = r["current"], r["previous"]
        print(f"{r['batch']:>5} | {r['context']:>7} | {c['num_splits']:>4} {c['us']:8.1f} {c['pct_copy_bw']:5.1f}"
              f" | {p['num_splits']:>4} {p['us']:8.1f} {p['pct_copy_bw']:5.1f}")


if __name__ == "__main__":
    main()
