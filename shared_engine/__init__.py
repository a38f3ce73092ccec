"""shared_engine: a paged-attention LLM inference engine.

`from shared_engine import LLM, SamplingParams` for offline generation; `python -m shared_engine serve` for
the OpenAI-compatible server. Importing this package loads no model and needs no server packages.
"""

from shared_engine.config import EngineConfig
from shared_engine.sampling_params import SamplingParams

__version__ = "0.1.0"


def __getattr__(name: str):
    # LLM pulls in torch and transformers; load it on first use so `import shared_engine` stays cheap.
    if name == "LLM":
        from shared_engine.entrypoints.llm import LLM

        return LLM
    if name == "LoRARequest":
        from shared_engine.lora.lora_request import LoRARequest

        return LoRARequest
    if name in ("RequestOutput", "CompletionOutput"):
        from shared_engine import outputs

        return getattr(outputs, name)
    raise AttributeError(name)


__all__ = ["LLM", "LoRARequest", "SamplingParams", "EngineConfig", "__version__"]
