"""Multi-LoRA cost on one GPU: throughput with many adapters against the base model, in one run.

Workload: --num-requests requests of random token ids (--input-len in, --output-len out, ignore_eos, greedy),
offline through `LLM.generate`. Runs, each timed after a warm-up that loads every adapter into the CPU
cache and a GPU slot:
  base      the engine without LoRA (enable_lora off);
  lora_base the LoRA engine, every request on the base model (the cost of the LoRA layers alone);
  r16x30    30 distinct rank-16 adapters, request i on adapter i % 30 (uniform);
  mixed     30 adapters of ranks 8, 16 and 64 (10 each), request i on adapter i % 30;
plus batch-1 inter-token latency (one request, --itl-tokens out) on the base engine and on one rank-16
adapter, and the time to bring a rank-16 adapter from the CPU cache into a GPU slot (synchronised; also
the host time until the load returns, and the same for the path up to 284c523: fp32 tensors converted and copied
from pageable memory per load). Each run records where its time went (`phases`: steps, the engine's
schedule / model runner / output seconds, the GPU span of its steps, adapters read from disk and slot loads
inside the timed call), and `revalidation_seconds_r16x30` is what re-reading the 30 adapters from disk
cost (every timed `generate` did that before dc676b4).
Adapters are random (scripts/make_adapters.py random: q/k/v/o, lora_alpha 2r, bf16). Results JSON records
hardware, model, config and commit; it is rewritten after every run, so a run cut short keeps what it did.
`--itl-only`: only the batch-1 ITLs (base engine, then one rank-16 adapter and the base on the LoRA engine;
one adapter written, no throughput runs or slot-load timings), for A/B runs of the LoRA kernels' env
switches (scripts/gpu_lora_check.sh STEPS=itl); `--skip-base` leaves the base engine out (the LoRA engine's
own base-model ITL, `lora_engine_base`, is then the in-process reference: `r16_overhead_vs_lora_engine_base`).
The kernel switches in effect (LORA_* env) are recorded under `lora_env`.

    python scripts/bench_lora.py --out benchmarks/results/lora_h200_llama8b.json
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402
from scripts.make_adapters import random_adapters  # noqa: E402


def lora_engine_config(args) -> dict:
    """The LoRA engine's settings beside the common ones (both the full bench and --itl-only)."""
    return dict(enable_lora=True, max_loras=args.max_loras, max_lora_rank=64, max_cpu_loras=64,
                lora_kernel=args.lora_kernel, lora_slot_stream=args.lora_slot_stream)


def release_device_memory() -> None:
    """After the caller's `del llm`: collect the dropped engine and return its cached device memory, so
    the next engine's KV cache profiling sees it free."""
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def timed_generate(llm, prompts, params, loras=None) -> float:
    started = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
    return time.perf_counter() - started


def itl_ms(llm, prompt, n: int, lora=None) -> float:
    """Batch-1 time per output token after the first, in ms (two runs: n+1 tokens minus 1 token)."""
    from shared_engine import SamplingParams

    long = min(timed_generate(llm, [prompt], SamplingParams(temperature=0, max_tokens=n + 1, ignore_eos=True), lora)
               for _ in range(2))
    short = min(timed_generate(llm, [prompt], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True), lora)
                for _ in range(2))
    return (long - short) / n * 1e3


def counters(llm) -> dict:
    """Cumulative engine counters that `phases` turns into one run's share."""
    stats, runner = llm.engine.stats, llm.engine.runner
    lora = runner.lora
    schedule, model, output, gpu = stats.phase_seconds_total
    return {"steps": stats.num_steps, "schedule_s": schedule, "model_runner_s": model, "output_s": output,
            "gpu_span_s": runner.gpu_span_seconds, "graph_steps": runner.graph_steps,
            "disk_loads": 0 if lora is None else lora.num_disk_loads,
            "slot_loads": 0 if lora is None else lora.num_slot_loads}


def phases(before: dict, after: dict) -> dict:
    return {k: round(after[k] - before[k], 3) if isinstance(after[k], float) else after[k] - before[k]
            for k in after}


def runner_stats(llm) -> dict:
    """The engine's graph counters: startup costs and which steps replayed a CUDA graph (cumulative)."""
    r = llm.engine.runner
    return {"capture_seconds": round(r.capture_seconds, 1), "num_cuda_graphs": r.num_cuda_graphs,
            "graph_steps": r.graph_steps, "mixed_graph_steps": r.mixed_graph_steps,
            "base_only_graph_steps": r.base_only_graph_steps,
            "attention_lora_graph_steps": r.attention_lora_graph_steps, "compile_seconds": round(r.compile_seconds, 1),
            "load_seconds": round(r.load_seconds, 1)}


