"""The fix measured offline (MLPerf offline style: every ticket queued at once) through `run_batch`, with the
workload's roofline on CUDA. The same script runs the CPU check and the H200 run.

    # this CPU (tickets scaled down, see the README):
    python case_batch_summarisation/loadtest/offline_run.py --num-tickets 200 --median-tokens 60 \\
        --max-ticket-tokens 600 --config case_batch_summarisation/the_fix/config_cpu.yaml --out X.json
    # H200 (llama-3.1-8b shapes, dummy weights, SmolLM2's tokenizer and chat template for the text):
    python case_batch_summarisation/loadtest/offline_run.py --model llama-3.1-8b --load-format dummy \\
        --tokenizer DIR --fixed-output --num-tickets 20000 --time-budget-s 120 --roofline --out X.json

A warm-up batch (`--warmup-tickets`, other tickets) runs first: it compiles kernels and captures CUDA graphs,
and its rate sizes the main run: with `--time-budget-s`, the main run takes
min(--num-tickets, warm-up rate x budget) tickets (the device call has a hard limit; the results file says
how many ran and why), never fewer than `--min-tickets`. `--fixed-output` (dummy weights): each summary is
100-150 tokens (`ignore_eos`).

Roofline (benchmarks/roofline.py, `offline_roofline`): the device's measured copy bandwidth and bf16 matmul
rate; prompt tokens served from the prefix cache are not computed, so the bound is taken at the computed
prompt tokens per ticket (`prefill_tokens / tickets`); `prefill_compute_bound_s` is the prefill's matmul +
attention FLOPs alone over the matmul rate.

On SIGTERM (h200_run.sh runs this under `timeout`) the results file is written with `partial_run` (tickets
finished, tokens and seconds so far) and the process exits 124: a run past its limit still leaves its rate.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.env_info import environment  # noqa: E402
from case_batch_summarisation.tickets.generator import TicketSpec, generate, write  # noqa: E402


def build_llm(args):
    import yaml

    from shared_engine import LLM

    settings = yaml.safe_load(Path(args.config).read_text()) or {}
    for key in ("load_format", "tokenizer", "max_num_seqs", "max_num_batched_tokens", "kv_cache_memory",
                "quantization", "kv_cache_dtype"):
        if getattr(args, key, None) is not None:
            settings[key] = getattr(args, key)
    name = settings.pop("served_model_name", "ticket-summariser")
    return LLM(args.model, **settings), name, settings


def night(path: Path, args, n: int, start: int) -> Path:
    spec = TicketSpec(median_tokens=args.median_tokens, sigma=args.sigma, max_tokens=args.max_ticket_tokens)
    write(path, generate(n, args.seed + start, spec, fixed_output=args.fixed_output, start=start))
    return path


def prefill_compute_s(arch, prompt_tokens_per_ticket: float, cached_per_ticket: float, tickets: int,
                      matmul_flops: float, linear_matmul_flops: float | None = None) -> float:
    """Seconds of matmul + attention FLOPs of the computed prompt tokens (each attends to the cached prefix
    too): the decoder's linear layers for every computed token at `linear_matmul_flops` (FLOP/s; the FP8 rate
    under `--quantization fp8`, default `matmul_flops`), one LM-head row per ticket (its first output token's
    logits; the other prompt positions compute none) and attention at `matmul_flops`. Embedding lookups are no
    matmul and are left out."""
    from benchmarks.roofline import linear_parameters

    new = prompt_tokens_per_ticket - cached_per_ticket
    pairs = new * cached_per_ticket + new * new / 2
    linear = tickets * 2 * linear_parameters(arch) * new
    rest = tickets * (2 * arch.vocab_size * arch.hidden_size
                      + 4 * arch.num_layers * arch.num_heads * arch.head_dim * pairs)
    return linear / (linear_matmul_flops or matmul_flops) + rest / matmul_flops


class Partial:
    """The main run's progress (run_batch's `progress` hook) and, on SIGTERM, `partial_run` in the results file
    (written at once; exit status 124, as `timeout`'s)."""

    def __init__(self, llm, results: dict, out: Path):
        self.llm, self.results, self.out = llm, results, out
        self.rows = self.tokens = 0
        self.elapsed = 0.0
        self.prefill0 = llm.engine.stats.num_prompt_tokens_total
        self.next_print = 60.0

    def start(self) -> None:
        """The main run begins (before it, a signal writes what the results hold: start-up, warm-up)."""
        self.prefill0 = self.llm.engine.stats.num_prompt_tokens_total

    def __call__(self, rows: int, tokens: int, elapsed: float) -> None:
        self.rows, self.tokens, self.elapsed = rows, tokens, elapsed
        if elapsed >= self.next_print:
            self.next_print += 60.0
            print(f"{elapsed:.0f} s: {rows} tickets done, {rows / elapsed:.1f} tickets/s", flush=True)

    def on_signal(self, signum, frame) -> None:
        e = self.elapsed or float("inf")
        prefill = self.llm.engine.stats.num_prompt_tokens_total - self.prefill0
        self.results["partial_run"] = {
            "stopped_by": signal.Signals(signum).name, "num_rows_finished": self.rows,
            "completion_tokens_of_finished": self.tokens, "prefill_tokens_computed": prefill, "elapsed_s": self.elapsed,
            "rows_per_s": self.rows / e, "output_tokens_per_s_of_finished": self.tokens / e,
            "prefill_tokens_per_s": prefill / e}
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.results, indent=2))
        print(f"stopped by {signal.Signals(signum).name} after {self.elapsed:.1f} s: {self.rows} tickets finished "
              f"({self.rows / e:.1f} tickets/s); partial results in {self.out}", flush=True)
        os._exit(124)


