"""Where a multi-LoRA step's time goes (CUDA; issue 18): the base engine against the LoRA engine with 30
rank-16 adapters (all resident), on bench_lora.py's workload, as served (CUDA graphs) and eagerly.

Workload (scripts/bench_lora.py's): --num-requests requests of --input-len random token ids, --output-len
out, greedy, ignore_eos, max_num_seqs 256, max_model_len 1024, through `LLM.generate`; on the LoRA engine
request i runs on adapter i % 30 (random q/k/v/o adapters, lora_alpha 2r, bf16; `--max-loras 32
--max-lora-rank 64 --max-cpu-loras 64`), after a warm-up that puts every adapter in a GPU slot.
For each engine (base, lora) and mode (graphs: as served; eager: the same engine with its graph runner
set aside, every step through the model's forward):
  - every `LLMEngine.step()` call: wall time, the device span of the step it collected (first kernel to
    sampled ids), the host time of each piece it ran (scheduler.schedule, build_inputs, LoRA prepare (the
    adapter → slot map, slot loads included) and set_token_slots (SGMV tiles, staging, copy), graph
    replay or eager forward, logits, sampling, the rest of launch, collect's wait, resolve,
    process_outputs, apply_launched), the slot loads it issued, and the step it launched: decodes,
    prefill tokens and sequences, distinct adapters, the CUDA graph it replayed (with or without the LoRA
    layers) or why it ran eagerly;
  - the time `generate` spends before its first step (validation, adapter checks, add_request);
  - the same at batch 1 (`batch1`: one request of --itl-tokens, on adapter 0 for the LoRA engine; its
    decode window is steps 9-24), the shape of bench_lora's ITL;
  - torch.profiler (CUDA activity) over two windows: every prefill step (the run's start up to the first
    decode-only step) and --decode-window steady-state decode steps (from the --decode-skip'th decode-only
    step on): kernels top-25 by CUDA time with counts, per step; the LoRA kernels' share (SGMV / BGMV
    kernels); the window's device span, the union of its kernel intervals (busy) and so the GPU's idle
    share. The device is synchronised at each window's edges (those step calls are marked
    `profiler_edge` and left out of the per-step medians).
JSON out (rewritten after every engine and mode), a short summary printed.

    python scripts/profile_lora_step.py --out benchmarks/results/profile_lora_step_h200_<commit>.json

Runs on the CPU too (smoke test: `--model smollm2-135m --num-requests 6 --input-len 8 --output-len 4
--num-adapters 3 --max-loras 4 --max-num-seqs 8`): CPU profiler activity, no graphs, meaningless figures.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402
from scripts.lora_step_probe import PIECES, StepProbe  # noqa: E402

LORA_KERNEL_MARKERS = ("sgmv", "_shrink_kernel", "_expand_kernel", "lora")

def is_lora_kernel(name: str) -> bool:
    low = name.lower()
    return any(marker in low for marker in LORA_KERNEL_MARKERS)


def interval_union(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by `intervals` [(start, end)] (overlaps counted once)."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def kernel_summary(events, num_steps: int, device: str, top: int = 25) -> dict:
    """`events`: torch.profiler FunctionEvents. Device events (kernels, memcpy, memset) on CUDA, CPU ops on
    the CPU: top `top` by time with counts, totals per step, the LoRA kernels' share, the window's span,
    busy time (union of intervals) and idle share. Times in ms."""
    totals: dict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    intervals = []
    for e in events:
        on_device = getattr(e.device_type, "name", "") == "CUDA"
        if device == "cuda" and not on_device:
            continue
        if device != "cuda" and (on_device or getattr(e, "cpu_parent", None) is not None):
            continue  # CPU: top-level ops only (children are inside their parents' time)
        us = float(e.device_time) if device == "cuda" else float(e.cpu_time_total)
        totals[e.name] += us / 1e3
        counts[e.name] += 1
        tr = getattr(e, "time_range", None)
        if tr is not None:
            intervals.append((float(tr.start), float(tr.end)))
    total = sum(totals.values())
    lora = sum(v for k, v in totals.items() if is_lora_kernel(k))
    steps = max(1, num_steps)
    span = (max(hi for _, hi in intervals) - min(lo for lo, _ in intervals)) / 1e3 if intervals else 0.0
    busy = interval_union(intervals) / 1e3
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])
    return {
        "num_steps": num_steps, "num_events": sum(counts.values()), "total_ms": round(total, 3),
        "total_ms_per_step": round(total / steps, 4), "lora_ms": round(lora, 3),
        "lora_ms_per_step": round(lora / steps, 4), "lora_share": round(lora / total, 4) if total else 0.0,
        "lora_launches_per_step": round(sum(c for k, c in counts.items() if is_lora_kernel(k)) / steps, 1),
        "launches_per_step": round(sum(counts.values()) / steps, 1),
        "span_ms": round(span, 3), "busy_ms": round(busy, 3),
        "idle_share": round(1 - busy / span, 4) if span else 0.0,
        "top": [{"name": k[:160], "ms": round(v, 3), "ms_per_step": round(v / steps, 4), "count": counts[k],
                 "share": round(v / total, 4) if total else 0.0, "lora": is_lora_kernel(k)}
                for k, v in ranked[:top]],
    }


def stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    return {"n": len(values), "median_ms": round(statistics.median(values) * 1e3, 3),
            "mean_ms": round(statistics.fmean(values) * 1e3, 3), "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))]
                                                                             * 1e3, 3),
            "total_s": round(sum(values), 4)}


def summarise(probe: StepProbe, device: str, seconds: float, tokens: int, pre_step_s: float) -> dict:
    """One mode's JSON: the run, per-step medians by kind (calls that launched a prefill / a decode-only
    step; profiler-edge calls left out), graph use and eager reasons, slot loads, both windows' kernels."""
    launched_in = {}
    for entry in probe.launched:
        if entry["call"] is not None:
            launched_in[entry["call"]] = entry
    kinds: dict[str, list[dict]] = {"prefill": [], "decode": []}
    for record in probe.records:
        entry = launched_in.get(record["call"])
        if entry is None or record["profiler_edge"]:
            continue
        kinds["prefill" if entry["prefill_seqs"] else "decode"].append(record)
    per_kind = {}
    for kind, records in kinds.items():
        entries = [launched_in[r["call"]] for r in records]
        host = {piece: stats([r["host"].get(piece, 0.0) for r in records]) for piece in PIECES
                if any(piece in r["host"] for r in records)}
        per_kind[kind] = {"wall": stats([r["wall_s"] for r in records]),
                          "gpu_span_of_launched": stats([e["gpu_span_s"] for e in entries if "gpu_span_s" in e]),
                          "host": host,
                          "mean_decodes": round(statistics.fmean([e["decodes"] for e in entries]), 1) if entries
                          else 0, "mean_adapters": round(statistics.fmean([e["adapters"] for e in entries]), 1)
                          if entries else 0}
    graph_steps = [e for e in probe.launched if e.get("graph") is not None]
    windows = {}
    for name, window in probe.windows.items():
        windows[name] = kernel_summary(window["profiler"].events(), len(window["steps"]), device)
        windows[name]["launched_steps"] = [{k: probe.launched[i][k] for k in
                                            ("decodes", "prefill_seqs", "prefill_tokens", "adapters", "graph")}
                                           for i in window["steps"]]
    return {
        "seconds": round(seconds, 3), "output_tok_s": round(tokens / seconds, 1),
        "pre_step_s": round(pre_step_s, 4),
        "profiler_edge_wall_s": round(sum(r["wall_s"] for r in probe.records if r["profiler_edge"]), 3),
        "calls": len(probe.records), "launched_steps": len(probe.launched),
        "graph_steps": len(graph_steps), "eager_steps": len(probe.launched) - len(graph_steps),
        "graph_variants": dict(Counter(e["graph_variant"] for e in graph_steps)),
        "eager_reasons": dict(Counter(e["eager_reason"] for e in probe.launched if e.get("graph") is None)),
        "slot_loads": sum(r.get("slot_loads", 0) for r in probe.records),
        "slot_load_s": round(sum(r.get("slot_load_s", 0.0) for r in probe.records), 4),
        "per_step": per_kind, "windows": windows,
        "steps": [dict(e, **{k: round(v, 6) for k, v in launched_in_record(probe, e).items()})
                  for e in probe.launched],
    }