def time_slot_load(load) -> dict:
    """ms for `load()` to return (host) and to complete (synchronised), min and median of 5."""
    import torch

    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    host, total = [], []
    for _ in range(5):
        sync()
        t0 = time.perf_counter()
        load()
        host.append(time.perf_counter() - t0)
        sync()
        total.append(time.perf_counter() - t0)
    return {"min": round(min(total) * 1e3, 2), "median": round(sorted(total)[2] * 1e3, 2),
            "host_return_median": round(sorted(host)[2] * 1e3, 2)}


def write_slot_pageable(manager, slot: int, adapter) -> None:
    """The slot load before the pinned images (284c523 and earlier): each fp32 tensor converted and copied
    from pageable memory at load time."""
    for layer in range(manager.arch.num_layers):
        for module, (projection, index) in manager.model.lora_targets(layer).items():
            pair = adapter.weights.get((layer, module))
            if pair is None:
                projection.write_slot(slot, index, None, None)
            else:
                a, b = (t.to(manager.device, manager.dtype, non_blocking=True) for t in pair)
                projection.write_slot(slot, index, a, b)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--num-requests", type=int, default=240)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--itl-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--adapter-dir", type=Path, default=Path("/tmp/lora_bench_adapters"))
    p.add_argument("--targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"])
    p.add_argument("--lora-kernel", default="sgmv", choices=["sgmv", "bgmv"])
    p.add_argument("--max-loras", type=int, default=32, help="GPU slots (the README table: 32, all 30 resident)")
    p.add_argument("--lora-slot-stream", action="store_true", help="slot loads on a copy stream of their own")
    p.add_argument("--itl-only", action="store_true", help="only the batch-1 ITLs (see the docstring)")
    p.add_argument("--skip-base", action="store_true", help="no base engine (with --itl-only)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if args.itl_only:
        itl_only(args)
        return

    from shared_engine import LLM, LoRARequest, SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randint(100, 10000) for _ in range(args.input_len)] for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    tokens = args.num_requests * args.output_len
    started = time.perf_counter()
    paths = {r: random_adapters(args.model, [r], 30 if r == 16 else 10, args.adapter_dir, args.targets)
             for r in (8, 16, 64)}
    results = {"benchmark": "lora", "environment": environment(), "command": " ".join(sys.argv),
               "workload": {"num_requests": args.num_requests, "input_len": args.input_len,
                            "output_len": args.output_len, "adapter_targets": args.targets,
                            "adapter_write_seconds": round(time.perf_counter() - started, 1)}, "runs": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))

    common = dict(load_format="dummy", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  gpu_memory_utilization=0.8)
    llm = LLM(args.model, **common)
    llm.generate(prompts[:8], SamplingParams(max_tokens=4), use_tqdm=False)
    before = counters(llm)
    seconds = timed_generate(llm, prompts, params)
    results["runs"]["base"] = {"seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
                               "phases": phases(before, counters(llm))}
    results["itl_ms"] = {"base": round(itl_ms(llm, prompts[0], args.itl_tokens), 3)}
    results["runner"] = {"base": runner_stats(llm)}
    save()
    del llm
    release_device_memory()

    lora_cfg = lora_engine_config(args)
    llm = LLM(args.model, **common, **lora_cfg)
    results["engine_config"] = {**common, **lora_cfg}
    ids = iter(range(1, 1000))
    r16 = [LoRARequest(f"r16-{i}", next(ids), str(path)) for i, path in enumerate(paths[16])]
    mixed = [LoRARequest(f"mix-{i}", next(ids), str(path))
             for i, path in enumerate(paths[8] + paths[16][:10] + paths[64])]
    for name, loras in [("lora_base", None), ("r16x30", r16), ("mixed_8_16_64", mixed)]:
        per_request = None if loras is None else [loras[i % len(loras)] for i in range(args.num_requests)]
        warm = [prompts[i % len(prompts)] for i in range(len(loras or [0]))]
        llm.generate(warm, SamplingParams(max_tokens=2), use_tqdm=False, lora_request=loras)
        before = counters(llm)
        seconds = timed_generate(llm, prompts, params, per_request)
        results["runs"][name] = {"seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
                                 "vs_base": round(results["runs"]["base"]["seconds"] / seconds, 4),
                                 "phases": phases(before, counters(llm))}
        save()
    results["itl_ms"]["lora_r16"] = round(itl_ms(llm, prompts[0], args.itl_tokens, r16[0]), 3)
    results["itl_ms"]["lora_engine_base"] = round(itl_ms(llm, prompts[0], args.itl_tokens), 3)
    results["itl_ms"]["r16_overhead_vs_base"] = round(results["itl_ms"]["lora_r16"] / results["itl_ms"]["base"] - 1, 4)
    manager = llm.engine.runner.lora
    image = manager._cpu[r16[0].cache_key]
    results["slot_load_ms_rank16"] = {**time_slot_load(lambda: manager._write_slot(args.max_loras - 1, image)),
                                      "adapter_bytes_host": image.num_bytes, "host_dtype": str(image.buffer.dtype),
                                      "pinned": image.buffer.is_pinned()}
    from shared_engine.lora.lora_manager import load_checked

    adapter = load_checked(r16[0], llm.engine.source.arch, llm.engine.config.lora)  # fp32, pageable
    old_path = time_slot_load(lambda: write_slot_pageable(manager, args.max_loras - 1, adapter))
    results["slot_load_ms_rank16_pageable_fp32"] = {**old_path, "adapter_bytes_host": adapter.num_bytes}
    started = time.perf_counter()
    for lora in r16:
        load_checked(lora, llm.engine.source.arch, llm.engine.config.lora)
    results["revalidation_seconds_r16x30"] = round(time.perf_counter() - started, 3)
    results["num_slot_loads"] = manager.num_slot_loads
    if manager.streams is not None:  # loads that waited on the device for a step reading their slot
        results["slot_stream"] = {"loads": manager.streams.num_loads,
                                  "after_a_read": manager.streams.num_loads_after_a_read}
    results["runner"]["lora"] = runner_stats(llm)
    save()
    print(json.dumps(results["runs"], indent=2), json.dumps(results["itl_ms"]), results["slot_load_ms_rank16"],
          results["slot_load_ms_rank16_pageable_fp32"], "revalidation s:", results["revalidation_seconds_r16x30"])


