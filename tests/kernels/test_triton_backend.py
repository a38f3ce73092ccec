"""The engine's Triton attention backend (decode + prefill kernels over a mixed batch) matches the pure-torch
backend on a tiny model: the glue (decode/prefill split, cu_seqlens offsets, slot mapping) is right. Its
cascade decode path (shared-prefix kernel) matches its plain decode path, also in a CUDA graph's padded
layout."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _util import assert_rel_close, rel_tol
from conftest import DEVICE  # tests/kernels/conftest.py

from shared_engine.core.request import Request
from shared_engine.core.scheduler_output import ScheduledRequest, SchedulerOutput
from shared_engine.model_arch import ModelArch
from shared_engine.model_executor.attention import triton_backend
from shared_engine.model_executor.attention.metadata import AttentionMetadata
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


def record_prefill_kernels(monkeypatch, ragged: bool) -> list[str]:
    """RAGGED_PREFILL set to `ragged`; returns the list the backend's prefill kernel calls append their names to."""
    monkeypatch.setattr(triton_backend, "RAGGED_PREFILL", ragged)
    calls = []
    for name in ("paged_prefill_attention", "ragged_prefill_attention"):
        real = getattr(triton_backend, name)
        monkeypatch.setattr(triton_backend, name, lambda *a, _f=real, _n=name, **kw: calls.append(_n) or _f(*a, **kw))
    return calls


@pytest.mark.parametrize("ragged", [False, True])
def test_mixed_batch_matches_torch_backend(ragged, monkeypatch):
    """The prefill chunks through the paged kernel (K/V back from the cache) or the ragged one (the step's k / v
    as the model's qkv projection slices them, the prefix from the cache)."""
    calls = record_prefill_kernels(monkeypatch, ragged)
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
    assert set(calls) == {"ragged_prefill_attention" if ragged else "paged_prefill_attention"}


# ---- cascade (shared-prefix) decode attention --------------------------------------------------------
HQ, HK, D = 8, 2, 16  # GQA 4
NUM_SHARED = 17  # blocks: 272 tokens >= CASCADE_MIN_PREFIX_TOKENS
SUFFIXES = [1, 15, 16, 17, 33, 2, 40, 8, 31]  # tokens after the prefix, around block boundaries


