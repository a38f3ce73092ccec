"""The engine's Triton attention backend (decode + prefill kernels over a mixed batch) matches the pure-torch
backend on a tiny model: the glue (decode/prefill split, cu_seqlens offsets, slot mapping) is right."""

from __future__ import annotations

import torch
from conftest import DEVICE  # tests/kernels/conftest.py

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_arch import ModelArch
from shared_engine.model_executor.attention.registry import get_backend
from shared_engine.model_executor.input_builder import build_inputs
from shared_engine.model_executor.models.llama import LlamaForCausalLM
from shared_engine.model_loader.weight_loader import init_dummy
from shared_engine.sampling_params import SamplingParams

ARCH = ModelArch.from_dict({
    "architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 64, "intermediate_size": 64,
    "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128, "tie_word_embeddings": True,
})
BLOCK = 16


def scheduled(rid: str, start: int, n: int, table: list[int]) -> ScheduledRequest:
    req = Request(rid, list(range(1, start + n + 1)), SamplingParams(), max_tokens=1)
    return ScheduledRequest(req, [(7 * i + len(rid)) % 64 for i in range(n)], start, table, True)


def test_mixed_batch_matches_torch_backend():
    torch.manual_seed(0)
    model = LlamaForCausalLM(ARCH, max_position=128).to(DEVICE)
    init_dummy(model, seed=1, std=0.2)
    num_blocks = 12
    cache = torch.randn(2, num_blocks, BLOCK, 2, 16, device=DEVICE)  # prefilled "history"
    # two decodes (contexts 21 and 16: on and off block boundaries), then a prefill chunk over a cached
    # prefix and a fresh prompt
    out = SchedulerOutput([
        scheduled("d0", 20, 1, [3, 5]),
        scheduled("d1", 15, 1, [7]),
        scheduled("p0", 16, 9, [0, 9]),
        scheduled("p1", 0, 13, [11]),
    ])
    out.num_batched_tokens = 24
    inputs = build_inputs(out, BLOCK, torch.device(DEVICE))
    assert inputs.meta.num_decodes == 2
    results = []
    for name in ("torch", "triton"):
        kv = [cache.clone()]
        with torch.inference_mode():
            hidden = model(inputs.input_ids, inputs.positions, kv, inputs.meta, get_backend(name))
        results.append((hidden, kv[0]))
    (h_ref, kv_ref), (h, kv) = results
    torch.testing.assert_close(kv, kv_ref)
    # fp32 on the CPU interpreter; on CUDA, Triton's fp32 dot runs in tf32 (about 3e-4 relative per product)
    tol = 2e-4 if DEVICE == "cpu" else 2e-2
    torch.testing.assert_close(h, h_ref, rtol=tol, atol=tol)
