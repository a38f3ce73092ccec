"""Synthetic support tickets, seeded, written as an OpenAI batch input file (one chat completion per ticket).

    python -m case_batch_summarisation.tickets.generator --num-tickets 300 --seed 0 -o night.jsonl

Each ticket is a thread between a customer and support agents about one product of a small catalogue, from
one of a few thousand customers on a plan (free / pro / enterprise), in 1-9 messages (more for longer
tickets). Its length in tokens is log-normal, median `median_tokens` (600) and shape `sigma` (0.7), cut to
[`min_tokens`, `max_tokens`] = [60, 6,000]: about 1% of tickets run past 3,000 tokens and the mean is ~770
(exp(sigma^2 / 2) x the median). Lengths are targeted in words at `TOKENS_PER_WORD` (1.3, SmolLM2's
tokenizer on this English text, checked by tests/batch/test_tickets.py); `summarise_lengths` measures the
real token counts.

Every row shares one instruction (tickets/instruction.md) as its system message, so all prompts share the
same prefix for the prefix cache. Rows are greedy (temperature 0) with `max_completion_tokens`
SUMMARY_MAX_TOKENS (512: the schema's longest object, so a summary is never cut; they average ~70 tokens on
SmolLM2, the brief's are 100-150) and the summary's JSON schema as `response_format` (decoding is
constrained to it: batch/summary_schema.py). `fixed_output=True` (benchmarks on dummy weights, whose outputs never
end by themselves) sets `ignore_eos` and a summary length drawn uniformly from 100-150 tokens per ticket.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from case_batch_summarisation.batch.summary_schema import SUMMARY_MAX_TOKENS

INSTRUCTION = (Path(__file__).with_name("instruction.md")).read_text().strip()
TOKENS_PER_WORD = 1.3
PRODUCTS = ("Acme Mobile", "Acme Cloud Drive", "Acme Router X2", "Acme Smart Thermostat", "Acme Billing Portal",
            "Acme Photo Studio", "Acme Fitness Band", "Acme Home Camera", "Acme Password Vault", "Acme TV Box")
PLANS = ("free", "pro", "enterprise")
FIRST = ("Alex", "Sam", "Maria", "Chen", "Priya", "Jonas", "Fatima", "Liam", "Sofia", "Kenji", "Amara", "Noah")
LAST = ("Garcia", "Smith", "Müller", "Okafor", "Rossi", "Tanaka", "Novak", "Silva", "Kowalski", "Haddad")
PROBLEMS = ("stops syncing after the latest update", "charges me twice every month", "will not pair with my phone",
            "keeps logging me out", "shows a blank screen on start", "lost all my settings overnight",
            "is much slower than last week", "sends me notifications I never asked for",
            "rejects my password although it is correct", "drops the connection every few minutes",
            "exported files are corrupted", "the battery drains within a few hours")
DETAILS = ("I already restarted it twice and reinstalled the app.", "This started on Monday morning.",
           "My order number is {order}.", "I am on the {plan} plan and have been a customer for years.",
           "The error message says code {code}.", "It happens on both my laptop and my phone.",
           "I followed the steps in your help centre article but nothing changed.",
           "My colleague has the same problem on a different account.",
           "I attached a screenshot of the settings page.", "The status page said everything was fine.",
           "I need this working before our team meeting on Friday.", "Support chat disconnected me twice.")
AGENT = ("Thanks for reaching out, {name}. I am sorry about the trouble with {product}.",
         "Could you tell me which version you are running? You can find it under Settings, About.",
         "I have escalated this to our engineering team and will update you within one business day.",
         "Please try clearing the cache and signing in again, then let me know if it helps.",
         "I can see the duplicate charge on your account and have started a refund.",
         "Our logs show a known issue in this release; a fix is planned for next week.")
FOLLOW_UP = ("I tried that and it still does not work.", "Thanks, that fixed it for now.",
             "This is the third time I am writing about this.", "Version {code}, on the latest phone update.",
             "If this is not fixed I want to cancel my subscription and get a refund.",
             "Great, thank you for the quick help!", "Any news? It has been four days.")


@dataclass(frozen=True)
class TicketSpec:
    """The length distribution, in tokens (see the module docstring)."""

    median_tokens: float = 600.0
    sigma: float = 0.7
    min_tokens: int = 60
    max_tokens: int = 6000
    num_customers: int = 5000

    def sample_tokens(self, rng: random.Random) -> int:
        n = rng.lognormvariate(math.log(self.median_tokens), self.sigma)
        return int(min(self.max_tokens, max(self.min_tokens, n)))


def _fill(template: str, rng: random.Random, name: str, product: str, plan: str) -> str:
    return template.format(name=name, product=product, plan=plan, order=f"A-{rng.randint(100000, 999999)}",
                           code=f"{rng.randint(1, 9)}.{rng.randint(0, 20)}.{rng.randint(0, 99)}")


def _message(rng: random.Random, words: int, opening: str, pool: tuple[str, ...], **names) -> str:
    parts, count = [opening], len(opening.split())
    while count < words:
        sentence = _fill(rng.choice(pool), rng, **names)
        parts.append(sentence)
        count += len(sentence.split())
    return " ".join(parts)


def ticket(index: int, rng: random.Random, spec: TicketSpec) -> dict:
    """One ticket: {ticket_id, customer_id, plan, product, target_tokens, thread: [{role, text}]}."""
    customer = rng.randrange(spec.num_customers)
    crng = random.Random(customer)  # a customer keeps one name and plan across tickets
    name, plan = f"{crng.choice(FIRST)} {crng.choice(LAST)}", crng.choice(PLANS)
    product, problem = rng.choice(PRODUCTS), rng.choice(PROBLEMS)
    target = spec.sample_tokens(rng)
    num_messages = min(9, 1 + int(target // 350) + rng.randint(0, 2))
    words = max(8, int(target / TOKENS_PER_WORD / num_messages))
    names = {"name": name, "product": product, "plan": plan}
    thread = []
    for m in range(num_messages):
        if m == 0:
            text = _message(rng, words, f"Hello, my {product} {problem}.", DETAILS, **names)
        elif m % 2:
            text = _message(rng, words, _fill(AGENT[0], rng, **names), AGENT[1:], **names)
        else:
            text = _message(rng, words, _fill(rng.choice(FOLLOW_UP), rng, **names), DETAILS + FOLLOW_UP, **names)
        thread.append({"role": "customer" if m % 2 == 0 else "agent", "text": text})
    return {"ticket_id": f"T{index:08d}", "customer_id": f"C{customer:06d}", "plan": plan, "product": product,
            "target_tokens": target, "thread": thread}


def render(t: dict) -> str:
    """The ticket as the user message: a header, then each message of the thread."""
    lines = [f"Ticket {t['ticket_id']} | customer {t['customer_id']} ({t['plan']} plan) | product: {t['product']}"]
    for i, m in enumerate(t["thread"], start=1):
        lines.append(f"[{i}] {m['role']}: {m['text']}")
    return "\n".join(lines)


def response_format() -> dict:
    """The summary's JSON schema as an OpenAI `response_format` (the engine constrains decoding to it)."""
    from case_batch_summarisation.batch.summary_schema import SUMMARY_SCHEMA

    return {"type": "json_schema", "json_schema": {"name": "ticket_summary", "schema": SUMMARY_SCHEMA, "strict": True}}


