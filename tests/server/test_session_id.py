"""`session_id` (body field, else the `X-Session-Id` header) reaches the engine, which pins a finished turn's
cached prefix (`--session-pin-ttl`); bad values are 400s naming the field. In-process app, tiny model."""

from __future__ import annotations

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

PROMPT = [(7 * i) % 100 + 3 for i in range(40)]


def test_session_id_reaches_the_engine_and_pins(tiny_model_dir):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64, session_pin_ttl=600.0))
    app = create_app(engine, ServerConfig())
    seen = []
    add = engine.add_request

    def spy(*args, **kwargs):
        seen.append(kwargs.get("session_id"))
        return add(*args, **kwargs)

    engine.add_request = spy
    body = {"prompt": PROMPT, "max_tokens": 2, "ignore_eos": True}

    async def scenario(client):
        r1 = await client.post("/v1/completions", json=body, headers={"X-Session-Id": "agent-1"})
        pinned = engine.block_manager.num_pinned_blocks
        r2 = await client.post("/v1/completions", json=body | {"session_id": "agent-2"},
                               headers={"X-Session-Id": "ignored"})
        bad = [await client.post("/v1/completions", json=body, headers={"X-Session-Id": "x" * 257}),
               await client.post("/v1/completions", json=body | {"session_id": ""}),
               await client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                               "session_id": "x" * 257})]
        return [r.status_code for r in (r1, r2)], pinned, r2.json(), bad

    codes, pinned, second, bad = run_app(app, scenario)
    assert codes == [200, 200]
    assert seen == ["agent-1", "agent-2"]  # the body's field wins over the header
    assert pinned == 40 // engine.block_manager.block_size  # turn 1's full prompt blocks, held by its pin
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == pinned * engine.block_manager.block_size
    assert [(r.status_code, r.json()["error"]["param"]) for r in bad] == [
        (400, "X-Session-Id"), (400, "session_id"), (400, "session_id")]