def roofline(llm, summary, tickets: int, ceilings: dict) -> dict:
    from benchmarks.roofline import offline_roofline

    engine = llm.engine
    per_in = summary.prefill_tokens / tickets
    fp8 = fp8_terms(engine, ceilings)
    bound = offline_roofline(engine.source.arch, engine.runner.dtype_name, tickets, per_in,
                             summary.completion_tokens / tickets,
                             engine.block_manager.num_blocks * engine.block_manager.block_size,
                             engine.config.scheduler.max_num_seqs, ceilings["copy_bandwidth_bytes_per_s"],
                             ceilings["matmul_bf16_flops_per_s"], **fp8)
    linear_rate = fp8["fp8_matmul_flops"] if fp8.get("weight_dtype") == "fp8" else None
    pre_s = prefill_compute_s(engine.source.arch, summary.prompt_tokens / tickets,
                              summary.cached_prompt_tokens / tickets, tickets, ceilings["matmul_bf16_flops_per_s"],
                              linear_rate)
    return {**ceilings, **bound, "prompt_tokens_per_ticket_in_bound": per_in, "prefill_compute_bound_s": pre_s,
            "fraction_of_roofline": bound["bound_time_s"] / summary.elapsed_s,
            "fraction_of_prefill_compute_bound": pre_s / summary.elapsed_s}


def fp8_terms(engine, ceilings: dict) -> dict:
    """offline_roofline's FP8 arguments for the engine's config: FP8 KV bytes under `kv_cache_dtype` fp8, FP8
    linear weights (bytes and the measured `matmul_fp8_flops_per_s`) under `quantization` fp8.

    Raises:
        ValueError: FP8 weights but no measured FP8 rate in `ceilings`.
    """
    out = {}
    if engine.config.cache.kv_cache_dtype != "auto":
        out["kv_cache_dtype"] = "fp8"
    if engine.config.model.quantization == "fp8":
        if "matmul_fp8_flops_per_s" not in ceilings:
            raise ValueError("FP8 weights: the device ceilings hold no measured FP8 matmul rate")
        out.update(weight_dtype="fp8", fp8_matmul_flops=ceilings["matmul_fp8_flops_per_s"])
    return out


