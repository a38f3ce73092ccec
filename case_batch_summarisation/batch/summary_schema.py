"""The fixed JSON shape of a ticket summary, as a JSON Schema (for a `response_format` once the server
constrains decoding to one) and a standard-library validator for the output rows."""

from __future__ import annotations

import json

SENTIMENTS = ("positive", "neutral", "negative")
# Characters per value: the instruction's "at most 25 / 20 words" with room (~7 characters a word), a product
# name. They bound a constrained summary's length in characters, and so in tokens: a token of ASCII text is at
# least one character, so SUMMARY_MAX_TOKENS (>= max_summary_chars()) always lets the object close, even when
# a small model loops on one- or two-character tokens ("11.11.11..."), which a 160-token cap cut (4 of 200 rows
# in the_fix/results_compose_cpu_200.json). Summaries average ~70 tokens; the cap is not their length.
MAX_CHARS = {"issue": 200, "product": 60, "next_action": 160}
SUMMARY_MAX_TOKENS = 512
SUMMARY_SCHEMA = {
    "type": "object",
    "properties": {
        "issue": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS["issue"]},
        "product": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS["product"]},
        "sentiment": {"type": "string", "enum": list(SENTIMENTS)},
        "next_action": {"type": "string", "minLength": 1, "maxLength": MAX_CHARS["next_action"]},
    },
    "required": ["issue", "product", "sentiment", "next_action"],
    "additionalProperties": False,
}


def max_summary_chars() -> int:
    """Characters of the longest object the schema allows, as the engine writes it (compact separators,
    llguidance's JSON options; ASCII values without escapes)."""
    longest = {k: "x" * MAX_CHARS[k] for k in ("issue", "product")}
    longest["sentiment"] = max(SENTIMENTS, key=len)
    longest["next_action"] = "x" * MAX_CHARS["next_action"]
    return len(json.dumps(longest, separators=(", ", ": ")))


def summary_problem(text: str | None) -> str | None:
    """None if `text` is one JSON object of the schema's shape, else what is wrong with it (one phrase)."""
    if not text:
        return "empty"
    try:
        value = json.loads(text.strip())
    except json.JSONDecodeError:
        return "not JSON"
    if not isinstance(value, dict):
        return "not an object"
    keys = set(value)
    required = set(SUMMARY_SCHEMA["required"])
    if keys != required:
        return f"keys {sorted(keys)} instead of {sorted(required)}"
    if not all(isinstance(value[k], str) and value[k] for k in required):
        return "a value is not a non-empty string"
    long = [k for k, n in MAX_CHARS.items() if len(value[k]) > n]
    if long:
        return f"{long[0]} longer than {MAX_CHARS[long[0]]} characters"
    if value["sentiment"] not in SENTIMENTS:
        return f"sentiment {value['sentiment']!r} not in {list(SENTIMENTS)}"
    return None


def validate_output_rows(lines: list[str]) -> dict:
    """Counts over one shard's output lines: rows, error rows (by status), summaries of the right shape,
    and why the others are not (a Counter-like dict of `summary_problem` answers)."""
    counts = {"rows": 0, "error_rows": 0, "summaries_valid": 0, "summaries_invalid": 0, "problems": {}}
    for line in lines:
        row = json.loads(line)
        counts["rows"] += 1
        if row.get("error") is not None or row["response"]["status_code"] != 200:
            counts["error_rows"] += 1
            continue
        problem = summary_problem(row["response"]["body"]["choices"][0]["message"]["content"])
        if problem is None:
            counts["summaries_valid"] += 1
        else:
            counts["summaries_invalid"] += 1
            counts["problems"][problem] = counts["problems"].get(problem, 0) + 1
    return counts
