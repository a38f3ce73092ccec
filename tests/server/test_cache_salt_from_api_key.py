"""`--cache-salt-from-api-key`: tenants presenting different keys never share prefix-cache blocks, whatever
`cache_salt` they send; the same key hits its own blocks. In-process app on the tiny dummy-weight model."""

from __future__ import annotations

import hashlib
import hmac

from shared_engine.config import EngineConfig
from shared_engine.engine.llm_engine import LLMEngine
from shared_engine.entrypoints.openai.api_server import create_app
from shared_engine.entrypoints.openai.server_config import ServerConfig
from tests.server.app_runner import run_app

PROMPT = [(5 * i) % 100 + 3 for i in range(50)]  # 3 full blocks of 16


def _app(tiny_model_dir, **server):
    engine = LLMEngine(EngineConfig.from_flat(model=str(tiny_model_dir), load_format="dummy", device="cpu",
                                              num_gpu_blocks_override=64))
    return create_app(engine, ServerConfig(**server)), engine


def _cached(client, key: str | None, salt: str | None = None):
    async def go():
        body = {"prompt": PROMPT, "max_tokens": 1, **({"cache_salt": salt} if salt else {})}
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        r = await client.post("/v1/completions", json=body, headers=headers)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return go()


def test_keys_never_share_cached_prefixes(tiny_model_dir):
    app, engine = _app(tiny_model_dir, cache_salt_from_api_key=True, cache_salt_secret="s3cret")
    seen_salts = []
    add = engine.add_request

    def spy(*args, **kwargs):
        seen_salts.append(kwargs.get("cache_salt"))
        return add(*args, **kwargs)

    engine.add_request = spy

    async def scenario(client):
        first = await _cached(client, "key-a")
        same = await _cached(client, "key-a")
        other = await _cached(client, "key-b")
        # a client's own salt cannot reach another key's namespace: key-b sending key-a's derived salt
        forged = await _cached(client, "key-b", salt=seen_salts[0])
        anonymous = await _cached(client, None)
        return first, same, other, forged, anonymous

    first, same, other, forged, anonymous = run_app(app, scenario)
    assert first == 0 and same == 48
    assert other == 0 and forged == 0 and anonymous == 0
    expected = hmac.new(b"s3cret", b"key-a\0", hashlib.sha256).hexdigest()
    assert seen_salts[0] == expected and "key-a" not in seen_salts[0]


def test_without_the_option_the_request_salt_is_used(tiny_model_dir):
    app, _ = _app(tiny_model_dir)

    async def scenario(client):
        return [await _cached(client, k, s) for k, s in (("key-a", None), ("key-b", None), ("key-b", "t1"))]

    assert run_app(app, scenario) == [0, 48, 0]  # keys alone do not separate tenants; a salt does