def batch_row(t: dict, model: str | None, rng: random.Random, fixed_output: bool,
              max_completion_tokens: int = SUMMARY_MAX_TOKENS, structured: bool = True) -> dict:
    body = {"messages": [{"role": "system", "content": INSTRUCTION}, {"role": "user", "content": render(t)}],
            "temperature": 0.0, "max_completion_tokens": max_completion_tokens}
    if model:
        body["model"] = model
    if fixed_output:
        body.update(max_completion_tokens=rng.randint(100, 150), ignore_eos=True)
    elif structured:
        body["response_format"] = response_format()
    return {"custom_id": t["ticket_id"], "method": "POST", "url": "/v1/chat/completions", "body": body}


def generate(num_tickets: int, seed: int = 0, spec: TicketSpec = TicketSpec(), model: str | None = None,
             fixed_output: bool = False, start: int = 0, max_completion_tokens: int = SUMMARY_MAX_TOKENS,
             structured: bool = True) -> Iterator[dict]:
    """Batch rows for tickets `start .. start + num_tickets - 1`; the same seed gives the same rows.
    A `max_completion_tokens` lower than SUMMARY_MAX_TOKENS may cut summaries (the early CPU runs); `structured`
    adds the summary's `response_format` (not with `fixed_output`: dummy weights make no summary to constrain)."""
    rng = random.Random(seed)
    for i in range(start, start + num_tickets):
        yield batch_row(ticket(i, rng, spec), model, rng, fixed_output, max_completion_tokens, structured)


def write(path: Path, rows) -> int:
    """Write rows as JSON lines, atomically (standard library only: the Airflow task calls it)."""
    from case_batch_summarisation.batch.shards import write_atomic

    lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
    write_atomic(Path(path), "".join(lines))
    return len(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", "--num-tickets", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--median-tokens", type=float, default=600.0)
    p.add_argument("--sigma", type=float, default=0.7)
    p.add_argument("--max-tokens", type=int, default=6000, help="longest ticket, in tokens")
    p.add_argument("--model", default=None, help="the body's model field (default: omitted)")
    p.add_argument("--fixed-output", action="store_true", help="ignore_eos + 100-150 output tokens (dummy weights)")
    p.add_argument("--max-completion-tokens", type=int, default=SUMMARY_MAX_TOKENS)
    p.add_argument("--no-response-format", action="store_true", help="leave the summary unconstrained")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args(argv)
    spec = TicketSpec(median_tokens=args.median_tokens, sigma=args.sigma, max_tokens=args.max_tokens)
    n = write(args.output, generate(args.num_tickets, args.seed, spec, args.model, args.fixed_output,
                                    max_completion_tokens=args.max_completion_tokens,
                                    structured=not args.no_response_format))
    print(json.dumps({"rows": n, "output": str(args.output)}))


if __name__ == "__main__":
    main()
