"""The Llama-family decoder: Llama 2/3/3.1, Mistral, Qwen2/2.5 (QKV bias), Qwen3 (q/k norm), SmolLM.

One flattened batch of tokens per step (no padding); attention reads and writes the paged KV cache
through the backend given in `AttentionMetadata`'s companion `backend`. Parameter names follow Hugging
Face's, except that q/k/v and gate/up are stored fused (`qkv_proj`, `gate_up_proj`) so each is one matmul.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from shared_engine.model_arch import ModelArch
from shared_engine.model_executor.attention.metadata import AttentionMetadata
from shared_engine.model_executor.layers.activation import silu_and_mul
from shared_engine.model_executor.layers.lora import LoRAContext, LoRAProjection
from shared_engine.model_executor.layers.parallel_linear import (
    down_parallel_linear,
    gate_up_parallel_linear,
    local_head_partition,
    o_parallel_linear,
    qkv_parallel_linear,
)
from shared_engine.model_executor.layers.rms_norm import RMSNorm
from shared_engine.model_executor.layers.rotary_embedding import RotaryEmbedding
from shared_engine.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

# Hugging Face name fragment → (our fused parameter, shard index)
_FUSED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}


class LlamaAttention(nn.Module):
    def __init__(self, arch: ModelArch, rotary: RotaryEmbedding) -> None:
        super().__init__()
        part = local_head_partition(arch.num_heads, arch.num_kv_heads)  # this rank's heads (all at TP=1)
        self.num_heads, self.num_kv_heads, self.head_dim = part.num_heads, part.num_kv_heads, arch.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = qkv_parallel_linear(arch.hidden_size, arch.num_heads, arch.num_kv_heads, arch.head_dim, part,
                                            arch.attention_bias)
        # o_proj sums the ranks' partial outputs (one all-reduce per attention block)
        self.o_proj = o_parallel_linear(arch.num_heads, arch.head_dim, part, arch.hidden_size)
        self.q_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, arch.rms_norm_eps) if arch.qk_norm else None
        self.rotary = rotary
        self.scale = self.head_dim**-0.5
        # FP8 KV cache (kv_cache_dtype fp8): this layer's per-tensor K and V scales, cached = fp8(x / scale).
        # 1.0, vLLM's default without checkpoint scales (CacheConfig); unused by a bf16/fp32 cache.
        self.k_scale = 1.0
        self.v_scale = 1.0
        self.qkv_lora: LoRAProjection | None = None  # q, k, v slices (enable_lora)
        self.o_lora: LoRAProjection | None = None

    def forward(self, positions, hidden, kv_cache, meta: AttentionMetadata, backend) -> torch.Tensor:
        if self.qkv_lora is None:
            qkv = self.qkv_proj(hidden)  # [num_tokens, q_size + 2 * kv_size]
        else:
            qkv = self.qkv_lora.apply(hidden, self.qkv_proj)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(-1, self.num_heads, self.head_dim)
        k = k.reshape(-1, self.num_kv_heads, self.head_dim)
        v = v.reshape(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: per-head RMSNorm before RoPE
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(-1, self.num_heads, self.head_dim)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(-1, self.num_kv_heads, self.head_dim)
        q, k = self.rotary(positions, q, k)
        out = backend.forward(q, k, v, kv_cache[0], kv_cache[1], meta, self.scale, self.k_scale, self.v_scale)
        out = out.reshape(-1, self.q_size)
        if self.o_lora is None:
            return self.o_proj(out)
        return self.o_lora.apply(out, self.o_proj)


class LlamaMLP(nn.Module):
    def __init__(self, arch: ModelArch) -> None:
        super().__init__()
        self.gate_up_proj = gate_up_parallel_linear(arch.hidden_size, arch.intermediate_size)
        self.down_proj = down_parallel_linear(arch.intermediate_size, arch.hidden_size)  # all-reduces
        self.gate_up_lora: LoRAProjection | None = None  # gate, up slices (enable_lora)
        self.down_lora: LoRAProjection | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_lora is None:
            return self.down_proj(silu_and_mul(self.gate_up_proj(x)))
        h = silu_and_mul(self.gate_up_lora.apply(x, self.gate_up_proj))
        return self.down_lora.apply(h, self.down_proj)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, arch: ModelArch, rotary: RotaryEmbedding) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(arch, rotary)
        self.mlp = LlamaMLP(arch)
        self.input_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)

    def forward(self, positions, hidden, residual, kv_cache, meta, backend):
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden, kv_cache, meta, backend)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaModel(nn.Module):
    def __init__(self, arch: ModelArch, max_position: int) -> None:
        super().__init__()
        rotary = RotaryEmbedding(arch.head_dim, max_position, arch.rope_theta, arch.rope_scaling)
        self.embed_tokens = VocabParallelEmbedding(arch.vocab_size, arch.hidden_size)
        self.layers = nn.ModuleList(LlamaDecoderLayer(arch, rotary) for _ in range(arch.num_layers))
        self.norm = RMSNorm(arch.hidden_size, arch.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """`forward(input_ids [T], positions [T], kv_caches, meta, backend) -> hidden [T, hidden]`;
    `compute_logits(hidden [S, hidden]) -> [S, vocab]` (fp32)."""

    def __init__(self, arch: ModelArch, max_position: int) -> None:
        super().__init__()
        self.arch = arch
        self.model = LlamaModel(arch, max_position)
        self.lm_head = ParallelLMHead(arch.hidden_size, arch.vocab_size)
        if arch.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [num_tokens] int64
        positions: torch.Tensor,  # [num_tokens] int64
        kv_caches: list[torch.Tensor],  # per layer [2, num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        backend,
    ) -> torch.Tensor:
        hidden = self.model.embed_tokens(input_ids)
        residual = None
        for layer, kv_cache in zip(self.model.layers, kv_caches):
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta, backend)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def enable_lora(self, ctx: LoRAContext, max_rank: int) -> None:
        """Give every attention and MLP projection `ctx.max_loras` LoRA slots of rank `max_rank` (zeros:
        no adapter loaded), in the model's dtype and device. See layers/lora.py."""
        a = self.arch
        q, kv, h, i = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.hidden_size, a.intermediate_size
        ref = self.lm_head.weight
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_lora = LoRAProjection(ctx, h, [q, kv, kv], max_rank, ref.dtype, ref.device, "qkv")
            attn.o_lora = LoRAProjection(ctx, q, [h], max_rank, ref.dtype, ref.device, "o")
            mlp.gate_up_lora = LoRAProjection(ctx, h, [i, i], max_rank, ref.dtype, ref.device, "gate_up")
            mlp.down_lora = LoRAProjection(ctx, i, [h], max_rank, ref.dtype, ref.device, "down")

    def lora_targets(self, layer: int) -> dict[str, tuple[LoRAProjection, int]]:
        """PEFT module name → (its LoRA projection in `layer`, slice index)."""
        attn, mlp = self.model.layers[layer].self_attn, self.model.layers[layer].mlp
        return {"q_proj": (attn.qkv_lora, 0), "k_proj": (attn.qkv_lora, 1), "v_proj": (attn.qkv_lora, 2),
                "o_proj": (attn.o_lora, 0), "gate_proj": (mlp.gate_up_lora, 0), "up_proj": (mlp.gate_up_lora, 1),
                "down_proj": (mlp.down_lora, 0)}

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy Hugging Face-named tensors into the (fused) parameters. Returns the names loaded.

        Raises `ValueError` for a tensor with no matching parameter or a shape mismatch.
        """
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if name == "lm_head.weight" and self.arch.tie_word_embeddings:
                continue
            target, shard = self._target(name)
            if target not in params:
                raise ValueError(f"checkpoint tensor {name!r} has no parameter in {self.arch.architecture}")
            module_name, _, param_name = target.rpartition(".")
            load_shard = getattr(self.get_submodule(module_name), "load_shard", None)
            if load_shard is not None:  # tensor-parallel layers take their rank's slice
                try:
                    load_shard(param_name, tensor, shard)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from exc
            elif params[target].shape != tensor.shape:
                raise ValueError(f"{name}: checkpoint shape {tuple(tensor.shape)} != parameter "
                                 f"{tuple(params[target].shape)}")
            else:
                params[target].data.copy_(tensor)
            loaded.add(target)
        return loaded

    @staticmethod
    def _target(name: str) -> tuple[str, int | None]:
        for fragment, (fused, shard) in _FUSED.items():
            if f".{fragment}." in name:
                return name.replace(fragment, fused), shard
        return name, None