def roofline_rate(llm, warm, ceilings: dict, efficiency: float, tickets: int = 10_000) -> float:
    """Tickets/s at `efficiency` x the roofline of `tickets` tickets shaped like the warm-up's: a cap on the
    main run's size that does not trust a small warm-up batch's rate (it has no KV-pool limit yet)."""
    rl = roofline(llm, warm, warm.num_rows, ceilings)
    from benchmarks.roofline import offline_roofline

    engine = llm.engine
    bound = offline_roofline(engine.source.arch, engine.runner.dtype_name, tickets,
                             rl["prompt_tokens_per_ticket_in_bound"], warm.completion_tokens / warm.num_rows,
                             engine.block_manager.num_blocks * engine.block_manager.block_size,
                             engine.config.scheduler.max_num_seqs, ceilings["copy_bandwidth_bytes_per_s"],
                             ceilings["matmul_bf16_flops_per_s"], **fp8_terms(engine, ceilings))
    return efficiency * tickets / bound["bound_time_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--load-format", default=None)
    p.add_argument("--tokenizer", default=None)
    p.add_argument("--config", type=Path, default=ROOT / "case_batch_summarisation" / "the_fix" / "config.yaml")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--quantization", default=None, choices=["fp8"], help="FP8 weights (online, per channel)")
    p.add_argument("--kv-cache-dtype", default=None, choices=["auto", "fp8"])
    p.add_argument("--num-tickets", type=int, default=20000)
    p.add_argument("--warmup-tickets", type=int, default=300)
    p.add_argument("--time-budget-s", type=float, default=None, help="size the main run to fit this")
    p.add_argument("--min-tickets", type=int, default=0, help="the time budget never sizes the run below this")
    p.add_argument("--first-ticket", type=int, default=0,
                   help="the main run's first ticket number (one worker's slice of the night: other tickets)")
    p.add_argument("--median-tokens", type=float, default=600.0)
    p.add_argument("--sigma", type=float, default=0.7)
    p.add_argument("--max-ticket-tokens", type=int, default=6000)
    p.add_argument("--fixed-output", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--roofline", action="store_true")
    p.add_argument("--assumed-efficiency", type=float, default=0.55,
                   help="with --roofline and --time-budget-s: size the main run as if it ran at this share of "
                   "the roofline, when that gives fewer tickets than the warm-up's rate")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from shared_engine.entrypoints.batch.run_batch import run_batch

    tmp = Path(tempfile.mkdtemp(prefix="batch_offline_"))
    early = None
    if not args.time_budget_s:  # the main run's size is known: write its night while the engine starts
        import multiprocessing

        early = multiprocessing.get_context("fork").Process(
            target=night, args=(tmp / "night.jsonl", args, args.num_tickets, args.first_ticket))
        early.start()
    t0 = time.perf_counter()
    llm, name, settings = build_llm(args)
    results = {"benchmark": "batch_offline", **environment(), "command": " ".join(sys.argv),
               "engine_config": llm.engine.config.to_flat(), "model": llm.engine.source.name,
               "startup_s": time.perf_counter() - t0}
    partial = Partial(llm, results, args.out)
    signal.signal(signal.SIGTERM, partial.on_signal)
    warm = run_batch(llm, night(tmp / "warm.jsonl", args, args.warmup_tickets, 10_000_000), tmp / "warm_out.jsonl",
                     name, use_tqdm=False)
    results["warmup"] = warm.as_dict()
    import torch

    ceilings = None
    if args.roofline and torch.cuda.is_available():
        from benchmarks.roofline import measure_device_ceilings

        ceilings = measure_device_ceilings()
    n, rate = args.num_tickets, warm.rows_per_s
    if ceilings is not None:
        rate = min(rate, roofline_rate(llm, warm, ceilings, args.assumed_efficiency))
    if args.time_budget_s:
        n = max(args.warmup_tickets, args.min_tickets, min(n, int(rate * args.time_budget_s)))
    results["workload"] = {"num_tickets_asked": args.num_tickets, "num_tickets": n,
                           "sized_by_time_budget_s": args.time_budget_s if n < args.num_tickets else None,
                           "sizing_rate_tickets_per_s": rate, "first_ticket": args.first_ticket,
                           "median_tokens": args.median_tokens, "sigma": args.sigma,
                           "max_ticket_tokens": args.max_ticket_tokens, "fixed_output": args.fixed_output,
                           "seed": args.seed}
    print(f"warm-up {warm.num_rows} tickets: {warm.rows_per_s:.1f} tickets/s; main run: {n} tickets", flush=True)
    if early is not None:
        early.join()
        if early.exitcode != 0:
            raise RuntimeError(f"writing the night's tickets failed (exit {early.exitcode})")
        night_path = tmp / "night.jsonl"
    else:
        night_path = night(tmp / "night.jsonl", args, n, args.first_ticket)
    partial.start()
    summary = run_batch(llm, night_path, tmp / "out.jsonl", name, use_tqdm=True, progress=partial)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    results["run"] = s = summary.as_dict()
    results["scheduler"] = {"num_preemptions": llm.engine.scheduler.num_preemptions_total,
                            "kv_pool_tokens": llm.engine.block_manager.num_blocks * llm.engine.block_manager.block_size}
    print(f"{s['num_rows']} tickets in {s['elapsed_s']:.1f} s: {s['rows_per_s']:.1f} tickets/s, "
          f"{s['output_tokens_per_s']:.0f} output tok/s, {s['prefill_tokens_per_s']:.0f} prefill tok/s, "
          f"prefix hit rate {100 * s['prefix_cache_hit_rate']:.1f}%", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    if ceilings is not None:
        results["roofline"] = rl = roofline(llm, summary, n, ceilings)
        print(f"roofline {rl['bound_time_s']:.1f} s ({rl['bound']}-bound): {100 * rl['fraction_of_roofline']:.1f}%; "
              f"prefill compute alone {rl['prefill_compute_bound_s']:.1f} s", flush=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