def launched_in_record(probe: StepProbe, entry: dict) -> dict:
    """The host figures of the call that launched `entry` (wall and each piece, seconds)."""
    if entry["call"] is None:
        return {}
    record = probe.records[entry["call"]]
    return {"call_wall_s": record["wall_s"], **{f"host_{k}_s": v for k, v in record["host"].items()}}


def run_mode(llm, prompts, params, loras, *, sync, activity, device, skip, window, eager: bool) -> dict:
    runner = llm.engine.runner
    saved = runner.graph_runner
    if eager:
        runner.graph_runner = None
    probe = StepProbe(llm.engine, sync, activity, skip, window)
    try:
        probe.open_window("prefill")
        started = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False, lora_request=loras)
        sync()
        seconds = time.perf_counter() - started
        probe.close()
        pre_step = (probe.first_call_at - started) if probe.first_call_at is not None else 0.0
        return summarise(probe, device, seconds, len(prompts) * params.max_tokens, pre_step)
    finally:
        probe.close()
        runner.graph_runner = saved


def print_line(name: str, mode: str, result: dict) -> None:
    d, f = result["per_step"]["decode"], result["per_step"]["prefill"]
    dw = result["windows"].get("decode", {})
    print(f"{name:5s} {mode:9s} {result['seconds']:7.3f} s {result['output_tok_s']:9.1f} tok/s | decode wall "
          f"{d['wall'].get('median_ms')} ms span {d['gpu_span_of_launched'].get('median_ms')} ms | prefill wall "
          f"{f['wall'].get('median_ms')} ms | decode window: kernels {dw.get('total_ms_per_step')} ms/step, LoRA "
          f"{dw.get('lora_ms_per_step')} ms ({dw.get('lora_launches_per_step')} launches), GPU idle "
          f"{dw.get('idle_share')} | graph {result['graph_steps']} eager {result['eager_steps']} "
          f"{result['eager_reasons']} | slot loads {result['slot_loads']} | pre-step {result['pre_step_s']} s",
          flush=True)


