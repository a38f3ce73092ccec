"""Greedy token agreement of FP8 KV cache and FP8 weights against the model's own dtype, on real text.

Three engines on the same prompts, one after the other (each freed before the next): the reference
(`--kv-cache-dtype auto`, no quantization), FP8 KV (`--kv-cache-dtype fp8`, e4m3, scales 1.0) and FP8 KV + FP8
weights (`--quantization fp8`: per-channel weight scales, dynamic per-token activation scales, the matmul on
FP8 tensor cores; CUDA only). Prompts are consecutive `--prompt-len`-token slices of `--text` (real text, the
model's tokenizer); every request decodes `--max-tokens` tokens greedily with `ignore_eos`, free-running (each
variant follows its own tokens, so one flip changes everything after it). Recorded per variant: the share of
positions equal to the reference, the number of prompts equal over all tokens, and each prompt's first
divergence (None when equal).

    # H200, the embedded default model's real weights in bf16 (~60 s with three start-ups):
    python scripts/fp8_greedy_agreement.py --dtype bfloat16 --out OUT.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.env_info import environment  # noqa: E402
from shared_engine import LLM, SamplingParams  # noqa: E402

VARIANTS = {
    "reference": {},
    "fp8_kv": {"kv_cache_dtype": "fp8"},
    "fp8_weights_and_kv": {"kv_cache_dtype": "fp8", "quantization": "fp8"},
}


def prompts_from(text: str, tokenizer, num: int, length: int) -> list[list[int]]:
    """`num` consecutive `length`-token slices of `text`.

    Raises:
        ValueError: the text has fewer than `num * length` tokens.
    """
    ids = tokenizer.encode(text)
    if len(ids) < num * length:
        raise ValueError(f"--text has {len(ids)} tokens, fewer than {num} x {length}")
    return [ids[i * length:(i + 1) * length] for i in range(num)]


def first_divergence(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return i
    return None


def run_variant(args, flags: dict, prompts: list[list[int]] | None, text: str):
    """One engine: (its outputs, seconds of generate, the prompts (built from `text` when None))."""
    llm = LLM(args.model, load_format=args.load_format, dtype=args.dtype,
              max_model_len=args.prompt_len + args.max_tokens, **flags)
    if prompts is None:
        prompts = prompts_from(text, llm.get_tokenizer(), args.num_prompts, args.prompt_len)
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    llm.shutdown()
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return tokens, seconds, prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="model directory or preset (default: the embedded model)")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--text", type=Path, default=Path("README.md"))
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()

    text = args.text.read_text()
    outputs, seconds, prompts = {}, {}, None
    for name in ["reference"] + [v for v in args.variants if v != "reference"]:
        outputs[name], seconds[name], prompts = run_variant(args, VARIANTS[name], prompts, text)
        print(f"{name}: {seconds[name]:.2f} s")

    ref = outputs["reference"]
    variants = {}
    for name, toks in outputs.items():
        if name == "reference":
            continue
        div = [first_divergence(r, t) for r, t in zip(ref, toks, strict=True)]
        equal_positions = sum(x == y for r, t in zip(ref, toks, strict=True) for x, y in zip(r, t, strict=True))
        diverged = [d for d in div if d is not None]
        variants[name] = {
            "position_agreement": round(equal_positions / (len(ref) * args.max_tokens), 4),
            "prompts_equal": sum(d is None for d in div),
            "median_first_divergence": statistics.median(diverged) if diverged else None,
            "first_divergence": div,
            "generate_seconds": round(seconds[name], 3),
        }
        v = variants[name]
        print(f"{name:20s} positions equal {v['position_agreement']:.1%}, prompts equal {v['prompts_equal']}/"
              f"{len(ref)}, median first divergence {v['median_first_divergence']}")
    results = {"benchmark": "fp8_greedy_agreement", **environment(), "command": " ".join(sys.argv),
               "workload": {"text": str(args.text), "num_prompts": args.num_prompts, "prompt_len": args.prompt_len,
                            "max_tokens": args.max_tokens, "greedy": True, "ignore_eos": True},
               "model": args.model or "default (SmolLM2-135M-Instruct, real weights)", "dtype": args.dtype,
               "reference_seconds": round(seconds["reference"], 3), "variants": variants,
               "reference_tokens": ref, "outputs": {k: v for k, v in outputs.items() if k != "reference"}}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
