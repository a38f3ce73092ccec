"""K15: the gateway's token limit reserves what the engine will actually spend, on both endpoints. A completions
request with several prompts is one engine request per prompt, each generating up to `max_tokens` x `n`, and
token-id prompts (`[[ids], [ids]]`) are prompt tokens too. Before, the reservation counted `max_tokens` x `n`
once and nothing for a list of token-id lists, so one completions request could spend many times a tenant's
token window (and the "larger than the whole window" 400 never fired for it)."""

from __future__ import annotations

import httpx
import pytest

from case_multilora.app.proxy import rewrite_body
from case_multilora.app.tenants import Tenant, key_digest
from tests.multilora.conftest import auth

TENANT = Tenant("t", key_digest("k"), "a")


def reserved(body: dict, chat: bool = False) -> int:
    return rewrite_body(body, TENANT, "salt", 64, chat=chat).reserved_tokens


@pytest.mark.parametrize("body, expected", [
    ({"prompt": "abcdefgh", "max_tokens": 10}, 2 + 10),  # 8 characters: 2 tokens estimated
    ({"prompt": ["abcdefgh", "abcd", "ab"], "max_tokens": 10}, 2 + 1 + 1 + 3 * 10),
    ({"prompt": ["abcdefgh", "abcd"], "max_tokens": 10, "n": 3}, 2 + 1 + 2 * 3 * 10),
    ({"prompt": [5, 6, 7], "max_tokens": 10}, 3 + 10),  # one token-id prompt, counted exactly
    ({"prompt": [[5, 6, 7], [8, 9]], "max_tokens": 10}, 5 + 2 * 10),  # two token-id prompts
    ({"prompt": [[5] * 40] * 4, "max_tokens": 1, "n": 2}, 160 + 4 * 2),
    ({"prompt": ["abcd"] * 16}, 16 + 16 * 64),  # the default max_tokens, per prompt
])
def test_completions_reserve_every_prompt_and_its_tokens(body, expected):
    assert reserved(body) == expected


def test_chat_is_one_prompt_whatever_its_messages():
    body = {"messages": [{"role": "user", "content": "abcdefgh"}, {"role": "assistant", "content": "abcd"}],
            "max_tokens": 10, "n": 2}
    assert reserved(body, chat=True) == 2 + 1 + 8 * 2 + 2 * 10  # 8 tokens of template per message


def test_a_many_prompt_completion_cannot_spend_past_the_window(gateway):
    """Tenant "tight" (300 tokens/minute): one prompt with max_tokens 100 fits; four prompts with max_tokens 100
    would generate 400 tokens: 400 "can never fit the window"; three token-id prompts of 30 ids with max_tokens 40
    (210) fit the window but not what is left of it after the first request (429, param tokens). The engine
    sees neither."""
    _, url, engine = gateway
    one = httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 100}, headers=auth("tight"))
    assert one.status_code == 200, one.text
    sent = len(engine.state.bodies)
    four = httpx.post(url + "/v1/completions", json={"prompt": ["Hi", "Yo", "Hey", "Oi"], "max_tokens": 100},
                      headers=auth("tight"))
    assert four.status_code == 400 and four.json()["error"]["param"] == "max_tokens", four.text
    assert "404 tokens" in four.json()["error"]["message"], four.text
    ids = httpx.post(url + "/v1/completions", json={"prompt": [[5] * 30] * 3, "max_tokens": 40},
                     headers=auth("tight"))
    assert ids.status_code == 429 and ids.json()["error"]["param"] == "tokens", ids.text
    assert "210 tokens" in ids.json()["error"]["message"], ids.text
    assert len(engine.state.bodies) == sent  # neither reached the engine
