"""`SamplingParams`: how one request's tokens are chosen and when it stops (vLLM's field names)."""

from __future__ import annotations

from dataclasses import dataclass, field

_GREEDY_EPS = 1e-5
MAX_LOGIT_BIAS = 100.0  # OpenAI's range for logit_bias values: [-100, 100]


@dataclass(frozen=True)
class StructuredOutputsParams:
    """A constraint on the output text (vLLM's name): `json` a JSON schema (dict or its JSON text),
    `json_object` any JSON object, `grammar` a Lark grammar (llguidance's dialect, which may embed
    `%json {...}`). Exactly one is set. Compiled and enforced by `sampling/grammar.py`."""

    json: dict | str | None = None
    json_object: bool = False
    grammar: str | None = None

    def __post_init__(self) -> None:
        count = (self.json is not None) + bool(self.json_object) + (self.grammar is not None)
        _check(count == 1, f"structured_outputs needs exactly one of json, json_object, grammar; got {count}")


@dataclass
class SamplingParams:
    """Per-request sampling settings.

    `temperature` 0 is greedy. `top_k` 0 or -1 (or None) disables top-k; `top_p` is in (0, 1];
    `min_p` in [0, 1]. `presence_penalty` / `frequency_penalty` (in [-2, 2]) count generated tokens only;
    `repetition_penalty` (> 0, 1 = off) counts prompt and generated tokens, as in CTRL
    (Keskar et al. 2019, https://arxiv.org/abs/1909.05858). `max_tokens` None means up to the context
    limit. `seed` gives each of the `n` sequences its own reproducible random stream. `logprobs` is the
    number of top log-probabilities returned per generated token (0 = only the sampled token's,
    None = none); `prompt_logprobs` likewise for prompt tokens. `min_tokens`: EOS and `stop_token_ids`
    are masked (logit -inf) until that many tokens were generated (as vLLM and transformers'
    `min_new_tokens`). `logit_bias` maps token ids to values in [-100, 100] added to their logits
    (OpenAI's semantics). `structured_outputs` constrains the text (JSON schema, JSON object, grammar).
    Logits processing (bias, masks, grammar, penalties) is in `sampling/logits_processors.py`.

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
    logit_bias: dict[int, float] | None = None
    structured_outputs: StructuredOutputsParams | None = None
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.logit_bias is not None:
            self.logit_bias = {int(k): float(v) for k, v in self.logit_bias.items()} or None
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
        _check(not (self.min_tokens and self.structured_outputs is not None),
               "min_tokens cannot be combined with structured outputs (response_format, tool_choice): a "
               "complete JSON value allows only EOS")
        for token_id, bias in (self.logit_bias or {}).items():
            _check(token_id >= 0, f"logit_bias: token ids must be non-negative, got {token_id}")
            _check(-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS,
                   f"logit_bias: values must be in [-100, 100], got {bias} for token {token_id}")

    @property
    def greedy(self) -> bool:
        """True when the next token is the argmax (temperature 0)."""
        return self.temperature < _GREEDY_EPS

    @property
    def needs_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1.0

    @property
    def needs_output_history(self) -> bool:
        """Whether processing a step's logits reads the values of the tokens generated so far (penalties,
        a grammar's state), so that with async scheduling the step in flight must be collected first."""
        return self.needs_penalties or self.structured_outputs is not None

    @property
    def needs_logits_processing(self) -> bool:
        """Whether `LogitsProcessors` changes this request's logits at all (the fast path skips it)."""
        return (self.needs_output_history or self.min_tokens > 0 or bool(self.logit_bias))

    def clone(self, **changes) -> SamplingParams:
        from dataclasses import replace

        return replace(self, **changes)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
