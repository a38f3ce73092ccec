"""`EngineSnapshot`: the engine's gauges and counters at one moment, as plain values.

What `/metrics` and the overload check read. An engine in this process is read directly
(`EngineSnapshot.of(engine)`); an engine core in its own process sends one with every step's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSnapshot:
    num_running: int = 0
    num_waiting: int = 0  # in the scheduler's waiting queue (requests still in transit are not counted)
    kv_cache_usage: float = 0.0  # fraction of KV blocks in use, 0..1
    num_preemptions_total: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    prefix_cache_queries_total: int = 0  # tokens
    prefix_cache_hits_total: int = 0  # tokens (the host tier's included)
    # KV offload (kv_offload_size > 0): tokens looked up in the host tier (GPU misses) and found there, and
    # blocks copied GPU -> host (offloaded) and host -> GPU (restored)
    external_prefix_cache_queries_total: int = 0
    external_prefix_cache_hits_total: int = 0
    kv_offload_num_offloaded_blocks_total: int = 0
    kv_offload_num_restored_blocks_total: int = 0
    spec_decode_num_drafts_total: int = 0
    spec_decode_num_draft_tokens_total: int = 0
    spec_decode_num_accepted_tokens_total: int = 0
    spec_decode_num_accepted_tokens_per_pos_total: tuple[int, ...] = ()  # [k]: accepted at draft position j
    # multi-LoRA (max_loras 0: LoRA off): adapter names of running and waiting requests, and in GPU slots
    max_loras: int = 0
    running_lora_adapters: tuple[str, ...] = ()
    waiting_lora_adapters: tuple[str, ...] = ()
    resident_lora_adapters: tuple[str, ...] = ()

    @classmethod
    def of(cls, engine) -> EngineSnapshot:
        stats, scheduler = engine.stats, engine.scheduler
        spec = stats.spec
        return cls(
            num_running=scheduler.num_running,
            num_waiting=scheduler.num_waiting,
            kv_cache_usage=engine.block_manager.usage,
            num_preemptions_total=scheduler.num_preemptions_total,
            prompt_tokens_total=stats.num_prompt_tokens_total,
            generation_tokens_total=stats.num_generation_tokens_total,
            prefix_cache_queries_total=stats.prefix_cache_queries_total,
            prefix_cache_hits_total=stats.prefix_cache_hits_total,
            external_prefix_cache_queries_total=scheduler.host_prefix_cache_queries,
            external_prefix_cache_hits_total=scheduler.host_prefix_cache_hits,
            kv_offload_num_offloaded_blocks_total=engine.block_manager.num_offloaded_blocks_total,
            kv_offload_num_restored_blocks_total=engine.block_manager.num_restored_blocks_total,
            **({} if spec is None else dict(
                spec_decode_num_drafts_total=spec.num_drafts_total,
                spec_decode_num_draft_tokens_total=spec.num_draft_tokens_total,
                spec_decode_num_accepted_tokens_total=spec.num_accepted_tokens_total,
                spec_decode_num_accepted_tokens_per_pos_total=tuple(spec.accepted_per_pos_total))),
            **_lora_fields(engine),
        )

    @property
    def tokens_total(self) -> int:
        return self.prompt_tokens_total + self.generation_tokens_total


def _lora_fields(engine) -> dict:
    manager = getattr(engine.runner, "lora", None)  # a tensor-parallel executor has none
    if manager is None:
        return {}
    scheduler = engine.scheduler

    def names(requests) -> tuple[str, ...]:
        return tuple(sorted({r.lora_name for r in requests if r.lora_name is not None}))

    return {"max_loras": manager.config.max_loras, "running_lora_adapters": names(scheduler.running),
            "waiting_lora_adapters": names(scheduler.waiting), "resident_lora_adapters": manager.slot_names}
