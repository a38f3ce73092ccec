"""`EngineConfig`: the root of the configuration tree, built once from flat settings.

One name per setting, shared by the CLI (`--max-num-seqs`), YAML (`max_num_seqs`) and Python
(`LLM(max_num_seqs=...)`); `EngineConfig.from_flat()` routes each flat name to its sub-config.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from shared_engine.config.cache_config import CacheConfig
from shared_engine.config.device_config import DeviceConfig
from shared_engine.config.lora_config import LoRAConfig
from shared_engine.config.model_config import ModelConfig
from shared_engine.config.parallel_config import ParallelConfig
from shared_engine.config.scheduler_config import SchedulerConfig
from shared_engine.config.speculative_config import SpecDecodeSection, SpeculativeConfig

_SECTIONS = {"model": ModelConfig, "cache": CacheConfig, "scheduler": SchedulerConfig, "device": DeviceConfig,
             "lora": LoRAConfig, "parallel": ParallelConfig, "speculative": SpecDecodeSection}


@dataclass(frozen=True)
class EngineConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    speculative: SpecDecodeSection = field(default_factory=SpecDecodeSection)

    @property
    def speculative_config(self) -> SpeculativeConfig | None:
        """Speculative decoding settings, None when off."""
        return self.speculative.speculative_config

    @classmethod
    def field_names(cls) -> dict[str, str]:
        """Every flat setting name mapped to the section that owns it."""
        return {f.name: section for section, klass in _SECTIONS.items() for f in dataclasses.fields(klass)}

    @classmethod
    def from_flat(cls, **settings: Any) -> EngineConfig:
        """Build the tree from flat names (`max_num_seqs=8`, ...).

        Raises:
            ValueError: an unknown setting name, or a value outside its allowed range.
        """
        owners = cls.field_names()
        unknown = sorted(set(settings) - set(owners))
        if unknown:
            raise ValueError(f"unknown engine setting(s) {unknown}; known settings: {sorted(owners)}")
        per_section: dict[str, dict[str, Any]] = {name: {} for name in _SECTIONS}
        for name, value in settings.items():
            per_section[owners[name]][name] = value
        return cls(**{name: _SECTIONS[name](**values) for name, values in per_section.items()})

    def to_flat(self) -> dict[str, Any]:
        """The inverse of `from_flat` (for results files and logs)."""
        flat: dict[str, Any] = {}
        for section in _SECTIONS:
            flat.update(dataclasses.asdict(getattr(self, section)))
        return flat

    def with_resolved_defaults(self) -> EngineConfig:
        """Device-dependent defaults made concrete: `async_scheduling` None becomes True on CUDA (where the
        device would otherwise wait for the host between steps) and False on the CPU (nothing to overlap)."""
        if self.scheduler.async_scheduling is not None:
            return self
        on = self.device.resolve() == "cuda"
        return dataclasses.replace(self, scheduler=dataclasses.replace(self.scheduler, async_scheduling=on))

    def with_model_len(self, max_model_len: int) -> EngineConfig:
        """A copy with `max_model_len` resolved (from the model's config when the user gave none)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, max_model_len=max_model_len))
