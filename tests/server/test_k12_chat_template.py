"""K12 (handed.md H22, H23): the tokenizer's own chat template, system blocks, end of turn."""

from __future__ import annotations

import json

import pytest

CASES = {
    "a": [{"role": "user", "content": "Hi"}],
    "b": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"}],
    "c": [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi"},
          {"role": "assistant", "content": "Hello!"}, {"role": "system", "content": "Now be formal"},
          {"role": "user", "content": "How are you?"}],
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_h22_rendered_prompt_is_the_tokenizers_template(server, tokenizer, case):
    messages = CASES[case]
    expected_text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    expected = tokenizer.encode(expected_text, add_special_tokens=False)
    rendered = server.post("/tokenize", {"messages": messages}).json()
    assert rendered["tokens"] == expected
    r = server.post("/v1/chat/completions", {"messages": messages, "max_tokens": 5})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == len(expected)
    text = tokenizer.decode(expected)
    if case == "a":
        assert text.count("<|im_start|>system") == 1  # the template's default system block, once
    if case == "b":
        assert text.count("<|im_start|>system") == 1 and "Be brief" in text and "SmolLM" not in text


def test_h23_stops_at_end_of_turn(server, default_model_dir, tokenizer):
    body = {"messages": [{"role": "user", "content": "Who are you?"}], "temperature": 0, "max_tokens": 200}
    r = server.post("/v1/chat/completions", body).json()
    choice = r["choices"][0]
    assert choice["finish_reason"] == "stop" and r["usage"]["completion_tokens"] < 200
    assert "<|im_start|>" not in choice["message"]["content"] and "<|im_end|>" not in choice["message"]["content"]
    frames = server.stream("/v1/chat/completions", {**body, "stream": True})
    assert "".join(c["delta"].get("content") or "" for f in frames for c in f["choices"]) == \
        choice["message"]["content"]
    # Stop ids are the union of the tokenizer's and generation_config's EOS ids.
    from shared_engine.engine.llm_engine import LLMEngine
    from shared_engine.model_loader.model_source import resolve_model

    generation = json.loads((default_model_dir / "generation_config.json").read_text()).get("eos_token_id")
    generation = set(generation if isinstance(generation, list) else [generation])
    engine = object.__new__(LLMEngine)
    engine.source, engine.tokenizer = resolve_model(None), tokenizer
    assert engine._eos_ids() == generation | {tokenizer.eos_token_id}
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in engine._eos_ids()
