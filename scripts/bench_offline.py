"""Offline throughput: our engine vs transformers on the same model, machine and workload, in one run.

Workload (nano-vllm's shape): N requests of random token ids, input lengths uniform in
[--input-len-min, --input-len-max], output lengths uniform in [--output-len-min, --output-len-max],
ignore_eos so every request produces exactly its output length. Both engines are credited with the useful
output tokens they produce. transformers runs either `generate` on padded batches of --hf-batch-size in
request order (left padding, each batch decoding until its longest request), as a plain user would, or
its continuous batching `generate_batch` (--hf-mode generate_batch, attention "paged|sdpa", its default
`ContinuousBatchingConfig` but for --hf-num-blocks / --hf-max-batch-tokens; its warm-up inside the call
is timed apart and left out of its figure, as ours is; it takes one `max_new_tokens` for all requests, so
every request decodes to the longest's length and only each one's own length is credited), optionally on
the first --hf-num-requests requests only. On CUDA, --roofline measures the device's copy bandwidth and
matmul rate and states the workload's physical bound (benchmarks/roofline.py).

Like for like: when transformers runs on the first K < N requests, our engine also runs those same K
requests (same prompts, sampling and output lengths, same engine, prefix cache reset before each timed run)
in the same process: `ours_subset`, and `speedup_vs_transformers` = ours on the K / transformers on the K.
`ours` stays our engine on the whole workload (N requests); it is never divided by a K-request baseline.
Each side records the batch it actually ran at (`running_batch`): ours, the sequences per engine step and
the decode rows per decode step (max, mean); transformers' `generate_batch`, the requests its scheduler put
in each forward step and the continuous-batching config it resolved (max_batch_tokens, num_blocks,
page_size, max_requests_per_batch, ...; `--hf-batch-size` is not one of its arguments); `generate`, the
padded batch size with the rows per decode step.

    python scripts/bench_offline.py --out benchmarks/results/offline_cpu_smollm2.json
    python scripts/bench_offline.py --model llama-3.1-8b --load-format dummy --num-requests 1000 \\
        --input-len-min 1000 --input-len-max 1000 --output-len-min 1000 --output-len-max 1000 \\
        --max-model-len 2048 --max-num-seqs 512 --hf-mode generate_batch --hf-num-requests 64 --roofline --out X.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402
from scripts.hf_baseline import run_transformers  # noqa: E402


def workload(args) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(args.seed)
    prompts, outputs = [], []
    for _ in range(args.num_requests):
        n_in = rng.randint(args.input_len_min, args.input_len_max)
        prompts.append([rng.randint(100, 10000) for _ in range(n_in)])
        outputs.append(rng.randint(args.output_len_min, args.output_len_max))
    return prompts, outputs


def make_llm(args):
    from shared_engine import LLM, SamplingParams

    chosen = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
              "max_model_len": args.max_model_len, "dtype": args.dtype, "load_format": args.load_format,
              "kv_cache_memory": args.kv_cache_memory, "gpu_memory_utilization": args.gpu_memory_utilization,
              "enforce_eager": args.enforce_eager or None, "device": args.device,
              "enable_async_output_proc": args.enable_async_output_proc or None,
              "async_scheduling": args.async_scheduling, "tensor_parallel_size": args.tensor_parallel_size,
              "kv_cache_dtype": args.kv_cache_dtype, "quantization": args.quantization,
              "nano_batch_min_decodes": args.nano_batch_min_decodes}
    llm = LLM(args.model, **{k: v for k, v in chosen.items() if v is not None})
    llm.generate([[5] * 16], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    return llm


def run_ours(llm, prompts, out_lens) -> dict:
    """One timed `generate` of these requests on a warm engine, its prefix cache emptied first (a subset run
    after the whole workload must not find its prompts cached), with the batch each step ran at."""
    from shared_engine import SamplingParams

    engine = llm.engine
    stats = engine.stats
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in out_lens]
    engine.block_manager.reset_prefix_cache()
    stats.reset_batch_maxima()
    step_s0, gpu_s0, steps0 = stats.step_seconds_total, engine.runner.gpu_span_seconds, stats.num_steps
    seqs0, decode_steps0, decodes0 = stats.scheduled_seqs_total, stats.decode_steps, stats.decode_seqs_total
    hits0, preempted0 = stats.prefix_cache_hits_total, engine.scheduler.num_preemptions_total
    phases0, nano0 = list(stats.phase_seconds_total), getattr(engine.runner, "nano_batch_graph_steps", 0)
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == sum(out_lens), "every request must produce exactly its output length"
    step_s = stats.step_seconds_total - step_s0
    gpu_s = engine.runner.gpu_span_seconds - gpu_s0
    steps, decode_steps = stats.num_steps - steps0, stats.decode_steps - decode_steps0
    tpots = [(o.metrics.last_token_time - o.metrics.first_token_time) / (len(o.outputs[0].token_ids) - 1)
             for o in outputs if len(o.outputs[0].token_ids) > 1]
    result = {"num_requests": len(prompts), "elapsed_s": elapsed, "output_tokens": generated,
              "output_throughput": generated / elapsed,
              "total_token_throughput": (generated + sum(map(len, prompts))) / elapsed,
              "median_ttft_ms": 1e3 * statistics.median(o.metrics.ttft for o in outputs),
              "median_tpot_ms": 1e3 * statistics.median(tpots) if tpots else None,
              "num_preemptions": engine.scheduler.num_preemptions_total - preempted0,
              "num_steps": steps, "step_seconds": step_s,
              "prefix_cache_hits": stats.prefix_cache_hits_total - hits0,
              # what the scheduler actually ran, against its limits
              "running_batch": {"max_seqs_per_step": stats.scheduled_seqs_max,
                                "mean_seqs_per_step": (stats.scheduled_seqs_total - seqs0) / steps if steps else 0.0,
                                "decode_steps": decode_steps, "max_decode_seqs": stats.decode_seqs_max,
                                "mean_decode_seqs": (stats.decode_seqs_total - decodes0) / decode_steps
                                if decode_steps else 0.0,
                                "max_num_seqs": engine.config.scheduler.max_num_seqs,
                                "max_num_batched_tokens": engine.config.scheduler.token_budget}}
    if getattr(engine.runner, "nano_forward", None) is not None:
        result["nano_batch_graph_steps"] = engine.runner.nano_batch_graph_steps - nano0
        result["nano_batch_graphs"] = len(engine.runner.graph_runner.nano_keys) if engine.runner.graph_runner else 0
    if gpu_s:
        # device span per step (first kernel → sampled ids on the host) vs the whole step on the host clock
        result["gpu_span_seconds"] = gpu_s
        result["share_of_step_time_outside_gpu"] = max(0.0, 1 - gpu_s / step_s)
    names = ("schedule", "model_runner", "output_processing", "gpu_span")
    result["step_phase_seconds"] = {name: now - before for name, now, before
                                    in zip(names, stats.phase_seconds_total, phases0)}
    return result


def engine_fields(llm) -> dict:
    """The engine's own figures, the same for every run of it."""
    engine = llm.engine
    return {"kv_pool_tokens": engine.block_manager.num_blocks * engine.block_manager.block_size,
            "cold_start_s": {"weights": engine.runner.load_seconds, "compile": engine.runner.compile_seconds,
                             "cuda_graph_capture": engine.runner.capture_seconds},
            "engine_config": engine.config.to_flat(), "model": engine.source.name}


