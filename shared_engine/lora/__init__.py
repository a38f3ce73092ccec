"""Multi-LoRA serving: PEFT adapters (loading and validation), the API side's registry of named adapters,
and the model runner's CPU cache and GPU slots. `LoRARequest` travels with every request that uses one."""

from shared_engine.lora.errors import LoRAValidationError
from shared_engine.lora.lora_request import LoRARequest

__all__ = ["LoRARequest", "LoRAValidationError"]
