"""`tenant` and `priority` request fields: the chat and completions bodies take them, they reach the
engine's scheduling policy (its fair counters), and bad values are 400s in the OpenAI envelope naming the
field. In-process app on the tiny dummy-weight model."""

from __future__ import annotations

import pytest

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app
from tests.server.test_cli_args import _parse

PROMPT = [(7 * i) % 100 + 3 for i in range(20)]
BAD = [("tenant", ""), ("tenant", 5), ("tenant", "x" * 257), ("priority", "high"), ("priority", 1.5),
       ("priority", 2**31), ("priority", None)]


def _app(tiny_model_dir):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64, scheduling_policy="fair"))
    return create_app(engine, ServerConfig()), engine


def test_tenant_and_priority_reach_the_scheduler_and_bad_values_are_400s(tiny_model_dir):
    app, engine = _app(tiny_model_dir)
    seen = []
    add = engine.add_request

    def spy(*args, **kwargs):
        seen.append((kwargs.get("tenant"), kwargs.get("priority")))
        return add(*args, **kwargs)

    engine.add_request = spy

    async def scenario(client):
        codes = []
        for tenant, priority, max_tokens in (("acme", 3, 4), ("globex", -1, 2), (None, None, 1)):
            body = {"prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True}
            body |= {"tenant": tenant} if tenant else {}
            body |= {"priority": priority} if priority is not None else {}
            r = await client.post("/v1/completions", json=body)
            codes.append(r.status_code)
        errors = []
        for route, body in (("/v1/completions", {"prompt": PROMPT, "max_tokens": 1}),
                            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})):
            for field, value in BAD:
                r = await client.post(route, json=body | {field: value})
                errors.append((field, r.status_code, r.json()["error"]))
        return codes, errors

    codes, errors = run_app(app, scenario)
    assert codes == [200, 200, 200]
    assert seen == [("acme", 3), ("globex", -1), (None, 0)]
    # the fair policy charged each tenant what it was served: 20 prompt tokens (weight 1) and its output
    # tokens (weight 2); the request without a tenant charged tenant None
    assert engine.scheduler.policy.counters == pytest.approx({"acme": 20 + 2 * 4, "globex": 20 + 2 * 2, None: 22})
    assert len(seen) == 3  # no rejected body reached the engine
    for field, status, error in errors:
        assert status == 400, (field, error)
        assert set(error) == {"message", "type", "param", "code"}
        assert error["type"] == "invalid_request_error" and error["param"] == field, (field, error)


def test_scheduling_policy_flag():
    from shared_engine.entrypoints.openai.cli_args import build_configs

    assert build_configs(_parse([]))[0].scheduler.scheduling_policy == "fcfs"
    assert build_configs(_parse(["--scheduling-policy", "fair"]))[0].scheduler.scheduling_policy == "fair"
    with pytest.raises(ValueError, match="scheduling_policy"):
        build_configs(_parse(["--scheduling-policy", "lottery"]))
