"""Offline throughput: our engine vs transformers' `generate` on the same model, machine and workload.

Workload (nano-vllm's shape): N requests of random token ids, input lengths uniform in
[--input-len-min, --input-len-max], output lengths uniform in [--output-len-min, --output-len-max],
ignore_eos so every request produces exactly its output length. Both engines are credited with the same
useful output tokens (the requested lengths); transformers runs padded batches of --hf-batch-size in request
order (left padding, each batch decoding until its longest request), as a plain `generate` user would.

    python scripts/bench_offline.py --out benchmarks/results/offline_cpu_smollm2.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402


def workload(args) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(args.seed)
    prompts, outputs = [], []
    for _ in range(args.num_requests):
        n_in = rng.randint(args.input_len_min, args.input_len_max)
        prompts.append([rng.randint(100, 10000) for _ in range(n_in)])
        outputs.append(rng.randint(args.output_len_min, args.output_len_max))
    return prompts, outputs


def run_ours(args, prompts, out_lens) -> dict:
    from shared_engine import LLM, SamplingParams

    chosen = {"max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
              "max_model_len": args.max_model_len, "dtype": args.dtype, "load_format": args.load_format,
              "kv_cache_memory": args.kv_cache_memory}
    settings = {k: v for k, v in chosen.items() if v is not None}
    llm = LLM(args.model, **settings)
    params = [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in out_lens]
    llm.generate([[5] * 16], SamplingParams(max_tokens=2), use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.generate(prompts, params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == sum(out_lens), "every request must produce exactly its output length"
    engine = llm.engine
    return {"elapsed_s": elapsed, "output_tokens": generated, "output_throughput": generated / elapsed,
            "num_preemptions": engine.scheduler.num_preemptions_total, "num_steps": engine.stats.num_steps,
            "engine_config": engine.config.to_flat(), "model": engine.source.name}


def run_transformers(args, prompts, out_lens, model_dir) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, None: torch.float32}[args.dtype]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    pad = 0
    started = time.perf_counter()
    for i in range(0, len(prompts), args.hf_batch_size):
        batch, lens = prompts[i : i + args.hf_batch_size], out_lens[i : i + args.hf_batch_size]
        width = max(map(len, batch))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.no_grad():
            model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(lens), min_new_tokens=max(lens),
                           do_sample=False, pad_token_id=pad)
    elapsed = time.perf_counter() - started
    useful = sum(out_lens)
    return {"elapsed_s": elapsed, "output_tokens": useful, "output_throughput": useful / elapsed,
            "batch_size": args.hf_batch_size, "attn_implementation": model.config._attn_implementation}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or preset (default: the embedded model)")
    p.add_argument("--load-format", default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--input-len-min", type=int, default=32)
    p.add_argument("--input-len-max", type=int, default=512)
    p.add_argument("--output-len-min", type=int, default=16)
    p.add_argument("--output-len-max", type=int, default=256)
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--kv-cache-memory", type=int, default=None)
    p.add_argument("--hf-batch-size", type=int, default=16)
    p.add_argument("--skip-hf", action="store_true", help="only our engine")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True, help="results JSON path")
    args = p.parse_args()

    prompts, out_lens = workload(args)
    results = {"benchmark": "offline_throughput", **environment(),
               "workload": {k: getattr(args, k) for k in ("num_requests", "input_len_min", "input_len_max",
                                                           "output_len_min", "output_len_max", "seed")},
               "command": " ".join(sys.argv)}
    results["ours"] = run_ours(args, prompts, out_lens)
    print(f"ours:         {results['ours']['output_throughput']:8.1f} output tokens/s "
          f"({results['ours']['elapsed_s']:.1f} s)", flush=True)
    if not args.skip_hf:
        from shared_engine.model_loader.model_source import resolve_model

        source = resolve_model(args.model, args.load_format or "auto")
        results["transformers"] = run_transformers(args, prompts, out_lens, source.path)
        ours, hf = results["ours"]["output_throughput"], results["transformers"]["output_throughput"]
        results["speedup_vs_transformers"] = ours / hf
        print(f"transformers: {results['transformers']['output_throughput']:8.1f} output tokens/s "
              f"({results['transformers']['elapsed_s']:.1f} s)")
        print(f"speed-up: {results['speedup_vs_transformers']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