def runner_stats(llm) -> dict:
    r = llm.engine.runner
    return {"capture_seconds": round(r.capture_seconds, 1), "num_cuda_graphs": r.num_cuda_graphs,
            "compile_seconds": round(r.compile_seconds, 1), "load_seconds": round(r.load_seconds, 1)}


def adapters(model: str, rank: int, count: int, out: Path, targets: list[str]) -> list[Path]:
    """bench_lora.py's random adapters (same names, seeds and directory by default), reused where a run of
    either script wrote them for the same rank, targets and model shapes (the first layer's q_proj A)."""
    from safetensors import safe_open

    from scripts.make_adapters import random_adapters
    from shared_engine.lora.peft_adapter import module_shapes
    from shared_engine.model_loader.model_source import resolve_model

    in_features = module_shapes(resolve_model(model, "dummy", None).arch)[targets[0]][0]
    paths = [out / f"r{rank}-{i}" for i in range(count)]

    def same(path: Path) -> bool:
        try:
            config = json.loads((path / "adapter_config.json").read_text())
            with safe_open(str(path / "adapter_model.safetensors"), "pt") as f:
                name = next(k for k in f.keys() if f".{targets[0]}.lora_A" in k)  # noqa: SIM118 (not iterable)
                shape = tuple(f.get_slice(name).get_shape())
        except (OSError, ValueError, StopIteration):
            return False
        return config.get("r") == rank and sorted(config.get("target_modules") or []) == sorted(targets) \
            and shape == (rank, in_features)

    if all(same(p) for p in paths):
        return paths
    return random_adapters(model, [rank], count, out, targets)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--num-requests", type=int, default=240)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--num-adapters", type=int, default=30)
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--targets", nargs="+", default=["q_proj", "k_proj", "v_proj", "o_proj"])
    p.add_argument("--adapter-dir", type=Path, default=Path("/tmp/lora_bench_adapters"),
                   help="bench_lora.py's default: its rank-16 adapters are reused")
    p.add_argument("--max-loras", type=int, default=32)
    p.add_argument("--lora-kernel", default="sgmv", choices=["sgmv", "bgmv"])
    p.add_argument("--lora-slot-stream", action="store_true")
    p.add_argument("--decode-skip", type=int, default=32, help="decode-only steps before the decode window")
    p.add_argument("--decode-window", type=int, default=16, help="decode-only steps profiled")
    p.add_argument("--itl-tokens", type=int, default=32, help="output tokens of the batch-1 run (its decode "
                   "window: steps 9-24)")
    p.add_argument("--engines", nargs="+", default=["base", "lora"], choices=["base", "lora"])
    p.add_argument("--modes", nargs="+", default=["graphs", "eager"], choices=["graphs", "eager"])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    import random

    import torch
    from torch.profiler import ProfilerActivity

    from shared_engine import LLM, LoRARequest, SamplingParams

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    activity = ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU
    rng = random.Random(0)
    prompts = [[rng.randint(100, 10000) for _ in range(args.input_len)] for _ in range(args.num_requests)]
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    started = time.perf_counter()
    paths = adapters(args.model, args.rank, args.num_adapters, args.adapter_dir, args.targets) \
        if "lora" in args.engines else []
    common = dict(load_format="dummy", max_model_len=args.max_model_len, max_num_seqs=args.max_num_seqs,
                  gpu_memory_utilization=0.8)
    lora_cfg = dict(enable_lora=True, max_loras=args.max_loras, max_lora_rank=64, max_cpu_loras=64,
                    lora_kernel=args.lora_kernel, lora_slot_stream=args.lora_slot_stream)
    results = {"benchmark": "profile_lora_step", "environment": environment(), "command": " ".join(sys.argv),
               "workload": {"num_requests": args.num_requests, "input_len": args.input_len,
                            "output_len": args.output_len, "num_adapters": args.num_adapters, "rank": args.rank,
                            "adapter_targets": args.targets, "decode_skip": args.decode_skip,
                            "decode_window": args.decode_window,
                            "adapter_write_seconds": round(time.perf_counter() - started, 1)},
               "engine_config": {"common": common, "lora": lora_cfg}, "engines": {}}

    def save() -> None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))

    for name in args.engines:
        t0 = time.perf_counter()
        llm = LLM(args.model, **common, **(lora_cfg if name == "lora" else {}))
        entry = results["engines"][name] = {"startup_s": round(time.perf_counter() - t0, 1),
                                            "runner": runner_stats(llm), "modes": {}}
        loras = None
        if name == "lora":
            r = [LoRARequest(f"r{args.rank}-{i}", i + 1, str(path)) for i, path in enumerate(paths)]
            loras = [r[i % len(r)] for i in range(args.num_requests)]
            llm.generate([prompts[i % len(prompts)] for i in range(len(r))], SamplingParams(max_tokens=2),
                         use_tqdm=False, lora_request=r)  # every adapter into the CPU cache and a slot
            entry["warmup_slot_loads"] = llm.engine.runner.lora.num_slot_loads
        else:
            llm.generate(prompts[:8], SamplingParams(max_tokens=4), use_tqdm=False)
        for mode in args.modes:
            result = run_mode(llm, prompts, params, loras, sync=sync, activity=activity, device=device,
                              skip=args.decode_skip, window=args.decode_window, eager=mode == "eager")
            # batch 1 (bench_lora's ITL shape): one request, on one adapter for the LoRA engine
            one = SamplingParams(temperature=0.0, max_tokens=args.itl_tokens, ignore_eos=True)
            result["batch1"] = run_mode(llm, prompts[:1], one, None if loras is None else loras[:1], sync=sync,
                                        activity=activity, device=device, skip=8, window=16, eager=mode == "eager")
            entry["modes"][mode] = result
            save()
            print_line(name, mode, result)
            print_line(name, mode + "-b1", result["batch1"])
        del llm
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    results["elapsed_s"] = round(time.perf_counter() - started, 1)
    save()
    print(f"wrote {args.out} in {results['elapsed_s']} s")


if __name__ == "__main__":
    main()