def roofline(args, llm, prompts, out_lens) -> dict:
    from benchmarks.roofline import measure_device_ceilings, offline_roofline

    engine = llm.engine
    ceilings = measure_device_ceilings()  # on GPU 0; under tensor parallelism every GPU streams its shard,
    tp = engine.config.parallel.tensor_parallel_size  # so the bound is over tp times one GPU's ceilings
    fp8_rate = ceilings.get("matmul_fp8_flops_per_s")  # measured in this run (compute capability >= 8.9)
    bound = offline_roofline(engine.source.arch, engine.runner.dtype_name, len(prompts),
                             statistics.mean(map(len, prompts)), statistics.mean(out_lens),
                             engine.block_manager.num_blocks * engine.block_manager.block_size,
                             engine.config.scheduler.max_num_seqs, tp * ceilings["copy_bandwidth_bytes_per_s"],
                             tp * ceilings["matmul_bf16_flops_per_s"],
                             kv_cache_dtype="fp8" if engine.config.cache.fp8_kv_cache else None,
                             weight_dtype=engine.config.model.quantization,
                             fp8_matmul_flops=None if fp8_rate is None else tp * fp8_rate)
    return {**ceilings, **bound, "num_gpus": tp, "copy_bandwidth_all_gpus": tp * ceilings["copy_bandwidth_bytes_per_s"]}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or preset (default: the embedded model)")
    p.add_argument("--load-format", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len-min", type=int, default=32)
    p.add_argument("--input-len-max", type=int, default=512)
    p.add_argument("--output-len-min", type=int, default=16)
    p.add_argument("--output-len-max", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--gpu-memory-utilization", type=float, default=None)
    p.add_argument("--enforce-eager", action="store_true")
    p.add_argument("--kv-cache-dtype", default=None, help="auto or fp8 (the engine's flag; the roofline prices it)")
    p.add_argument("--quantization", default=None, help="fp8: FP8 linear layers (CUDA; the roofline prices them)")
    p.add_argument("--enable-async-output-proc", action="store_true",
                   help="process step n's outputs while the device runs step n+1")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="schedule and launch step n+1 before step n's tokens reach the host (default: the "
                   "engine's, on for CUDA; engine/async_output.py)")
    p.add_argument("--nano-batch-min-decodes", type=int, default=None,
                   help="CUDA: decode steps of at least this many rows as two overlapped nano-batches (0: off)")
    p.add_argument("--tensor-parallel-size", type=int, default=None,
                   help="GPUs per engine; the roofline and the weight-streaming floor are then over all of them")
    p.add_argument("--hf-mode", choices=["generate", "generate_batch", "none"], default="generate")
    p.add_argument("--hf-batch-size", type=int, default=16, help="generate: the padded batch (generate_batch "
                   "does not take it: its batch is bounded by --hf-max-batch-tokens and the cache's blocks)")
    p.add_argument("--hf-num-blocks", type=int, default=None,
                   help="generate_batch: ContinuousBatchingConfig.num_blocks (default: transformers sizes the cache "
                   "from free memory)")
    p.add_argument("--hf-max-batch-tokens", type=int, default=None,
                   help="generate_batch: ContinuousBatchingConfig.max_batch_tokens (default: transformers')")
    p.add_argument("--hf-num-requests", type=int, default=None, help="run transformers on the first K only")
    p.add_argument("--roofline", action="store_true", help="CUDA: measure ceilings and state the bound")
    p.add_argument("--hf-only", action="store_true", help="run only the transformers baseline")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trace-every", type=float, default=None,
                   help="print every thread's Python stack to stderr every S seconds (to see where a run hangs)")
    p.add_argument("--out", type=Path, required=True, help="results JSON path")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    if args.trace_every:
        import faulthandler

        faulthandler.dump_traceback_later(args.trace_every, repeat=True)
    prompts, out_lens = workload(args)
    results = {"benchmark": "offline_throughput", **environment(), "command": " ".join(sys.argv),
               "workload": {k: getattr(args, k) for k in ("num_requests", "input_len_min", "input_len_max",
                                                           "output_len_min", "output_len_max", "seed")}}
    # transformers' requests: the first K; ours runs those same K too (like for like) and the whole workload
    count = min(args.hf_num_requests or args.num_requests, args.num_requests)
    llm, ours = None, None
    if not args.hf_only:
        llm = make_llm(args)
        results["ours"] = {"requests": f"the whole workload ({args.num_requests})",
                           **run_ours(llm, prompts, out_lens), **engine_fields(llm)}
        ours = results["ours"]["output_throughput"]
        print(f"ours:         {ours:9.1f} output tokens/s ({results['ours']['elapsed_s']:.1f} s, "
              f"{args.num_requests} requests)", flush=True)
        if args.hf_mode != "none" and count < args.num_requests:
            results["ours_subset"] = sub = {"requests": f"the first {count} of the workload's {args.num_requests}, "
                                                        "the requests transformers runs",
                                            **run_ours(llm, prompts[:count], out_lens[:count])}
            print(f"ours (subset): {sub['output_throughput']:8.1f} output tokens/s ({sub['elapsed_s']:.1f} s, "
                  f"{count} requests)", flush=True)
    if args.roofline and llm is not None:
        results["roofline"] = rl = roofline(args, llm, prompts, out_lens)
        results["fraction_of_roofline"] = ours / rl["output_tokens_per_s_bound"]
        print(f"roofline:     {rl['output_tokens_per_s_bound']:9.1f} output tokens/s ({rl['bound']}-bound); "
              f"ours = {100 * results['fraction_of_roofline']:.1f}%", flush=True)
        # batch-1 decode's bound: every step streams the weights once (issue 5's "weight-streaming floor")
        floor_ms = 1e3 * rl["weight_bytes"] / rl["copy_bandwidth_all_gpus"]  # TP: each GPU streams 1/N
        tpot = results["ours"]["median_tpot_ms"]
        results["weight_streaming_floor_ms"] = floor_ms
        results["median_tpot_over_floor"] = tpot / floor_ms if tpot else None
        if tpot:
            print(f"median TPOT {tpot:.2f} ms = {tpot / floor_ms:.3f}x the weight-streaming floor ({floor_ms:.2f} ms)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))  # keep our figures even if the baseline fails
    if llm is not None:
        llm.shutdown()  # tensor parallelism: stop the worker processes (frees their GPUs)
    if args.hf_mode != "none":
        import gc

        import torch

        del llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        from shared_engine.model_loader.model_source import resolve_model

        source = resolve_model(args.model, args.load_format or "auto")
        try:
            results["transformers"] = hf = run_transformers(args, prompts[:count], out_lens[:count], source)
            print(f"transformers: {hf['output_throughput']:9.1f} output tokens/s ({hf['elapsed_s']:.1f} s, "
                  f"{hf['mode']}, {hf['num_requests']} requests)")
            same = results.get("ours_subset", results.get("ours"))
            if same is not None:  # ours and transformers on the same requests, never N against K
                assert same["num_requests"] == hf["num_requests"], (same["num_requests"], hf["num_requests"])
                results["speedup_vs_transformers"] = same["output_throughput"] / hf["output_throughput"]
                results["speedup_basis"] = {"requests": hf["requests"], "num_requests": hf["num_requests"],
                                            "ours": "ours_subset" if "ours_subset" in results else "ours",
                                            "transformers": "transformers", "like_for_like": True}
                print(f"speed-up on the same {hf['num_requests']} requests: "
                      f"{results['speedup_vs_transformers']:.2f}x")
        except Exception as exc:  # record why the baseline failed instead of losing the run
            results["transformers"] = {"mode": args.hf_mode, "error": f"{type(exc).__name__}: {exc}"}
            print(f"transformers failed: {exc}")
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
