"""The ticket generator: seeded, the stated length distribution (in real SmolLM2 tokens), OpenAI batch rows."""

from __future__ import annotations

import statistics

from case_batch_summarisation.tickets.generator import INSTRUCTION, PRODUCTS, TicketSpec, generate, ticket


def test_seeded_and_shaped():
    a, b = list(generate(50, seed=3)), list(generate(50, seed=3))
    assert a == b and a != list(generate(50, seed=4))
    ids = [r["custom_id"] for r in a]
    assert len(set(ids)) == 50
    for r in a:
        assert r["method"] == "POST" and r["url"] == "/v1/chat/completions"
        system, user = r["body"]["messages"]
        assert system == {"role": "system", "content": INSTRUCTION}  # one shared instruction
        assert user["role"] == "user" and any(p in user["content"] for p in PRODUCTS)
        assert r["body"]["temperature"] == 0.0
        assert r["body"]["response_format"]["json_schema"]["schema"]["required"] == ["issue", "product", "sentiment",
                                                                                  "next_action"]


def test_length_distribution_in_real_tokens(default_model_dir):
    """Median ~600 tokens (within 15%) and a tail past 3,000, measured with the default model's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    rows = list(generate(300, seed=0))
    lengths = [len(tok.encode(r["body"]["messages"][1]["content"])) for r in rows]
    assert 510 <= statistics.median(lengths) <= 690
    import random

    rng, spec = random.Random(1), TicketSpec()
    targets = [ticket(i, rng, spec)["target_tokens"] for i in range(3000)]
    assert 0.005 <= sum(t > 3000 for t in targets) / len(targets) <= 0.02  # ~1% (log-normal, sigma 0.7)
    assert max(targets) <= spec.max_tokens


def test_threads_have_customers_and_several_messages():
    import random

    rng = random.Random(0)
    tickets = [ticket(i, rng, TicketSpec()) for i in range(200)]
    assert max(len(t["thread"]) for t in tickets) >= 4 and min(len(t["thread"]) for t in tickets) >= 1
    assert len({t["customer_id"] for t in tickets}) > 100
    assert {m["role"] for t in tickets for m in t["thread"]} == {"customer", "agent"}
