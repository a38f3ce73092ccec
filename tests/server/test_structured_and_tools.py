"""`response_format` (json_object, json_schema: the openai client's `.parse()`) and `tools` / `tool_choice`
(auto, required, named; assistant `tool_calls` in the history) against the default model."""

from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai")
pydantic = pytest.importorskip("pydantic")

from shared_engine.entrypoints.openai.protocol_tools import Tool  # noqa: E402
from shared_engine.entrypoints.openai.tool_calls import held_back, parse_tool_calls, system_block  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris right now?"}]


class Person(pydantic.BaseModel):
    name: str
    age: int


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_parse_with_a_pydantic_model(client, server):
    r = client.chat.completions.parse(
        model=server.model, temperature=0, max_tokens=60, response_format=Person,
        messages=[{"role": "user", "content": "Invent a person and describe them."}])
    person = r.choices[0].message.parsed
    assert isinstance(person, Person) and person.name and r.choices[0].finish_reason == "stop"


def test_json_object_and_stream(server):
    body = {"model": server.model, "temperature": 0, "max_tokens": 80, "response_format": {"type": "json_object"},
            "messages": [{"role": "user", "content": "List two fruits."}]}
    r = server.post("/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["message"]["content"]
    assert isinstance(json.loads(content), dict)
    frames = server.stream("/v1/chat/completions", {**body, "stream": True})
    assert "".join(c["delta"].get("content") or "" for f in frames for c in f["choices"]) == content


def test_invalid_schema_is_400(server):
    r = server.post("/v1/chat/completions", {"messages": ASK, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.json_schema"


def _arguments(call) -> dict:
    return json.loads(call.function.arguments)


def test_tool_choice_required(client, server):
    r = client.chat.completions.create(model=server.model, temperature=0, max_tokens=80, messages=ASK,
                                       tools=[WEATHER, TIME], tool_choice="required")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    for call in choice.message.tool_calls:
        assert call.function.name in ("get_weather", "get_time") and call.id
        args = _arguments(call)
        if call.function.name == "get_weather":
            assert set(args) == {"city", "unit"} and args["unit"] in ("celsius", "fahrenheit")


def test_tool_choice_named_and_streamed(client, server):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = client.chat.completions.create(model=server.model, temperature=0, max_tokens=40, messages=ASK,
                                       tools=[WEATHER, TIME], tool_choice=named)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and "timezone" in _arguments(call)
    chunks = list(client.chat.completions.create(model=server.model, temperature=0, max_tokens=40, messages=ASK,
                                                 tools=[WEATHER, TIME], tool_choice=named, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [d.function.name for d in deltas] == ["get_time"]
    assert json.loads(deltas[0].function.arguments) == _arguments(call)


def _weather_call(city: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{city}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": city, "unit": "celsius"})}}]}


# two earlier turns that called the tool: greedy, the default model then answers the third with a call
TWO_SHOT = [{"role": "user", "content": "What is the weather in Paris right now?"}, _weather_call("Paris"),
            {"role": "tool", "tool_call_id": "call_Paris", "content": '{"temperature": 21}'},
            {"role": "assistant", "content": "It is 21 degrees in Paris."},
            {"role": "user", "content": "What is the weather in Rome right now?"}, _weather_call("Rome"),
            {"role": "tool", "tool_call_id": "call_Rome", "content": '{"temperature": 25}'},
            {"role": "assistant", "content": "It is 25 degrees in Rome."},
            {"role": "user", "content": "What is the weather in Oslo right now?"}]


def test_tool_choice_auto_parses_the_call_out_of_the_text(client, server):
    """`auto` (no grammar): the model's own `<tool_call>` block becomes a tool call, non-streamed and
    streamed alike; without a call in the text the answer is plain content."""
    r = client.chat.completions.create(model=server.model, temperature=0, max_tokens=60, messages=TWO_SHOT,
                                       tools=[WEATHER], tool_choice="auto")
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content, choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and _arguments(call) == {"city": "Oslo", "unit": "celsius"}
    chunks = list(client.chat.completions.create(model=server.model, temperature=0, max_tokens=60,
                                                 messages=TWO_SHOT, tools=[WEATHER], tool_choice="auto",
                                                 stream=True))
    deltas = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == \
        [("get_weather", {"city": "Oslo", "unit": "celsius"})]
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    plain = client.chat.completions.create(model=server.model, temperature=0, max_tokens=20, messages=ASK,
                                           tools=[WEATHER], tool_choice="auto").choices[0]
    assert plain.finish_reason in ("stop", "length") and plain.message.content and not plain.message.tool_calls


def test_tools_reach_the_prompt_and_history_keeps_calls(server, tokenizer):
    """The template of SmolLM2-135M ignores `tools`: they go into the system turn in Hermes format; an earlier
    assistant call and its tool answer are rendered too (not dropped)."""
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'}]
    r = server.post("/tokenize", {"model": server.model, "messages": history, "tools": [WEATHER]})
    text = tokenizer.decode(r.json()["tokens"])
    assert system_block([Tool.model_validate(WEATHER)]) in text
    call = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}'
    assert f"<tool_call>\n{call}\n</tool_call>" in text
    assert '{"temperature": 21}' in text
    plain = server.post("/tokenize", {"model": server.model, "messages": ASK}).json()["count"]
    chat = server.post("/v1/chat/completions", {"model": server.model, "messages": ASK, "tools": [WEATHER],
                                                "max_tokens": 1})
    assert chat.json()["usage"]["prompt_tokens"] > plain + 50
    none = server.post("/v1/chat/completions", {"model": server.model, "messages": ASK, "tools": [WEATHER],
                                                "tool_choice": "none", "max_tokens": 1})
    assert none.json()["usage"]["prompt_tokens"] == plain


def test_auto_parser():
    tools = [Tool.model_validate(WEATHER)]
    text = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}' \
           '\n</tool_call>'
    parsed = parse_tool_calls(text, tools)
    assert parsed.content == "Let me check." and len(parsed.tool_calls) == 1
    assert json.loads(parsed.tool_calls[0].function.arguments) == {"city": "Oslo", "unit": "celsius"}
    two = text + "\n" + text.split("\n", 1)[1].replace("Oslo", "Rome")
    assert [json.loads(c.function.arguments)["city"] for c in parse_tool_calls(two, tools).tool_calls] == \
        ["Oslo", "Rome"]
    assert len(parse_tool_calls(two, tools, parallel=False).tool_calls) == 1
    unterminated = parse_tool_calls('<tool_call>{"name": "get_weather", "arguments": {}}', tools)
    assert unterminated.content is None and len(unterminated.tool_calls) == 1
    for not_a_call in ('<tool_call>{"name": "other", "arguments": {}}</tool_call>', "<tool_call>{broken",
                       "no calls here"):
        assert parse_tool_calls(not_a_call, tools).tool_calls == []
        assert parse_tool_calls(not_a_call, tools).content == not_a_call
    assert held_back("Sure <tool") == 5 and held_back("Sure <tool_call>{") == 12 and held_back("Sure") == 0


def test_tool_choice_errors(server):
    for body, param in ((({"tool_choice": "required"}), "tool_choice"),
                        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                         "tool_choice"),
                        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
                         "tools.0.function.name")):
        r = server.post("/v1/chat/completions", {"model": server.model, "messages": ASK, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_auto_stream_holds_back_calls():
    """`auto` streaming: content before the call is streamed, a tail that may start `<tool_call>` is held,
    and the call arrives whole in the last delta with finish_reason tool_calls."""
    from shared_engine.entrypoints.openai.protocol import ChatCompletionRequest
    from shared_engine.entrypoints.openai.serving_chat import _ToolStream

    req = ChatCompletionRequest.model_validate({"messages": ASK, "tools": [WEATHER]})
    stream = _ToolStream(req, "auto")
    pieces = ["Checking", " now <tool", '_call>\n{"name": "get_weather", ', '"arguments": {"city": "Oslo", ',
              '"unit": "celsius"}}\n</tool_call>']
    deltas = [stream.advance(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert [d.content for d in deltas[:-1]] == ["Checking", " now ", None, None]
    last = deltas[-1]
    assert last.content is None and stream.called
    (call,) = last.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Oslo"
    plain = _ToolStream(req, "auto")
    assert [plain.advance(p, f).content for p, f in (("No <to", False), ("ols needed", True))] == \
        ["No ", "<tools needed"]
    assert not plain.called
