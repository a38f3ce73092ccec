"""`SamplingParams`: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    `temperature` 0 is greedy. `top_k` 0 or -1 (or None) disables top-k; `top_p` is in (0, 1];
    `min_p` in [0, 1]. `presence_penalty` / `frequency_penalty` (in [-2, 2]) count generated tokens only;
    `repetition_penalty` (> 0, 1 = off) counts prompt and generated tokens, as in CTRL
    (Keskar et al. 2019, https://arxiv.org/abs/1909.05858). `max_tokens` None means up to the context
    limit. `seed` gives each of the `n` sequences its own reproducible random stream. `logprobs` is the
    number of top log-probabilities returned per generated token (0 = only the sampled token's,
    None = none); `prompt_logprobs` likewise for prompt tokens.

    Raises:
        ValueError: from `validate()` (called on construction) for values outside these ranges.
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    max_tokens: int | None = 16
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k is None or self.top_k == 0:
            self.top_k = -1
        self.validate()

    def validate(self, max_logprobs: int = 20) -> None:
        """Raise `ValueError` naming the field and its allowed range."""
        _check(isinstance(self.n, int) and self.n >= 1, f"n must be at least 1, got {self.n}")
        _check(self.temperature >= 0, f"temperature must be non-negative, got {self.temperature}")
        _check(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k == -1 or self.top_k >= 1, f"top_k must be -1 (off), 0 (off) or >= 1, got {self.top_k}")
        _check(0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(-2 <= value <= 2, f"{name} must be in [-2, 2], got {value}")
        _check(self.repetition_penalty > 0, f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        _check(
            self.max_tokens is None or self.max_tokens >= 1,
            f"max_tokens must be at least 1, got {self.max_tokens}",
        )
        _check(self.min_tokens >= 0, f"min_tokens must be non-negative, got {self.min_tokens}")
        _check(
            self.max_tokens is None or self.min_tokens <= self.max_tokens,
            f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens}, max_tokens={self.max_tokens}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(
                value is None or 0 <= value <= max_logprobs,
                f"{name} must be between 0 and {max_logprobs}, got {value}",
            )
        _check(all(s for s in self.stop), "stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature < _GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1.0

    def clone(self, **changes) -> SamplingParams:
        from dataclasses import replace

        return replace(self, **changes)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
