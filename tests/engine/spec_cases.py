"""Prompts and request mixes shared by the speculative decoding tests (default model, greedy)."""

from __future__ import annotations

from pathlib import Path

from shared_engine import SamplingParams

REPO = Path(__file__).resolve().parents[2]

NUMBERS = "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1,"  # greedy continues " 2, 3, 4, 5, 1, ..."

REPETITIVE = [
    NUMBERS,
    "the cat sat on the mat. the cat sat on the mat. the cat sat on the mat. the cat",
    "A B C D E F G A B C D E F G A B C D E F G A B",
    "red green blue, red green blue, red green blue, red green",
    "Monday Tuesday Wednesday Monday Tuesday Wednesday Monday",
    "ping pong ping pong ping pong ping pong ping",
]
PROSE = [
    "Once upon a time, in a small village by the sea,",
    "The history of the Roman empire begins with",
    "Explain how photosynthesis works in simple terms.",
    "Write a short letter to a friend about your holiday.",
    "The most important thing about learning to cook is",
    "Here are three tips for better sleep:",
    "A good teacher is someone who",
]
_CODE_FILES = ["shared_engine/core/block_hash.py", "shared_engine/sampling/penalties.py",
               "shared_engine/config/validation.py", "kernels/silu_and_mul.py", "shared_engine/outputs.py",
               "shared_engine/config/device_config.py", "shared_engine/engine/kv_capacity.py"]


def code_prompts(chars: int = 400) -> list[str]:
    """A piece of one of this repository's files, then a request to repeat it (code agents re-emit code)."""
    prompts = []
    for path in _CODE_FILES:
        text = (REPO / path).read_text()[:chars]
        prompts.append(f"{text}\n# The same code again, unchanged:\n{text[:120]}")
    return prompts


def prompts() -> list[str]:
    return REPETITIVE + PROSE + code_prompts()


def greedy(max_tokens: int = 16, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def mixed_batch() -> list[tuple[str, str, SamplingParams]]:
    """(case, prompt, params): every prompt plain, then penalties, min_tokens, n=2, logprobs, the max_tokens
    sweep 1..18 and stops that fall inside an accepted run of NUMBERS (tokens "4", ",", " ", "5")."""
    cases = [(f"plain{i}", p, greedy()) for i, p in enumerate(prompts())]
    for i, p in enumerate(REPETITIVE[:2]):
        cases += [(f"freq-2_{i}", p, greedy(frequency_penalty=-2.0)),
                  (f"freq+2_{i}", p, greedy(frequency_penalty=2.0)),
                  (f"presence_{i}", p, greedy(presence_penalty=1.5)),
                  (f"repetition_{i}", p, greedy(repetition_penalty=1.3))]
    cases += [("min_tokens", "Say hi.", greedy(16, min_tokens=12)), ("n2", REPETITIVE[1], greedy(n=2)),
              ("logprobs", NUMBERS, greedy(logprobs=2)), ("logprobs_prose", PROSE[0], greedy(logprobs=2))]
    cases += [(f"max{m}", NUMBERS, greedy(m)) for m in range(1, 19)]
    cases += [("stop_str", NUMBERS, greedy(stop=["4,"])), ("stop_str_kept", NUMBERS, greedy(stop=["4,"],
              include_stop_str_in_output=True)), ("stop_id", NUMBERS, greedy(stop_token_ids=[37]))]
    return cases


def write_tiny_llama(path: Path, weak_second_layer: float = 1.0):
    """A 2-layer Llama of vocabulary 96 with peaked random weights (initializer_range 0.3, so its next-token
    distributions are far from uniform), saved as a model directory at `path`; returns the transformers model
    (fp32, eval) for exact reference distributions. `weak_second_layer` scales the second layer's output
    projections (below 1 its first layer alone is a near, not equal, draft). Milliseconds per forward on the
    CPU, where the default model takes tens: the sampling tests draw thousands of samples."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(weak_second_layer)
        model.model.layers[1].mlp.down_proj.weight.mul_(weak_second_layer)
    model.save_pretrained(path, safe_serialization=True)
    return model.eval()
