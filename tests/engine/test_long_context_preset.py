"""`llama-3.1-8b` at 131,072 tokens of context (issue 21's coding-agent preset): the shape preset resolves to
Llama 3.1's full context with its frequency scaling, the cos/sin table equals transformers' `llama3` RoPE at
the far end of the context, and on an H200 (capacity model, bf16) the KV pool holds several 131k sessions."""

from __future__ import annotations

import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from kernels.rotary_embedding import build_cos_sin_cache
from shared_engine.config import EngineConfig
from shared_engine.model_loader.model_source import resolve_model
from shared_engine.sim import Simulator, load_hardware

CONTEXT = 131_072


def test_preset_is_llama_3_1_at_full_context():
    source = resolve_model("llama-3.1-8b", "dummy", None)
    arch = source.arch
    assert arch.max_position_embeddings == CONTEXT  # the engine's default max_model_len for the preset
    assert arch.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert (arch.num_layers, arch.num_kv_heads, arch.head_dim, arch.rope_theta) == (32, 8, 128, 500000.0)
    assert arch.kv_bytes_per_token("bfloat16") == 131_072  # bytes: 2 x 32 layers x 8 heads x 128 x 2


def test_cos_sin_table_matches_transformers_llama3_rope_at_131k():
    source = resolve_model("llama-3.1-8b", "dummy", None)
    config = LlamaConfig(**{k: v for k, v in source.config.items() if k != "architectures"})
    inv_freq, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))  # [64]
    arch = source.arch
    cache = build_cos_sin_cache(arch.head_dim, CONTEXT, arch.rope_theta, arch.rope_scaling)
    assert cache.shape == (CONTEXT, arch.head_dim)
    positions = torch.tensor([0, 1, 8191, 8192, 65_535, CONTEXT - 1])
    angles = positions[:, None].float() * inv_freq[None, :].float()  # HF: (inv_freq @ position_ids), fp32
    torch.testing.assert_close(cache[positions, :64], angles.cos(), atol=2e-5, rtol=0)
    torch.testing.assert_close(cache[positions, 64:], angles.sin(), atol=2e-5, rtol=0)


def test_h200_pool_holds_several_131k_sessions():
    config = EngineConfig.from_flat(model="llama-3.1-8b", load_format="dummy", max_model_len=CONTEXT)
    sim = Simulator(config, resolve_model("llama-3.1-8b", "dummy", None).arch, load_hardware("H200"))
    tokens = sim.num_blocks * config.cache.block_size
    assert sim.max_model_len == CONTEXT and tokens // CONTEXT >= 5  # modelled: 902,288 tokens, 6.9 sessions of 131k
