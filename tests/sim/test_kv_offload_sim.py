"""The capacity model accounts KV offload (`kv_offload_size`): the engine's own block manager keeps evicted
prefix blocks in the host tier, restored hits count as cached prompt tokens, and every copied block adds
its bytes over the host link to its step (on a GPU at the H200's measured 37.3 GB/s out, 42.4 GB/s back)."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.sim import Simulator, WorkloadSpec, load_hardware
from shared_engine.sim.model_shape import resolve_arch
from shared_engine.sim.simulator import GPU_OFFLOAD_BANDWIDTH, GPU_RESTORE_BANDWIDTH

SESSIONS = {"name": "agent-sessions", "seed": 3, "num_requests": 240, "arrival": {"process": "poisson", "rate": 4},
            "prompt_len": {"dist": "uniform", "min": 200, "max": 400},
            "output_len": {"dist": "uniform", "min": 16, "max": 32},
            "prefix": {"system_prompt_len": 512, "turns_per_session": 6, "think_time_s": 4}}


def run(kv_offload_size: float) -> tuple[dict, Simulator]:
    _, arch = resolve_arch("llama-3.1-8b")
    config = EngineConfig.from_flat(max_model_len=8192, max_num_seqs=32, max_num_batched_tokens=2048,
                                    num_gpu_blocks_override=600, kv_offload_size=kv_offload_size)
    sim = Simulator(config, arch, load_hardware("H200"))
    return sim.run_replicas(WorkloadSpec.from_dict(SESSIONS), 1).summary(), sim


def test_host_tier_serves_evicted_prefixes_at_the_link_cost():
    base, _ = run(0.0)
    offload, sim = run(4.0)  # 4 GiB of 2 MiB blocks (bf16): 2,048 host blocks
    assert sim.num_host_blocks == 2048 and sim.offload_s_per_block == pytest.approx(2 * 1024**2 / 37.3e9)
    assert sim.restore_s_per_block == pytest.approx(2 * 1024**2 / 42.4e9)
    assert base["host_prefix_cache_hits"] == base["num_offloaded_blocks"] == base["host_copy_s"] == 0
    assert offload["host_prefix_cache_hits"] == 16 * offload["num_restored_blocks"] > 0
    assert offload["prompt_tokens_cached_share"] > base["prompt_tokens_cached_share"] + 0.05
    expected = 2 * 1024**2 * (offload["num_offloaded_blocks"] / GPU_OFFLOAD_BANDWIDTH
                              + offload["num_restored_blocks"] / GPU_RESTORE_BANDWIDTH)
    assert offload["host_copy_s"] == pytest.approx(expected)
    assert offload["completed"] == base["completed"] == 240
