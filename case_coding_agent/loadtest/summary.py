"""The case's figures from a replay's turns (dicts as results files store them; `TurnResult` fields plus
`ttft_s` and `tpot_s`): prompt-token hit rate on turns >= 2 (and its ceiling), reusable tokens computed again
and the peak KV the live sessions need (for the oversubscription figure), warm-turn TTFT while a cold long
prefill runs, ITL and TPOT (all turns and edit turns), and session affinity (replicas per session).
"""

from __future__ import annotations

import numpy as np


def pct(values: list[float], q: float) -> float | None:
    """The q-th percentile (numpy's linear interpolation) in ms of values in seconds; None when empty."""
    return None if not values else round(float(np.percentile(np.asarray(values) * 1000, q)), 1)


def later_turns(turns: list[dict], block_size: int) -> list[tuple[dict, int]]:
    """(turn, reusable tokens) for every turn >= 2 whose previous turn in its session also succeeded; reusable:
    the previous turn's prompt in whole engine blocks (what a cache that lost nothing would serve; generated
    tokens are not resent)."""
    by_session: dict[str, list[dict]] = {}
    for t in sorted(turns, key=lambda t: (t["session_id"], t["turn"])):
        by_session.setdefault(t["session_id"], []).append(t)
    return [(t, prev["prompt_tokens"] // block_size * block_size) for session in by_session.values()
            for prev, t in zip(session, session[1:]) if not (t["error"] or prev["error"])]


def hit_rate(turns: list[dict], block_size: int) -> dict:
    """Cached share of the prompt tokens of every turn >= 2, and the ceiling (`later_turns`' reusable tokens)."""
    later = later_turns(turns, block_size)
    prompt = sum(t["prompt_tokens"] for t, _ in later)
    cached = sum(t["cached_tokens"] for t, _ in later)
    reusable = sum(r for _, r in later)
    return {"turns2plus_prompt_tokens": prompt, "turns2plus_cached_tokens": cached,
            "turns2plus_hit_rate": round(cached / prompt, 4) if prompt else None,
            "turns2plus_hit_rate_ceiling": round(reusable / prompt, 4) if prompt else None}


def recompute(turns: list[dict], block_size: int) -> dict:
    """The brief's recompute figure: reusable prompt tokens (`later_turns`) that the cache did not serve and the
    engine computed again, summed over turns >= 2 (per turn at least 0), and their share of every successful
    turn's prompt tokens (first turns included)."""
    lost = sum(max(0, r - t["cached_tokens"]) for t, r in later_turns(turns, block_size))
    prompt = sum(t["prompt_tokens"] for t in turns if not t["error"])
    return {"recomputed_reusable_tokens": lost,
            "recomputed_share_of_prompt_tokens": round(lost / prompt, 4) if prompt else None}


def peak_kv_need(turns: list[dict]) -> dict:
    """Tokens of KV that holding every live session would take at the busiest moment: a session is live from its
    first turn's start to its last turn's end (`end_s`, else its start) and holds its latest started turn's
    prompt and output tokens; the peak is taken at turn starts (a session only grows while live). Divided by a
    replica's pool it gives the run's KV oversubscription (block rounding and in-flight tokens not counted)."""
    by_session: dict[str, list[dict]] = {}
    for t in sorted(turns, key=lambda t: t["start_s"]):
        by_session.setdefault(t["session_id"], []).append(t)
    spans = [(ts, ts[0]["start_s"], max(t.get("end_s") or t["start_s"] for t in ts)) for ts in by_session.values()]
    peak = 0
    for now in sorted({t["start_s"] for t in turns}):
        need = 0
        for ts, first, last in spans:
            if first <= now <= last:
                latest = [t for t in ts if t["start_s"] <= now][-1]
                need += latest["prompt_tokens"] + latest["output_tokens"]
        peak = max(peak, need)
    return {"peak_kv_need_tokens": peak}


def warm_ttft_during_cold(turns: list[dict]) -> dict:
    """TTFT of the warm turns (turn >= 2 of a session that is not cold) whose wait for the first token
    overlapped a cold session's long first turn (its send to its first token)."""
    colds = [(t["start_s"], t["first_token_s"]) for t in turns if t["kind"] == "cold" and t["first_token_s"]]
    warm = [t for t in turns if t["turn"] >= 2 and t["kind"] != "cold" and not t["session_id"].startswith("cold")
            and t["ttft_s"] is not None]
    during = [t["ttft_s"] for t in warm if any(t["start_s"] < end and t["first_token_s"] > start
                                                for start, end in colds)]
    return {"num_warm_turns": len(warm), "num_warm_turns_during_cold_prefill": len(during),
            "p99_warm_ttft_during_cold_ms": pct(during, 99), "max_warm_ttft_during_cold_ms": pct(during, 100),
            "median_warm_ttft_ms": pct([t["ttft_s"] for t in warm], 50),
            "p99_warm_ttft_ms": pct([t["ttft_s"] for t in warm], 99),
            "cold_ttft_ms": [round(1000 * (end - start), 1) for start, end in colds]}


def token_latency(turns: list[dict]) -> dict:
    out = {}
    for label, chosen in (("all", turns), ("edit", [t for t in turns if t["kind"] == "edit"])):
        gaps = [b - a for t in chosen for a, b in zip(t["chunk_times_s"], t["chunk_times_s"][1:])]
        tpot = [t["tpot_s"] for t in chosen if t["tpot_s"] is not None]
        out |= {f"{label}_median_itl_ms": pct(gaps, 50), f"{label}_p99_itl_ms": pct(gaps, 99),
                f"{label}_median_tpot_ms": pct(tpot, 50), f"{label}_mean_tpot_ms": (
                    round(1000 * float(np.mean(tpot)), 1) if tpot else None)}
    return out


def affinity(turns: list[dict]) -> dict:
    replicas: dict[str, set] = {}
    for t in turns:
        if t["replica"]:
            replicas.setdefault(t["session_id"], set()).add(t["replica"])
    return {"sessions_on_one_replica": sum(len(r) == 1 for r in replicas.values()), "num_sessions": len(replicas),
            "replicas_per_session": {s: sorted(r) for s, r in sorted(replicas.items())}}


def summarize(turns: list[dict], block_size: int) -> dict:
    ok = [t for t in turns if not t["error"]]
    return {"num_turns": len(turns), "num_failed": len(turns) - len(ok), **hit_rate(turns, block_size),
            **recompute(turns, block_size), **peak_kv_need(ok), **warm_ttft_during_cold(ok), **token_latency(ok),
            **affinity(turns)}
