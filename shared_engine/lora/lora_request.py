"""`LoRARequest`: which adapter a request runs on (vLLM's name and fields, plus a content version).

Plain data, no torch: it travels from the API process to the engine core with the request and is read by
the scheduler (adapter identity for the per-step `max_loras` limit) and the block manager (prefix-cache
keys), neither of which imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """`lora_name`: the name clients send as `model`. `lora_int_id`: unique per registration (>= 1), so a
    reload under the same name is a new adapter to the CPU cache and the GPU slots. `lora_path`: the PEFT
    directory. `version`: digest of the adapter's files at registration (`peft_adapter.content_digest`);
    the engine refuses the adapter if the files changed since.

    `cache_key` keys the CPU cache and the GPU slots and joins the prefix-cache hash: `"<lora_int_id>:<version>"`,
    so two adapters (even under one name, one after the other) never share weights or KV blocks, and neither
    shares with the base model. Without a version (the offline API: the caller picks ids) it is
    `"<lora_int_id>:@<lora_path>"`: one id given to two adapter directories is two adapters, not the first
    one's cached weights and KV served for the second (the files under one path are not re-read: load an
    adapter whose files changed under a new id).
    """

    lora_name: str
    lora_int_id: int
    lora_path: str
    version: str = ""

    def __post_init__(self) -> None:
        if not self.lora_name:
            raise ValueError("lora_name must be a non-empty string")
        if self.lora_int_id < 1:
            raise ValueError(f"lora_int_id must be >= 1, got {self.lora_int_id}")

    @property
    def cache_key(self) -> str:
        return f"{self.lora_int_id}:{self.version}" if self.version else f"{self.lora_int_id}:@{self.lora_path}"
