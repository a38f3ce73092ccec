"""Per-layer error of FP8 KV cache and FP8 weights against the model's own dtype, on the same tokens.

One model, four variants over identical inputs: KV in the model dtype (the reference), FP8 KV, FP8 weights
(`quantize_linear_layers`, as `--quantization fp8` does at load) with model-dtype KV, and both. Each variant
prefills `--num-seqs` random prompts of `--prompt-len` tokens and then runs `--decode-steps` teacher-forced
decode steps (the same random next tokens for every variant, so the errors never compound through different
paths); with `--text FILE` the prompts and next tokens are consecutive slices of that file's tokens instead
(real text: argmax agreement is then next-token agreement; on random tokens the logits are flat and it says
little). Recorded per variant: every decoder layer's output (the residual stream) as relative L2 error against
the reference at the prefill and at the last decode step, and the logits at every step (relative L2, largest
|difference|, argmax agreement). K/V scales are 1.0 (the engine's default); the reference caches' largest
|K| and |V| per layer are recorded to show how far they sit from e4m3's 448.

Baselines, to tell rounding amplified by the network from a bug (a random-weight model amplifies any rounding
through its 32 layers): `bf16_vs_fp32` is the model-dtype run against the same weights in fp32 (fp32 KV; only
when the model dtype is not fp32), i.e. the error bf16 itself makes; every variant is also compared with that
fp32 run (`vs_fp32`; on CUDA the Triton attention kernels' fp32 dots run in tf32, unit roundoff 2^-11, still 8x
finer than bf16). `fp8_kv_calibrated` is FP8 KV with per-layer scales amax / 448 from the reference caches
(the whole e4m3 range used), which says whether the default scale 1.0 costs precision. e4m3 keeps 3 fraction
bits (unit roundoff 2^-4), bf16 7 (2^-8): rounding K/V alone to e4m3 should cost at most ~16x what rounding
every tensor to bf16 costs if the network amplifies both alike.

    # H200, dummy llama-3.1-8b (bf16, Triton kernels, torch._scaled_mm), ~90 s (+32 GB for the fp32 copy):
    python scripts/fp8_layer_error.py --model llama-3.1-8b --load-format dummy --out OUT.json
    # CPU smoke of the baselines: --model DIR --load-format dummy --dtype bfloat16 --num-seqs 2 --prompt-len 64
    # CPU, the default model's real weights on real text (fp32, torch backend; _scaled_mm runs on the CPU), ~2 min:
    python scripts/fp8_layer_error.py --num-seqs 2 --prompt-len 256 --text README.md --out OUT.json
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from benchmarks.env_info import environment  # noqa: E402
from shared_engine.config import EngineConfig  # noqa: E402
from shared_engine.core.request import Request  # noqa: E402
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput  # noqa: E402
from shared_engine.model_executor.input_builder import build_inputs  # noqa: E402
from shared_engine.model_executor.layers.fp8_linear import FP8_DTYPE, quantize_linear_layers  # noqa: E402
from shared_engine.model_executor.model_runner import ModelRunner  # noqa: E402
from shared_engine.model_loader.model_source import resolve_model  # noqa: E402
from shared_engine.sampling_params import SamplingParams  # noqa: E402

BLOCK = 16


def steps(args, vocab: int, text_tokens: list[int] | None) -> list[SchedulerOutput]:
    """The prefill, then the decode steps, of `num_seqs` sequences with disjoint block tables."""
    gen = torch.Generator().manual_seed(args.seed)
    total = args.prompt_len + args.decode_steps
    per_seq = -(-total // BLOCK)
    if text_tokens is None:
        tokens = torch.randint(100, vocab - 1, (args.num_seqs, total), generator=gen).tolist()
    else:
        if len(text_tokens) < args.num_seqs * total:
            raise ValueError(f"--text has {len(text_tokens)} tokens, {args.num_seqs * total} needed")
        tokens = [text_tokens[s * total:(s + 1) * total] for s in range(args.num_seqs)]
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(args.num_seqs)]
    reqs = [Request(f"r{s}", tokens[s][: args.prompt_len], SamplingParams(), max_tokens=args.decode_steps)
            for s in range(args.num_seqs)]
    out = [SchedulerOutput([ScheduledRequest(r, tokens[s][: args.prompt_len], 0, tables[s], True)
                            for s, r in enumerate(reqs)], num_batched_tokens=args.num_seqs * args.prompt_len)]
    for t in range(args.decode_steps):
        pos = args.prompt_len + t
        out.append(SchedulerOutput([ScheduledRequest(r, [tokens[s][pos]], pos, tables[s], True)
                                    for s, r in enumerate(reqs)], num_batched_tokens=args.num_seqs))
    return out


@torch.inference_mode()
def run_variant(runner: ModelRunner, schedule, kv_dtype: torch.dtype, num_blocks: int):
    """Per step: (logits [num_seqs, vocab] fp32, per-layer residual stream [tokens, hidden] fp32); the caches."""
    a = runner.arch
    caches = [torch.zeros(2, num_blocks, BLOCK, runner.num_kv_heads, a.head_dim, dtype=kv_dtype, device=runner.device)
              for _ in range(a.num_layers)]
    layers, recorded = runner.model.model.layers, []
    hooks = [layer.register_forward_hook(lambda _m, _i, out: recorded.append((out[0] + out[1]).float()))
             for layer in layers]
    results = []
    try:
        for out in schedule:
            recorded.clear()
            inputs = build_inputs(out, BLOCK, runner.device)
            hidden = runner.model(inputs.input_ids, inputs.positions, caches, inputs.meta, runner.backend)
            logits = runner.model.compute_logits(hidden[inputs.sample_indices]).float()
            results.append((logits, list(recorded)))
    finally:
        for h in hooks:
            h.remove()
    return results, caches


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def compare(results, reference) -> dict:
    logits = [{"step": s, "rel_l2": rel(a, b), "max_abs": float((a - b).abs().max()),
               "argmax_agreement": float((a.argmax(-1) == b.argmax(-1)).float().mean())}
              for s, ((a, _), (b, _)) in enumerate(zip(results, reference))]
    prefill = [rel(x, y) for x, y in zip(results[0][1], reference[0][1])]
    last = [rel(x, y) for x, y in zip(results[-1][1], reference[-1][1])]
    return {"logits": logits, "layer_rel_l2_prefill": prefill, "layer_rel_l2_last_decode": last,
            "max_logits_rel_l2": max(x["rel_l2"] for x in logits),
            "mean_argmax_agreement": sum(x["argmax_agreement"] for x in logits) / len(logits)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory or preset (default: the embedded model)")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-seqs", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=1024)
    p.add_argument("--decode-steps", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", type=Path, default=None, help="prompts from this text file (the model's tokenizer)")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    started = time.perf_counter()
    source = resolve_model(args.model, args.load_format)
    max_len = args.prompt_len + args.decode_steps + BLOCK
    config = EngineConfig.from_flat(model=args.model, load_format=args.load_format, dtype=args.dtype,
                                    max_model_len=max_len).with_resolved_defaults()
    runner = ModelRunner(config, source)
    num_blocks = args.num_seqs * -(-(args.prompt_len + args.decode_steps) // BLOCK)
    text_tokens = None
    if args.text is not None:
        from shared_engine.engine.tokenizer import load_tokenizer

        text_tokens = load_tokenizer(source.tokenizer_path).encode(args.text.read_text())
    schedule = steps(args, runner.arch.vocab_size, text_tokens)
    reference, ref_caches = run_variant(runner, schedule, runner.dtype, num_blocks)
    amax = [[float(c[0].abs().max()), float(c[1].abs().max())] for c in ref_caches]
    del ref_caches
    fp32 = None
    if runner.dtype != torch.float32:  # the same weights in fp32 (bf16 values are exact in fp32), fp32 KV
        model = runner.model
        runner.model = copy.deepcopy(model).float()
        for module in runner.model.modules():
            if hasattr(module, "cos_sin_cache"):
                module.cos_sin_cache = module.cos_sin_cache.float()
        try:
            fp32 = run_variant(runner, schedule, torch.float32, num_blocks)[0]
        finally:
            runner.model = model  # the fp32 copy is freed here
            if runner.device.type == "cuda":
                torch.cuda.empty_cache()

    def measured(results) -> dict:
        out = compare(results, reference)
        if fp32 is not None:
            out["vs_fp32"] = compare(results, fp32)
        return out

    variants = {}
    if fp32 is not None:
        variants["bf16_vs_fp32"] = compare(reference, fp32)
    variants["fp8_kv"] = measured(run_variant(runner, schedule, FP8_DTYPE, num_blocks)[0])
    attn = [layer.self_attn for layer in runner.model.model.layers]
    for layer, (k_amax, v_amax) in zip(attn, amax):
        layer.k_scale, layer.v_scale = max(k_amax, 1e-6) / 448.0, max(v_amax, 1e-6) / 448.0
    variants["fp8_kv_calibrated"] = measured(run_variant(runner, schedule, FP8_DTYPE, num_blocks)[0])
    for layer in attn:
        layer.k_scale = layer.v_scale = 1.0
    quantize_linear_layers(runner.model)
    variants["fp8_weights"] = measured(run_variant(runner, schedule, runner.dtype, num_blocks)[0])
    variants["fp8_weights_and_kv"] = measured(run_variant(runner, schedule, FP8_DTYPE, num_blocks)[0])
    results = {"benchmark": "fp8_layer_error", **environment(), "command": " ".join(sys.argv),
               "model": source.name, "dtype": runner.dtype_name, "device": str(runner.device),
               "backend": type(runner.backend).__name__, "kv_scales": 1.0,
               "workload": {**{k: getattr(args, k) for k in ("num_seqs", "prompt_len", "decode_steps", "seed")},
                            "text": None if args.text is None else str(args.text)},
               "reference_kv_amax_per_layer": amax, "variants": variants,
               "elapsed_s": time.perf_counter() - started}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    base = variants.get("bf16_vs_fp32")
    for name, v in variants.items():
        extra = ""
        if base is not None and name != "bf16_vs_fp32":
            extra = (f" | vs fp32 {v['vs_fp32']['max_logits_rel_l2']:.4f} = "
                     f"{v['max_logits_rel_l2'] / base['max_logits_rel_l2']:.1f}x bf16's own; layer 0 "
                     f"{v['layer_rel_l2_prefill'][0] / base['layer_rel_l2_prefill'][0]:.1f}x")
        print(f"{name:20s} logits rel L2 <= {v['max_logits_rel_l2']:.4f}, argmax agreement "
              f"{100 * v['mean_argmax_agreement']:.1f}%, layer 0 / last rel L2 prefill "
              f"{v['layer_rel_l2_prefill'][0]:.4f} / {v['layer_rel_l2_prefill'][-1]:.4f}, last decode "
              f"{v['layer_rel_l2_last_decode'][-1]:.4f}{extra}")
    print(f"K/V amax over layers: {max(a for a, _ in amax):.2f} / {max(b for _, b in amax):.2f}; wrote {args.out}")


if __name__ == "__main__":
    main()
