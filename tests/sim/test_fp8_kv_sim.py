"""The capacity model prices `kv_cache_dtype="fp8"` as the engine does: 1 byte per KV element, so an H200's
pool holds twice the bf16 blocks and a step reads half the KV bytes (FP8 weights are not modelled)."""

from __future__ import annotations

from shared_engine.config import EngineConfig
from shared_engine.sim import Simulator, load_hardware
from shared_engine.sim.model_shape import resolve_arch


def sim(**kw) -> Simulator:
    _, arch = resolve_arch("llama-3.1-8b")
    return Simulator(EngineConfig.from_flat(max_model_len=2048, **kw), arch, load_hardware("H200"))


def test_fp8_pool_holds_twice_the_blocks_and_steps_read_half_the_kv():
    bf16, fp8 = sim(), sim(kv_cache_dtype="fp8")
    assert bf16.step_model.shape.kv_bytes_per_token == 2 * fp8.step_model.shape.kv_bytes_per_token == 131072
    assert fp8.num_blocks in (2 * bf16.num_blocks, 2 * bf16.num_blocks + 1)  # the same free bytes
    assert fp8.step_model.shape.weight_bytes == bf16.step_model.shape.weight_bytes
    fixed = sim(num_gpu_blocks_override=500, kv_cache_dtype="fp8")
    assert fixed.num_blocks == 500  # an explicit pool size stays as given
