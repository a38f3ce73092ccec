"""Which model to run and how to load it."""

from __future__ import annotations

from dataclasses import dataclass

from shared_engine.config.validation import check_choice, check_range

DTYPES = {"auto", "float32", "bfloat16", "float16"}
LOAD_FORMATS = {"auto", "safetensors", "dummy"}
QUANTIZATIONS = {None, "fp8"}


@dataclass(frozen=True)
class ModelConfig:
    """Model identity and loading.

    `model` is a local Hugging Face directory, a preset name (`llama-3.1-8b`, `llama-3.1-70b`, `llama-3.2-1b`
    (the 8b's draft model: same tokenizer), `qwen3-0.6b`, `qwen2.5-0.5b`, `smollm2-135m`; real shapes, only with
    `load_format="dummy"`) or None for the embedded default model (SmolLM2-135M-Instruct). `max_model_len`
    (tokens, prompt + output) None means the model's `max_position_embeddings`. `dtype="auto"` is float32 on
    the CPU and bfloat16 on CUDA. `disable_cascade_attn` (vLLM's name) turns off cascade decode attention,
    which on CUDA reads the block prefix that a step's decodes share (a prefix-cached system prompt) once for
    the whole batch; the CPU path never uses it.
    `quantization="fp8"` (vLLM's `--quantization fp8`, online): the decoder's linear layers are quantised at
    load to float8_e4m3fn with one scale per output channel, activations per token at run time, the matmul
    on FP8 tensor cores (`torch._scaled_mm`; CUDA, compute capability >= 8.9); embeddings, norms and the
    LM head stay in `dtype`. The CPU path refuses it (model_executor/layers/fp8_linear.py).
    """

    model: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    max_model_len: int | None = None
    load_format: str = "auto"
    seed: int = 0
    served_model_name: str | None = None
    max_logprobs: int = 20
    disable_cascade_attn: bool = False
    quantization: str | None = None

    def __post_init__(self) -> None:
        check_choice("dtype", self.dtype, DTYPES)
        check_choice("load_format", self.load_format, LOAD_FORMATS)
        check_range("max_model_len", self.max_model_len, 1, allow_none=True)
        check_range("seed", self.seed, 0)
        check_range("max_logprobs", self.max_logprobs, 0, 1024)
        if self.quantization not in QUANTIZATIONS:
            raise ValueError(f"quantization must be one of ['fp8'] or None, got {self.quantization!r}")

    def resolved_dtype(self, device_type: str) -> str:
        """`dtype` with "auto" resolved for a device type ("cpu": float32, else bfloat16)."""
        if self.dtype != "auto":
            return self.dtype
        return "float32" if device_type == "cpu" else "bfloat16"
