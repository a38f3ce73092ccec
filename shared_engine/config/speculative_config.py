"""`SpeculativeConfig`: speculative decoding settings, given as vLLM's `--speculative-config` JSON.

The CLI / YAML / Python name is `speculative_config`; its value is a JSON object (a string on the command
line, a mapping in YAML or Python) with vLLM's keys:

- `method`: a proposer registered in `shared_engine/spec_decode/` (`ngram`, `suffix`, `draft_model`, and the
  benchmark-only `replay`);
- `num_speculative_tokens` (k): most draft tokens per request per step, 1-16;
- `prompt_lookup_min` / `prompt_lookup_max` (ngram): the n-gram lengths tried, longest first;
- `model` (draft_model): a model directory or preset with the target's tokenizer;
- `suffix_decoding_max_tree_depth`, `suffix_decoding_max_cached_requests`, `suffix_decoding_max_spec_factor`,
  `suffix_decoding_min_token_prob` (suffix; vLLM's names and defaults);
- `policy`: `auto` (speculate per step only where the expected tokens per second beat plain decoding,
  `spec_decode/policy.py`) or `always` (k fixed, for experiments);
- `acceptance_rate` (replay only): the benchmark proposer's set acceptance rate.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

from shared_engine.config.validation import check_choice, check_range

POLICIES = {"auto", "always"}


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str = "ngram"
    num_speculative_tokens: int = 3
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 1000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    policy: str = "auto"
    acceptance_rate: float = 0.8

    def __post_init__(self) -> None:
        from shared_engine.spec_decode.registry import proposer_names  # torch-free

        check_choice("speculative_config.method", self.method, proposer_names())
        check_range("speculative_config.num_speculative_tokens", self.num_speculative_tokens, 1, 16)
        check_range("speculative_config.prompt_lookup_min", self.prompt_lookup_min, 1)
        check_range("speculative_config.prompt_lookup_max", self.prompt_lookup_max, self.prompt_lookup_min)
        check_range("speculative_config.suffix_decoding_max_tree_depth", self.suffix_decoding_max_tree_depth, 1)
        check_range("speculative_config.suffix_decoding_max_cached_requests",
                    self.suffix_decoding_max_cached_requests, 0)
        check_range("speculative_config.suffix_decoding_max_spec_factor", self.suffix_decoding_max_spec_factor,
                    0, low_open=True)
        check_range("speculative_config.suffix_decoding_min_token_prob", self.suffix_decoding_min_token_prob, 0, 1)
        check_choice("speculative_config.policy", self.policy, POLICIES)
        check_range("speculative_config.acceptance_rate", self.acceptance_rate, 0, 1)
        if self.method == "draft_model" and not self.model:
            raise ValueError("speculative_config.model must name the draft model for method 'draft_model'")

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    @classmethod
    def parse(cls, value: SpeculativeConfig | str | dict | None) -> SpeculativeConfig | None:
        """From the flag's JSON string, a mapping, an instance or None (off).

        Raises:
            ValueError: not JSON, not an object, an unknown key, or a value out of range.
        """
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"speculative_config is not valid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a JSON object, got {value!r}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; known: {sorted(known)}")
        return cls(**value)


@dataclass(frozen=True)
class SpecDecodeSection:
    """The config tree's section for `speculative_config` (None: speculation off)."""

    speculative_config: SpeculativeConfig | None = field(default=None)

    def __post_init__(self) -> None:
        object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
