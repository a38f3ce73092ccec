"""The engine's configuration: one tree of frozen dataclasses (see `engine_config.py`)."""

from shared_engine.config.cache_config import CacheConfig
from shared_engine.config.device_config import DeviceConfig
from shared_engine.config.engine_config import EngineConfig
from shared_engine.config.lora_config import LoRAConfig
from shared_engine.config.model_config import ModelConfig
from shared_engine.config.parallel_config import ParallelConfig
from shared_engine.config.scheduler_config import SchedulerConfig

__all__ = ["CacheConfig", "DeviceConfig", "EngineConfig", "LoRAConfig", "ModelConfig", "ParallelConfig",
           "SchedulerConfig"]
