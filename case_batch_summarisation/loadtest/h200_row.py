"""An H200 results file of `h200_run.sh` (offline_run.py's JSON) as the README's table, and (with
`--calibrate`) the cost model recalibrated on it: the H200 section's rows and the night's GPUs come from the
same file.

    python -m case_batch_summarisation.loadtest.h200_row case_batch_summarisation/the_fix/offline_h200_<sha>.json
    python -m case_batch_summarisation.loadtest.h200_row FILE --calibrate   # + copies FILE to
        # the_fix/offline_h200.json (the cost model's default; the file it replaces is kept as
        # offline_h200_<its commit>.json) and rewrites cost_model.json from it
    python -m case_batch_summarisation.loadtest.h200_row FILE_gpu0 FILE_gpu1 [--calibrate]  # GPUS=2

A run stopped by its time limit (`partial_run` in the file) prints what it reached and is refused for
calibration (exit status 1): a partial run's rate is not the all-at-once run's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

CASE_DIR = Path(__file__).resolve().parents[1]
ROOT = CASE_DIR.parent


def table(d: dict) -> str:
    """The README's "NVIDIA H200" table (markdown) from one complete results file."""
    r, w = d["run"], d["workload"]
    rows = [("tickets, all queued at once", f"{r['num_rows']:,} (log-normal, median {w['median_tokens']:.0f} "
             f"tokens, sigma {w['sigma']}, cut at {w['max_ticket_tokens']:,}; seed {w['seed']})"),
            ("tickets failed", f"{r['num_failed']:,}"),
            ("elapsed (first request queued → output file renamed)", f"{r['elapsed_s']:.1f} s"),
            ("**tickets/s**", f"**{r['rows_per_s']:.1f}**"),
            ("output tokens/s", f"{r['output_tokens_per_s']:,.0f}"),
            ("prompt tokens/s (sent) / prefill tokens/s (computed)",
             f"{r['prompt_tokens_per_s']:,.0f} / **{r['prefill_tokens_per_s']:,.0f}**"),
            ("prompt / summary tokens per ticket",
             f"{r['prompt_tokens'] / r['num_rows']:,.1f} / {r['completion_tokens'] / r['num_rows']:.1f}"),
            ("prefix cache: hit rate of prompt tokens / shared instruction", f"{100 * r['prefix_cache_hit_rate']:.1f}%"
             f" / {r['shared_prefix_tokens']} tokens"),
            ("preemptions", f"{d['scheduler']['num_preemptions']:,}")]
    cfg = d.get("engine_config", {})
    rows.append(("weights / KV cache", f"{'FP8 (online, per channel)' if cfg.get('quantization') == 'fp8' else 'bf16'}"
                 f" / {'FP8' if cfg.get('kv_cache_dtype', 'auto') != 'auto' else 'bf16'}"))
    rl = d.get("roofline")
    if rl:
        fp8 = (f", {rl['matmul_fp8_flops_per_s'] / 1e12:,.0f} TFLOP/s FP8 matmul (the linear layers' rate)"
               if rl.get("weight_dtype") == "fp8" else "")
        rows += [(f"roofline (benchmarks/roofline.py; measured {rl['copy_bandwidth_bytes_per_s'] / 1e12:.2f} TB/s "
                  f"copy, {rl['matmul_bf16_flops_per_s'] / 1e12:.0f} TFLOP/s bf16 matmul{fp8})",
                  f"{rl['bound_time_s']:.1f} s, {rl['bound']}-bound"),
                 ("**share of the roofline**", f"**{100 * rl['fraction_of_roofline']:.1f}%**"),
                 ("prefill matmul + attention FLOPs alone over the matmul rate",
                  f"{rl['prefill_compute_bound_s']:.1f} s ({100 * rl['fraction_of_prefill_compute_bound']:.1f}% "
                  "of the elapsed time)")]
    rows.append(("engine start (dummy weights, compile, CUDA graphs)", f"{d['startup_s']:.1f} s"))
    head = (f"`{d.get('_file', 'FILE')}`: {d['hardware'].get('gpu')} "
            f"({d['hardware'].get('gpu_memory_bytes', 0) / 2**20:,.0f} MiB), commit `{d['commit'][:8]}`, "
            f"command `{d['command']}`\n\n| | the fix, one H200 |\n|---|---|\n")
    return head + "\n".join(f"| {k} | {v} |" for k, v in rows)


def load(path: Path) -> dict:
    d = json.loads(path.read_text())
    try:
        d["_file"] = str(path.resolve().relative_to(CASE_DIR))
    except ValueError:
        d["_file"] = str(path)
    return d


def together(runs: list[dict]) -> str:
    """Workers that ran at once (h200_run.sh GPUS=k): tickets, the slowest worker's time, the sum's rate."""
    n = sum(d["run"]["num_rows"] for d in runs)
    wall = max(d["run"]["elapsed_s"] for d in runs)
    per_gpu = ", ".join(f"{d['run']['rows_per_s']:.1f}" for d in runs)
    return (f"{len(runs)} workers together: {n:,} tickets in {wall:.1f} s (the slowest worker) = {n / wall:.1f} "
            f"tickets/s; per GPU {per_gpu}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", type=Path, nargs="+", help="one file, or one per worker of a GPUS=k run")
    p.add_argument("--calibrate", action="store_true", help="with several files: on the slowest worker's")
    args = p.parse_args(argv)
    runs = [load(f) for f in args.files]
    for d in runs:
        if "partial_run" in d:
            pr = d["partial_run"]
            asked = d.get("workload", {}).get("num_tickets", 0)  # absent: stopped before the main run
            print(f"{d['_file']}: partial run (stopped by {pr['stopped_by']}): {pr['num_rows_finished']:,} of "
                  f"{asked:,} tickets finished in {pr['elapsed_s']:.1f} s "
                  f"({pr['rows_per_s']:.1f} tickets/s, {pr['prefill_tokens_per_s']:,.0f} prefill tok/s); "
                  "not calibrating")
            return 1
    for d in runs:
        print(table(d) + "\n")
    if len(runs) > 1:
        print(together(runs))
    if args.calibrate:
        slowest = min(zip(runs, args.files), key=lambda x: x[0]["run"]["rows_per_s"])[1]
        target = CASE_DIR / "the_fix" / "offline_h200.json"
        if slowest.resolve() != target.resolve():
            if target.exists():  # the run it replaces keeps its file, named by its commit
                old = json.loads(target.read_text())
                keep = target.with_name(f"offline_h200_{old['commit'][:7]}.json")
                if not keep.exists():
                    target.rename(keep)
                    print(f"kept the previous calibration run as {keep.name}")
            shutil.copyfile(slowest, target)
        sys.path.insert(0, str(ROOT))
        from case_batch_summarisation import cost_model

        result = cost_model.main(["--json", str(CASE_DIR / "cost_model.json")])
        h = result["gpus"]["h200"]["1x"]
        print(f"\nthe night (calibrated on {slowest}): {h['gpus']} H200s finish 2M tickets in "
              f"{h['hours_on_that_fleet']:.1f} h ({h['gpu_hours_of_work']:.1f} GPU-hours); README: update the H200 "
              "and 10x tables from cost_model.json, and plots/make_plots.py")
    return 0

if __name__ == "__main__":
    sys.exit(main())
