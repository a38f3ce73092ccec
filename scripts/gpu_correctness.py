"""Our engine (Triton kernels, CUDA graphs, bf16) vs transformers' eager forward on the same random weights
of a real model shape: greedy tokens for --steps decode steps, and first-step logits.

The transformers model is built from the preset's config with its own random init, then its state dict is
copied into our engine (so both hold identical weights). Greedy decoding in bf16 can diverge where two
logits are within bf16 rounding of each other; at the first divergence the script records the reference's
top-2 logit margin there, which explains it when it is within bf16 tolerance.

    python scripts/gpu_correctness.py --model llama-3.1-8b --steps 32 --out results.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--num-prompts", type=int, default=4)
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)

    from transformers import AutoConfig, AutoModelForCausalLM

    from shared_engine import LLM, SamplingParams
    from shared_engine.model_loader.model_source import resolve_model

    source = resolve_model(args.model, "dummy")
    config = AutoConfig.for_model(**{k: v for k, v in source.config.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device(args.device):
        hf = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="eager").eval()
    llm = LLM(args.model, load_format="dummy", dtype=args.dtype, device=args.device, max_model_len=512,
              max_num_seqs=8, gpu_memory_utilization=0.6, kv_cache_memory=2**30 if args.device == "cpu" else None)
    with torch.no_grad():
        llm.engine.runner.model.load_weights(hf.state_dict().items())
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(100, 10000, (args.prompt_len + 7 * i,), generator=gen).tolist()
               for i in range(args.num_prompts)]
    ours = llm.generate(prompts, SamplingParams(temperature=0.0, max_tokens=args.steps, ignore_eos=True,
                                                logprobs=1), use_tqdm=False)
    report = {"benchmark": "gpu_correctness", **environment(), "model": args.model, "steps": args.steps,
              "command": " ".join(sys.argv), "prompts": []}
    for prompt, out in zip(prompts, ours):
        mine = out.outputs[0].token_ids
        with torch.no_grad():
            ref_ids = hf.generate(torch.tensor([prompt], device=args.device), max_new_tokens=args.steps,
                                  min_new_tokens=args.steps, do_sample=False, pad_token_id=0)[0, len(prompt):].tolist()
            ref_logits = hf(torch.tensor([prompt], device=args.device)).logits[0, -1].float()
        first = next((i for i, (a, b) in enumerate(zip(mine, ref_ids)) if a != b), None)
        entry = {"prompt_len": len(prompt), "tokens_equal": mine == ref_ids, "first_divergence": first,
                 "matching_prefix": first if first is not None else len(mine)}
        # first-step logprob of our token under the reference vs our own
        ref_lp = torch.log_softmax(ref_logits, -1)
        entry["first_token_logprob_ours"] = out.outputs[0].logprobs[0][mine[0]].logprob
        entry["first_token_logprob_ref"] = float(ref_lp[mine[0]])
        if first is not None:
            with torch.no_grad():
                ctx = torch.tensor([prompt + ref_ids[:first]], device=args.device)
                logits = hf(ctx).logits[0, -1].float()
            top2 = logits.topk(2)
            entry["ref_top2_margin_at_divergence"] = float(top2.values[0] - top2.values[1])
            entry["ref_logit_gap_ours_vs_ref_token"] = float(logits[ref_ids[first]] - logits[mine[first]])
            entry["ref_logit_scale"] = float(logits.abs().max())
        report["prompts"].append(entry)
        print(json.dumps(entry), flush=True)
    report["all_equal"] = all(e["tokens_equal"] for e in report["prompts"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
