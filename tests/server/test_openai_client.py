"""The unmodified `openai` client against the server: completions and chat, streamed and not."""

from __future__ import annotations

import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_completion(client, server):
    r = client.completions.create(model=server.model, prompt="The capital of France is", max_tokens=8,
                                  temperature=0)
    assert r.model == server.model and r.object == "text_completion"
    assert r.choices[0].text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_completion_stream(client, server):
    full = client.completions.create(model=server.model, prompt="The capital of France is", max_tokens=8,
                                     temperature=0)
    chunks = list(client.completions.create(model=server.model, prompt="The capital of France is",
                                            max_tokens=8, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text
    assert chunks[-1].choices[0].finish_reason == full.choices[0].finish_reason


def test_chat(client, server):
    r = client.chat.completions.create(
        model=server.model, temperature=0, max_tokens=20,
        messages=[{"role": "user", "content": "What is the capital of France? Answer in one sentence."}])
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert "Paris" in r.choices[0].message.content
    assert r.usage.prompt_tokens_details.cached_tokens >= 0


def test_chat_stream_with_usage(client, server):
    messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    full = client.chat.completions.create(model=server.model, temperature=0, max_tokens=20, messages=messages)
    chunks = list(client.chat.completions.create(model=server.model, temperature=0, max_tokens=20,
                                                 messages=messages, stream=True,
                                                 stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_models_and_errors(client, server):
    assert [m.id for m in client.models.list().data] == [server.model]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt="hi", max_tokens=-1)
