"""How far batching and chunking move one prompt's results on this device (handed.md K6's tolerance), in one
process: prompt P (random token ids) alone, then beside 7 and 63 other prompts in the same `generate` call, greedy,
with prompt logprobs and the chosen tokens' logprobs; every run compared with P alone. Writes a JSON file.

    python scripts/bench_batch_invariance.py --out results.json [--model llama-3.1-8b --load-format dummy]

Per composition: the largest |difference| of P's prompt logprobs (its prefill alone: decode split-K, ragged
prefill tiles and GEMM kernel choice all in play, no divergence possible), the first generated step whose token
differs (None: all equal) and the largest |difference| of the chosen tokens' logprobs before it. Prefix caching
is off, so every call prefills P afresh; the other prompts' lengths make P's prefill share steps (and chunks)
with theirs. On the CPU path (fp32 torch) every difference should be 0 (tests/server/test_k6_batching.py).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402


def compare(alone, other) -> dict:
    """alone, other: RequestOutput of P. Prompt logprobs and generated tokens against P alone."""
    def prompt_lp(out):
        return [None if e is None else e[tok].logprob for e, tok in zip(out.prompt_logprobs, out.prompt_token_ids)]
    pa, po = prompt_lp(alone), prompt_lp(other)
    prompt_diff = max((abs(a - b) for a, b in zip(pa, po) if a is not None and b is not None), default=0.0)
    ta, to = alone.outputs[0].token_ids, other.outputs[0].token_ids
    first = next((i for i, (a, b) in enumerate(zip(ta, to)) if a != b), None)
    upto = len(ta) if first is None else first
    la, lo = alone.outputs[0].logprobs, other.outputs[0].logprobs
    gen_diff = max((abs(la[i][ta[i]].logprob - lo[i][to[i]].logprob) for i in range(upto)), default=0.0)
    return {"max_abs_prompt_logprob_diff": prompt_diff, "first_differing_step": first,
            "max_abs_chosen_logprob_diff_before_it": gen_diff, "steps": len(ta)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default=None, help="default: the embedded default model")
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompt-len", type=int, default=1500)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compositions", default="7,63", help="comma-separated numbers of other prompts beside P")
    ap.add_argument("--other-len-max", type=int, default=3000, help="the other prompts: 100 to this many tokens")
    ap.add_argument("--commit", default=None)
    args = ap.parse_args()
    from shared_engine import LLM, SamplingParams

    counts = [int(n) for n in args.compositions.split(",")]

    kw = {"load_format": args.load_format, "dtype": args.dtype, "max_model_len": args.max_model_len,
          "max_num_seqs": max(counts) + 1, "max_num_batched_tokens": args.max_num_batched_tokens,
          "enable_prefix_caching": False}
    llm = LLM(args.model, **kw, **({"device": args.device} if args.device else {}))
    rng = random.Random(args.seed)
    vocab = 1000  # ids below every model's vocabulary and above the special tokens of ours
    prompt = [rng.randrange(10, vocab) for _ in range(args.prompt_len)]
    others = [[rng.randrange(10, vocab) for _ in range(rng.randrange(100, args.other_len_max + 1))]
              for _ in range(max(counts))]
    p_params = SamplingParams(temperature=0.0, max_tokens=args.steps, ignore_eos=True, logprobs=1, prompt_logprobs=1)
    o_params = SamplingParams(temperature=0.0, max_tokens=args.steps, ignore_eos=True)

    def run(n_others: int):
        batch = [{"prompt_token_ids": prompt}] + [{"prompt_token_ids": o} for o in others[:n_others]]
        return llm.generate(batch, [p_params] + [o_params] * n_others, use_tqdm=False)[0]

    alone = run(0)
    rows = {"alone again": compare(alone, run(0))}
    for n in counts:
        rows[f"beside {n} others"] = compare(alone, run(n))
    commit = args.commit or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                           text=True).stdout.strip() or "unknown"
    runner = llm.engine.runner
    record = {"commit": commit, "command": " ".join(sys.argv), **environment(), "model": args.model or "default",
              "engine": {**kw, "dtype": str(runner.dtype).removeprefix("torch."), "device": str(runner.device)},
              "prompt_len": args.prompt_len, "steps": args.steps, "compositions": rows}
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    for name, r in rows.items():
        print(f"{name:18s} prompt logprobs max |diff| {r['max_abs_prompt_logprob_diff']:.3e} | first differing "
              f"step {r['first_differing_step']} of {r['steps']} | chosen logprobs max |diff| before it "
              f"{r['max_abs_chosen_logprob_diff_before_it']:.3e}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