def shared_prefix_step(chunks: list[tuple[int, int]]) -> SchedulerOutput:
    """Nine decodes whose tables begin with the same 17 blocks (a prefix-cached prompt), each with its own
    suffix blocks, then prefill chunks (cached length, chunk length) over blocks of their own."""
    shared = list(range(2, 2 + NUM_SHARED))
    next_block = 2 + NUM_SHARED
    items = []
    for s, suffix in enumerate(SUFFIXES):
        own = list(range(next_block, next_block + -(-suffix // BLOCK)))
        next_block += len(own)
        items.append(scheduled(f"d{s}", NUM_SHARED * BLOCK + suffix - 1, 1, shared + own))
    for c, (start, n) in enumerate(chunks):
        own = list(range(next_block, next_block + -(-(start + n) // BLOCK)))
        next_block += len(own)
        items.append(scheduled(f"p{c}", start, n, own))
    return SchedulerOutput(items, num_batched_tokens=sum(i.num_new_tokens for i in items))


def plain(meta: AttentionMetadata) -> AttentionMetadata:
    return dataclasses.replace(meta, prefix_len=None, prefix_blocks=None, max_prefix_len=0, backend_cache={})


def attend(name: str, meta: AttentionMetadata, qkv, cache: torch.Tensor):
    kv = cache.clone()
    out = get_backend(name).forward(*qkv, kv[0], kv[1], meta, D**-0.5)
    return out, kv


def random_qkv(num_tokens: int, gen: torch.Generator):
    return tuple(torch.randn(num_tokens, h, D, generator=gen).to(DEVICE) for h in (HQ, HK, HK))


@pytest.mark.parametrize("chunks", [[], [(32, 9)], [(0, 20), (16, 1)]])
def test_cascade_decode_matches_plain_decode(chunks):
    """Same step, same inputs: the cascade metadata (shared-prefix kernel) and the plain metadata (paged
    decode kernel) give the same outputs and cache writes, and both match the torch backend."""
    gen = torch.Generator().manual_seed(len(chunks))
    out = shared_prefix_step(chunks)
    meta = build_inputs(out, BLOCK, torch.device(DEVICE), cascade=True).meta
    assert meta.use_cascade and meta.prefix_len.tolist() == [NUM_SHARED * BLOCK]
    assert meta.prefix_blocks.tolist() == list(range(2, 2 + NUM_SHARED))
    cache = torch.randn(2, 64, BLOCK, HK, D, generator=gen).to(DEVICE)
    qkv = random_qkv(out.num_batched_tokens, gen)
    with torch.inference_mode():
        cascade, kv_cascade = attend("triton", meta, qkv, cache)
        paged, kv_paged = attend("triton", plain(meta), qkv, cache)
        ref, kv_ref = attend("torch", plain(meta), qkv, cache)
    torch.testing.assert_close(kv_cascade, kv_paged)
    torch.testing.assert_close(kv_cascade, kv_ref)
    tol = rel_tol(torch.float32, DEVICE, uses_dot=True)
    nd = meta.num_decodes
    assert_rel_close(cascade[:nd], paged[:nd], tol)
    assert_rel_close(cascade[:nd], ref[:nd], tol)
    assert_rel_close(cascade, paged, tol)


def test_cascade_decode_with_graph_padding():
    """The cascade graph's layout: decode rows padded to the bucket with context-1 rows over stale (valid)
    block-table rows and no KV write, a prefix_blocks buffer sized for max_model_len whose entries past the
    prefix are stale, and split grids sized for max_model_len. Real rows still equal the plain step's;
    padding rows stay finite and write nothing."""
    gen = torch.Generator().manual_seed(7)
    step = shared_prefix_step([])
    meta = build_inputs(step, BLOCK, torch.device(DEVICE), cascade=True).meta
    nd, bucket, width, max_model_len = meta.num_decodes, 12, 64, 64 * BLOCK
    pad = bucket - nd
    tables = torch.zeros(bucket, width, dtype=torch.int32, device=DEVICE)
    tables[:nd, : meta.block_tables.shape[1]] = meta.block_tables
    tables[nd:, :4] = meta.block_tables[:pad, -4:]  # stale rows of an earlier step: valid block ids
    prefix_blocks = torch.full((width,), 40, dtype=torch.int32, device=DEVICE)  # stale: not this step's
    prefix_blocks[:NUM_SHARED] = meta.prefix_blocks
    ones = torch.ones(pad, dtype=torch.int32, device=DEVICE)
    padded = AttentionMetadata(
        slot_mapping=torch.cat([meta.slot_mapping, torch.full((pad,), -1, dtype=torch.int64, device=DEVICE)]),
        block_tables=tables, context_lens=torch.cat([meta.context_lens, ones]),
        cu_seqlens_q=torch.arange(bucket + 1, dtype=torch.int32, device=DEVICE), num_decodes=bucket,
        max_context_len=max_model_len, max_query_len=1, context_lens_list=[1] * bucket,
        query_lens_list=[1] * bucket, prefix_len=meta.prefix_len.clone(), prefix_blocks=prefix_blocks,
        max_prefix_len=max_model_len,
    )  # fmt: skip
    cache = torch.randn(2, 64, BLOCK, HK, D, generator=gen).to(DEVICE)
    qkv = random_qkv(bucket, gen)
    with torch.inference_mode():
        graphed, kv_graphed = attend("triton", padded, qkv, cache)
        paged, kv_paged = attend("triton", plain(meta), tuple(t[:nd] for t in qkv), cache)
    torch.testing.assert_close(kv_graphed, kv_paged)  # padding rows wrote nothing
    assert_rel_close(graphed[:nd], paged, rel_tol(torch.float32, DEVICE, uses_dot=True))
    assert torch.isfinite(graphed[nd:]).all()


@pytest.mark.parametrize("chunks", [[(32, 9)]])
def test_fp8_cache_triton_backend_matches_torch_backend(chunks, monkeypatch):
    """An FP8 KV cache with layer scales (k 0.05, v 0.02): the Triton backend's KV write is bit-equal to the
    torch backend's, and its cascade and plain decode and its prefill outputs match the torch backend's (prefill
    through the paged kernel: with RAGGED_PREFILL on, an FP8 cache still reads the chunk back quantised)."""
    from kernels.fp8 import quantize_fp8_ref

    calls = record_prefill_kernels(monkeypatch, True)
    gen = torch.Generator().manual_seed(5)
    out = shared_prefix_step(chunks)
    meta = build_inputs(out, BLOCK, torch.device(DEVICE), cascade=True).meta
    cache = torch.stack([quantize_fp8_ref(torch.randn(64, BLOCK, HK, D, generator=gen) * 4, s) for s in (0.05, 0.02)])
    cache = cache.to(DEVICE)
    qkv = random_qkv(out.num_batched_tokens, gen)
    results = {}
    with torch.inference_mode():
        for name, m in (("cascade", meta), ("triton", plain(meta)), ("torch", plain(meta))):
            kv = cache.clone()
            backend = get_backend("torch" if name == "torch" else "triton")
            results[name] = (backend.forward(*qkv, kv[0], kv[1], m, D**-0.5, 0.05, 0.02), kv)
    ref, kv_ref = results["torch"]
    for name in ("cascade", "triton"):
        got, kv = results[name]
        assert torch.equal(kv.view(torch.uint8), kv_ref.view(torch.uint8)), name
        assert_rel_close(got, ref, rel_tol(torch.float32, DEVICE, uses_dot=True))
    assert calls and set(calls) == {"paged_prefill_attention"}
