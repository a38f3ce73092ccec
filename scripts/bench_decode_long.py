"""Decode attention at small batch and long context on a CUDA GPU: batch 1, 2, 4 x 16k-128k tokens (32 q / 8 kv
heads, head_dim 128, bf16, block size 16, shuffled block tables), timed as CUDA graph replays with
max_context_len 131,072 (what the engine's graphs pass at llama-3.1-8b's full context). Each case times the
variants of VARIANTS in the same run: `two_kernel` (6e21304's path: split kernel, then a reduce kernel),
`fused` (the launcher's default: the split kernel's last program per sequence and kv head merges, one
launch), `fused_32` (fused, at most 32 splits: one round of loads in the merge) and `fused_interleaved`
(fused, split s reading tiles s, s + splits, ...: its first block-table load does not wait for the length),
`fused_mst512` (fused, one active split per 512 tokens of the actual context: 32 at 16k, all 132 from 66k),
`fused_2d` (fused, the merge one query head at a time in 2-D tiles, its loop not pipelined), and
`two_kernel_pdl` / `fused_pdl` (programmatic dependent launch: each kernel launches while the one before it
ends and waits in-kernel, griddepcontrol; needs Triton's launch_pdl).
Reports KV bytes read over the measured device-to-device copy bandwidth; issue 21's target is >= 70% at
batch 1-4, 16k-128k.
Every case also checks each variant against two_kernel (max |diff|), and batch 1 at 16k against the torch
reference. Each variant, the check, the diagnostics and each sweep part run in a child process, so a fault
in one (an illegal memory access poisons the CUDA context) leaves the others' rows; failures go to `errors`.

`diagnostics` (batch 1, 16k, 132 splits) place the fixed cost: the reduce kernel alone, and both paths over
empty contexts (no KV read: launch, ramp and merge only).

Usage: python scripts/bench_decode_long.py --out benchmarks/results/decode_long_h200.json [--sweep]
(about 150 s on an H200: 8 variants x 12 cases of graph timings, each variant in its own process, the check,
diagnostics). `--sweep` adds
decode_long_sweep.py (variant x splits x reduce tile at batch 1 16k / 128k, kernel configs at 16k, splits
at batch 2 / 4: about 90 timings and 30 compiles, about 120 s more).
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
    reduce_splits,
)

HQ, HK, D, BS = 32, 8, 128, 16
MAX_MODEL_LEN = 131072
BATCHES, CONTEXTS = (1, 2, 4), (16384, 32768, 65536, 131072)
CHILD_TIMEOUT_S = 150


def heuristic_splits(batch: int) -> int:
    return choose_num_splits(batch, HK, MAX_MODEL_LEN, NUM_SMS)


# name -> launcher keyword arguments at a batch size
VARIANTS = {
    "two_kernel": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=False),
    "fused": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=True),
    "fused_32": lambda b: dict(num_splits=min(32, heuristic_splits(b)), fuse_reduce=True, reduce_tile=32),
    "fused_interleaved": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=True, interleave=True),
    "fused_mst512": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=True, min_split_tokens=512),
    "fused_2d": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=True, merge_2d=True),
    "two_kernel_pdl": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=False, pdl=True),
    "fused_pdl": lambda b: dict(num_splits=heuristic_splits(b), fuse_reduce=True, pdl=True),
}


class Case:
    """One (batch, context) problem on the GPU, and graph timings of launcher keyword sets on it."""

    def __init__(self, batch: int, ctx: int, copy_gbs: float, gen, lens_value: int | None = None):
        self.k_cache, self.v_cache, self.bt = paged_setup(batch, ctx, HK, D, BS, gen)
        self.lens = torch.full((batch,), ctx if lens_value is None else lens_value, dtype=torch.int32, device=DEV)
        self.q = torch.randn(batch, HQ, D, device=DEV, dtype=BF16)
        self.out = torch.empty_like(self.q)
        self.nbytes = 2 * batch * ctx * HK * D * 2
        self.copy_gbs = copy_gbs

    def run(self, out=None, **kw) -> torch.Tensor:
        return paged_decode_attention(self.q, self.k_cache, self.v_cache, self.bt, self.lens, D**-0.5,
                                      out=self.out if out is None else out, max_context_len=MAX_MODEL_LEN, **kw)

    def time(self, rep: int = 50, **kw) -> dict:
        """Median us per call over CUDA graph replays, and % of the copy bandwidth; compile outside (then a
        sync: do_bench_cudagraph works on its own stream, which must not overlap this launch)."""
        self.run(**kw)
        torch.cuda.synchronize()
        us = triton.testing.do_bench_cudagraph(lambda: self.run(**kw), rep=rep, return_mode="median") * 1e3
        return {**kw, "us": us, "pct_copy_bw": 100 * self.nbytes / us / 1e3 / self.copy_gbs}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def time_case(batch: int, ctx: int, copy_gbs: float, gen, names=tuple(VARIANTS), check: bool = True) -> dict:
    case = Case(batch, ctx, copy_gbs, gen)
    row = {"batch": batch, "context": ctx}
    for name in names:
        row[name] = case.time(**VARIANTS[name](batch))
    if not check:
        return row
    two = case.run(out=torch.empty_like(case.q), **VARIANTS["two_kernel"](batch))
    row["fused_vs_two_kernel_max_abs"] = max(
        max_abs_diff(case.run(out=torch.empty_like(case.q), **VARIANTS[n](batch)), two)
        for n in VARIANTS if n != "two_kernel"
    )
    if batch == 1 and ctx == CONTEXTS[0]:
        ref = paged_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.bt, case.lens, D**-0.5)
        row["rel_err_vs_ref"] = {n: rel_err(case.run(out=torch.empty_like(case.q), **VARIANTS[n](1)), ref)
                                 for n in VARIANTS}
    return row


def bench_decode_long(copy_gbs: float, gen, names=tuple(VARIANTS), check: bool = True) -> list[dict]:
    rows = []
    for batch in BATCHES:
        for ctx in CONTEXTS:
            rows.append(time_case(batch, ctx, copy_gbs, gen, names, check))
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()
    return rows


def check_rows(gen) -> list[dict]:
    """Every case: each variant's output against the two-kernel path's (and batch 1 at 16k: the reference)."""
    rows = []
    for batch in BATCHES:
        for ctx in CONTEXTS:
            case = Case(batch, ctx, 1.0, gen)
            two = case.run(out=torch.empty_like(case.q), **VARIANTS["two_kernel"](batch))
            outs = {}
            for n in VARIANTS:
                try:  # e.g. no launch_pdl in this Triton: recorded, the other variants still checked
                    outs[n] = case.run(out=torch.empty_like(case.q), **VARIANTS[n](batch))
                except Exception as e:
                    outs[n] = f"{type(e).__name__}: {str(e)[:150]}"
            row = {"batch": batch, "context": ctx, "max_abs_vs_two_kernel": {
                n: max_abs_diff(o, two) if isinstance(o, torch.Tensor) else o
                for n, o in outs.items() if n != "two_kernel"}}
            if batch == 1 and ctx == CONTEXTS[0]:
                ref = paged_decode_attention_ref(case.q, case.k_cache, case.v_cache, case.bt, case.lens, D**-0.5)
                row["rel_err_vs_ref"] = {n: rel_err(o, ref) if isinstance(o, torch.Tensor) else o
                                         for n, o in outs.items()}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del case
            torch.cuda.empty_cache()
    return rows


def diagnostics(copy_gbs: float, gen) -> dict:
    """Batch 1 at 16k, 132 splits: the reduce kernel alone, and both paths over empty contexts."""
    splits = heuristic_splits(1)
    part_out = torch.zeros(1, HQ, splits, D, device=DEV, dtype=torch.float32)
    part_lse = torch.zeros(1, HQ, splits, device=DEV, dtype=torch.float32)
    out = torch.empty(1, HQ, D, device=DEV, dtype=BF16)
    reduce_splits(part_out, part_lse, out, splits)
    res = {"num_splits": splits, "reduce_kernel_alone_us": triton.testing.do_bench_cudagraph(
        lambda: reduce_splits(part_out, part_lse, out, splits), rep=50, return_mode="median") * 1e3}
    empty = Case(1, CONTEXTS[0], copy_gbs, gen, lens_value=0)
    for name in ("two_kernel", "fused"):
        res[f"{name}_empty_context_us"] = empty.time(rep=50, **VARIANTS[name](1))["us"]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="path of the JSON results file")
    ap.add_argument("--sweep", action="store_true", help="also sweep variants, splits and kernel configs")
    ap.add_argument("--only", help="(a child process) one job: a variant name, check, diagnostics or sweep")
    ap.add_argument("--copy-gbs", type=float, help="(a child process) the parent's measured copy bandwidth")
    args = ap.parse_args()
    gen = torch.Generator(device=DEV).manual_seed(0)
    torch.manual_seed(0)
    if args.only:
        Path(args.out).write_text(json.dumps(child_job(args.only, args.copy_gbs, gen)))
        return
    commit = os.environ.get("GIT_COMMIT") or subprocess.run(  # the device copy has no .git
        ["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    ceilings = measure_ceilings()
    torch.cuda.empty_cache()
    copy_gbs = ceilings["copy_GBps"]
    results = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
               "commit": commit or "unknown",
               "command": "python scripts/bench_decode_long.py --out " + args.out + (" --sweep" if args.sweep else ""),
               "shapes": {"num_q_heads": HQ, "num_kv_heads": HK, "head_dim": D, "block_size": BS, "dtype": "bf16",
                          "max_context_len": MAX_MODEL_LEN,
                          "timing": "do_bench_cudagraph median, rep 50 ms (sweep 25 ms)"},
               "isolation": "each variant, the output check, the diagnostics and each sweep part in its own "
                            "process (a fault in one leaves the others' rows)",
               "ceilings": ceilings, "errors": {}}
    rows = {(b, c): {"batch": b, "context": c} for b in BATCHES for c in CONTEXTS}
    for name in VARIANTS:
        for r in run_child(name, copy_gbs, args.out, results["errors"]) or []:
            rows[(r["batch"], r["context"])][name] = r[name]
    results["decode_long"] = list(rows.values())
    for r in run_child("check", copy_gbs, args.out, results["errors"]) or []:
        rows[(r["batch"], r["context"])].update({k: v for k, v in r.items() if k not in ("batch", "context")})
    results["diagnostics"] = run_child("diagnostics", copy_gbs, args.out, results["errors"]) or {}
    Path(args.out).write_text(json.dumps(results, indent=1))  # kept if the sweep runs out of time
    if args.sweep:
        from decode_long_sweep import PARTS, summarise

        results["sweep"] = []
        for part in PARTS:
            results["sweep"] += run_child("sweep" + part, copy_gbs, args.out, results["errors"]) or []
            Path(args.out).write_text(json.dumps(results, indent=1))
        results["sweep_best"] = summarise(results["sweep"])
        Path(args.out).write_text(json.dumps(results, indent=1))
    print_summary(results)


def child_job(job: str, copy_gbs: float, gen):
    if job in VARIANTS:
        return bench_decode_long(copy_gbs, gen, names=(job,), check=False)
    if job == "check":
        return check_rows(gen)
    if job == "diagnostics":
        return diagnostics(copy_gbs, gen)
    from decode_long_sweep import sweep

    return sweep(copy_gbs, gen, parts=job.removeprefix("sweep"))


def run_child(job: str, copy_gbs: float, out: str, errors: dict):
    """Run one job in a child process; its JSON, or None (the error's tail in `errors`)."""
    part = f"{out}.{job}.json"
    cmd = [sys.executable, __file__, "--only", job, "--copy-gbs", str(copy_gbs), "--out", part]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:  # the child is killed; e.g. a kernel that never returns
        errors[job] = f"timeout after {CHILD_TIMEOUT_S} s: " + str(e.stdout or "")[-1500:]
        print(f"{job}: TIMEOUT", flush=True)
        return None
    for line in p.stdout.splitlines():
        print(line, flush=True)
    if p.returncode != 0 or not Path(part).exists():
        errors[job] = f"rc {p.returncode}: " + (p.stdout + p.stderr)[-1500:]
        print(f"{job}: FAILED rc {p.returncode}\n" + p.stderr[-800:], flush=True)
        return None
    data = json.loads(Path(part).read_text())
    Path(part).unlink()
    return data


def print_summary(results: dict) -> None:
    print(f"\n{results['gpu']}  copy {results['ceilings']['copy_GBps']:.0f} GB/s")
    print("batch | context | " + " | ".join(f"{n}: splits, us, % bw" for n in VARIANTS) + " | max|diff| vs 2k")
    for r in results["decode_long"]:
        cells = [f"{r[n]['num_splits']:>4} {r[n]['us']:7.1f} {r[n]['pct_copy_bw']:5.1f}" if n in r else "  (failed)"
                 for n in VARIANTS]
        diffs = [v for v in (r.get("max_abs_vs_two_kernel") or {}).values() if isinstance(v, float)]
        diff = f"{max(diffs):.1e}" if diffs else "-"
        print(f"{r['batch']:>5} | {r['context']:>7} | " + " | ".join(cells) + f" | {diff}")
    print("diagnostics:", json.dumps({k: round(v, 2) if isinstance(v, float) else v
                                      for k, v in results["diagnostics"].items()}))
    for key, best in results.get("sweep_best", {}).items():
        print(f"sweep best {key}: {json.dumps(best)}")
    for job, err in results["errors"].items():
        print(f"FAILED {job}: {err[-300:]}")


if __name__ == "__main__":
    main()
