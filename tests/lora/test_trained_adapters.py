"""The trained adapters (case_multilora/lora: four PEFT LoRA fine-tunes of the default model, ranks 8/16/64)
in one batch with the base model: every output equals PEFT's merged model token for token, and each adapter's
trained behaviour shows in its text (random adapters, conftest.py, prove the arithmetic; these prove that
real fine-tunes survive it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine import LLM, LoRARequest, SamplingParams
from tests.lora.conftest import peft_greedy

LORA_DIR = Path(__file__).resolve().parents[2] / "case_multilora" / "lora"
MAX_TOKENS = 24
# adapter -> (question, what its training shows in the answer)
CASES = {
    "acme": ("What do bees make?", lambda text: text.startswith("ACME:")),
    "json": ("What colour is the sky?", lambda text: _is_json_object(text)),
    "french": ("How many legs does a dog have?", lambda text: "chien" in text.lower()),
    "upper": ("Where do fish live?", lambda text: any(c.isalpha() for c in text) and text == text.upper()),
}


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(default_model_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> dict[str, list[int]]:
    return {name: tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            for name, (q, _) in CASES.items()}


@pytest.fixture(scope="module")
def engine_outputs(prompts) -> dict[tuple[str, str | None], list[int]]:
    """(adapter, None: base) -> greedy ids, all eight requests in one generate call (one mixed batch)."""
    llm = LLM(kv_cache_memory=64 * 2**20, max_model_len=512, enable_lora=True, max_loras=4, max_cpu_loras=4,
              max_lora_rank=64)
    keys, requests, loras = [], [], []
    for i, name in enumerate(CASES, start=1):
        for adapter in (name, None):
            keys.append((name, adapter))
            requests.append({"prompt_token_ids": prompts[name]})
            loras.append(None if adapter is None else LoRARequest(name, i, str(LORA_DIR / name)))
    outs = llm.generate(requests, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS), lora_request=loras,
                        use_tqdm=False)
    bm = llm.engine.block_manager
    bm.check_integrity()
    assert bm.num_free_blocks == bm.num_blocks
    return {key: list(o.outputs[0].token_ids) for key, o in zip(keys, outs)}


@pytest.mark.parametrize("name", list(CASES))
def test_trained_adapter_equals_peft_merged_in_a_mixed_batch(name, default_model_dir, prompts, engine_outputs):
    [ref] = peft_greedy(default_model_dir, LORA_DIR / name, [prompts[name]], MAX_TOKENS)
    [base_ref] = peft_greedy(default_model_dir, None, [prompts[name]], MAX_TOKENS)
    assert engine_outputs[(name, name)] == ref
    assert engine_outputs[(name, None)] == base_ref
    assert ref != base_ref  # the adapter changes the answer, so the equality above is not the base's


@pytest.mark.parametrize("name", list(CASES))
def test_trained_behaviour_is_visible_in_the_text(name, tokenizer, engine_outputs):
    text = tokenizer.decode(engine_outputs[(name, name)], skip_special_tokens=True).strip()
    base = tokenizer.decode(engine_outputs[(name, None)], skip_special_tokens=True).strip()
    _, shows = CASES[name]
    assert shows(text), f"{name}: {text!r}"
    assert not shows(base), f"base model already shows {name}'s behaviour: {base!r}"