def itl_only(args) -> None:
    """Batch-1 ITL only: the base engine (unless --skip-base), then the LoRA engine on one rank-16 adapter
    and on the base model; written to --out."""
    import os

    from shared_engine import LLM, LoRARequest, SamplingParams

    rng = random.Random(0)
    prompt = [rng.randint(100, 10000) for _ in range(args.input_len)]
    path = random_adapters(args.model, [16], 1, args.adapter_dir, args.targets)[0]
    results = {"benchmark": "lora_itl", "environment": environment(), "command": " ".join(sys.argv),
               "lora_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("LORA_")},
               "workload": {"input_len": args.input_len, "itl_tokens": args.itl_tokens,
                            "adapter_targets": args.targets}, "itl_ms": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))

    common = dict(load_format="dummy", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  gpu_memory_utilization=0.8)
    warm = SamplingParams(max_tokens=4)
    if not args.skip_base:
        llm = LLM(args.model, **common)
        llm.generate([prompt], warm, use_tqdm=False)
        results["itl_ms"]["base"] = round(itl_ms(llm, prompt, args.itl_tokens), 3)
        save()
        del llm
        release_device_memory()
    lora_cfg = lora_engine_config(args)
    llm = LLM(args.model, **common, **lora_cfg)
    results["engine_config"] = {**common, **lora_cfg}
    lora = LoRARequest("r16-0", 1, str(path))
    llm.generate([prompt], warm, use_tqdm=False, lora_request=lora)
    itl = results["itl_ms"]
    itl["lora_r16"] = round(itl_ms(llm, prompt, args.itl_tokens, lora), 3)
    itl["lora_engine_base"] = round(itl_ms(llm, prompt, args.itl_tokens), 3)
    itl["r16_overhead_vs_lora_engine_base"] = round(itl["lora_r16"] / itl["lora_engine_base"] - 1, 4)
    if "base" in itl:
        itl["r16_overhead_vs_base"] = round(itl["lora_r16"] / itl["base"] - 1, 4)
    results["runner"] = runner_stats(llm)
    save()
    print(json.dumps(results["lora_env"]), json.dumps(itl))


if __name__ == "__main__":
    main()
