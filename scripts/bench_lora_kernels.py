"""LoRA kernels at llama-3.1-8b shapes on one GPU: SGMV (kernels/lora_sgmv.py) against BGMV
(kernels/lora_bgmv.py), each through the model's LoRA layer (layers/lora.py: every slice of a fused
projection), timed as CUDA-graph replays (triton.testing.do_bench_cudagraph, so launch overhead is what a
captured step pays), in bf16 with 32 slots of max rank 64 (the benchmark engine's `--max-loras 32
--max-lora-rank 64`) and adapters on q/k/v/o (gate/up/down untargeted: rank 0, as scripts/bench_lora.py).

Kernels: `bgmv`, `sgmv` (the two SGMV launches, shrink and expand) and, for T <= 64, `fused`
(kernels/lora_sgmv_fused.py sgmv_fused: shrink and expand in one launch, which the layer takes at T <=
FUSED_MAX_TOKENS); the per-layer sums say where the fused kernel's threshold belongs; for T <= 8, `tiny`
(kernels/lora_tiny.py lora_tiny: one launch without tiles, split-K shrinks and expands meeting at a device
counter; the layer takes it at T <= TINY_MAX_TOKENS, env LORA_TINY_MAX_TOKENS) and `tiny2` (the same
programs as two launches, LORA_TINY_TWO_LAUNCHES=1).

Cases: T tokens per step (1: batch-1 decode; 2, 8, 16, 64: small decode batches; 240: the throughput run's
decode batch; 2048: a prefill chunk), spread uniformly over 30 adapters of rank 16 (`r16`), of ranks
8/16/64 (`mixed`), or all on the base model (`base`: what a graph with LoRA layers costs a step without
adapters). Per case: microseconds per projection and per layer (their sum), the step's estimate (x 32
layers), and SGMV's and the fused kernel's relative difference from BGMV's output.

    python scripts/bench_lora_kernels.py --out /tmp/lora_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.env_info import environment  # noqa: E402

PROJECTIONS = {"qkv": (4096, [4096, 1024, 1024]), "o": (4096, [4096]), "gate_up": (4096, [14336, 14336]),
               "down": (14336, [4096])}
TARGETED = {"qkv", "o"}
NUM_LAYERS = 32


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 8, 16, 64, 240, 2048])
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from triton.testing import do_bench_cudagraph

    import kernels.lora_sgmv_fused as fused
    import kernels.lora_tiny as tiny
    from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection

    default_fused_max = fused.FUSED_MAX_TOKENS

    def use(kernel: str) -> None:  # "fused" / "tiny(2)": the layer's SGMV path always that one; "sgmv": neither
        ctx.kernel = "bgmv" if kernel == "bgmv" else "sgmv"
        fused.FUSED_MAX_TOKENS = 1 << 30 if kernel == "fused" else 0
        tiny.TINY_MAX_TOKENS = 1 << 30 if kernel in ("tiny", "tiny2") else 0
        tiny.TWO_LAUNCHES = kernel == "tiny2"

    dev, dtype, num_slots, max_rank = torch.device("cuda"), torch.bfloat16, 32, 64
    g = torch.Generator(device=dev).manual_seed(0)
    ctx = LoRAContext(max(args.tokens) + 256, num_slots, dtype, dev)
    layers = {name: LoRAProjection(ctx, fan_in, outs, max_rank, dtype, dev) for name, (fan_in, outs) in
              PROJECTIONS.items()}
    results = {"benchmark": "lora_kernels", "environment": environment(), "command": " ".join(sys.argv),
               "config": {"dtype": "bfloat16", "max_loras": num_slots, "max_lora_rank": max_rank,
                          "targets": sorted(TARGETED),
                          "fused_max_tokens_default": default_fused_max,
                          "timing": "triton.testing.do_bench_cudagraph: mean of CUDA-graph replays, microseconds"},
               "cases": {}}
    for rank_mix in ("r16", "mixed", "base"):
        ranks = [16] * 30 if rank_mix != "mixed" else [8, 16, 64] * 10
        for name, layer in layers.items():
            for slot in range(num_slots):
                for i, size in enumerate(layer.out_sizes):
                    r = ranks[slot] if slot < 30 and name in TARGETED else 0
                    a = torch.randn(r, layer.lora_a.shape[1], device=dev, generator=g).to(dtype) / 64 if r else None
                    b = torch.randn(size, r, device=dev, generator=g).to(dtype) / 4 if r else None
                    layer.write_slot(slot, i, a, b)
        for num_tokens in args.tokens:
            slots = torch.arange(num_tokens) % 30 if rank_mix != "base" else torch.full((num_tokens,), -1)
            ctx.set_token_slots(slots[torch.randperm(num_tokens)])
            ctx.active = True
            case = {}
            kernels = ("bgmv", "sgmv") + (("fused",) if num_tokens <= 64 else ())
            kernels += ("tiny", "tiny2") if num_tokens <= 8 else ()
            for name, layer in layers.items():
                x = torch.randn(num_tokens, layer.lora_a.shape[1], device=dev, generator=g).to(dtype)
                out = torch.zeros(num_tokens, sum(layer.out_sizes), device=dev, dtype=dtype)
                row, outputs = {}, {}
                for kernel in kernels:  # outputs first: the timed calls accumulate into `out`
                    use(kernel)
                    outputs[kernel] = layer(x, out.clone())
                for kernel in kernels:
                    use(kernel)
                    row[f"{kernel}_us"] = round(do_bench_cudagraph(lambda: layer(x, out)) * 1e3, 2)  # noqa: B023
                ref = outputs["bgmv"].float()
                for kernel in kernels[1:]:
                    diff = (outputs[kernel].float() - ref).norm() / ref.norm().clamp_min(1e-30)
                    row[f"{kernel}_rel_diff"] = float(diff)
                case[name] = row
            layer_us = {k: round(sum(r[f"{k}_us"] for r in case.values()), 2) for k in kernels}
            case["per_layer_us"] = layer_us
            case["per_step_ms_32_layers"] = {k: round(v * NUM_LAYERS / 1e3, 3) for k, v in layer_us.items()}
            results["cases"][f"{rank_mix}_T{num_tokens}"] = case
            print(rank_mix, num_tokens, json.dumps(case["per_layer_us"]), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
