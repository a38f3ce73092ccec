"""K13 across shards: atomic shard outputs with a manifest, reruns skip finished shards, a worker SIGKILLed
mid-shard leaves nothing visible and its retry delivers every custom_id exactly once."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest

from case_batch_summarisation.batch import shards
from case_batch_summarisation.batch.worker import ShardFailed, run_shard
from tests.batch.conftest import chat_row, write_lines

TINY = ["served_model_name: ticket-summariser", "max_model_len: 512", "max_num_seqs: 8",
        "max_num_batched_tokens: 512", "kv_cache_memory: 67108864"]


def night(tmp_path, n: int, per_shard: int, max_tokens: int = 3):
    rows = [chat_row(f"T{i:04d}", f"Ticket {i}: the router drops the connection.", max_tokens) for i in range(n)]
    write_lines(tmp_path / "night.jsonl", rows)
    (tmp_path / "engine.yaml").write_text("\n".join(TINY) + "\n")
    return shards.split(tmp_path / "night.jsonl", tmp_path / "shards", per_shard)


def test_split_manifest_and_idempotent(tmp_path):
    m = night(tmp_path, 7, 3)
    assert [s["num_rows"] for s in m["shards"]] == [3, 3, 1] and m["num_rows"] == 7
    again = shards.split(tmp_path / "night.jsonl", tmp_path / "shards", 3)
    assert again == m
    ids = [cid for s in m["shards"] for cid in shards.input_custom_ids(tmp_path / "shards" / f"{s['name']}.jsonl")]
    assert ids == [f"T{i:04d}" for i in range(7)]


def test_split_refuses_duplicates(tmp_path):
    write_lines(tmp_path / "night.jsonl", [chat_row("a", "x"), chat_row("a", "y")])
    with pytest.raises(ValueError, match="duplicate custom_id"):
        shards.split(tmp_path / "night.jsonl", tmp_path / "shards", 1)
    assert not (tmp_path / "shards").exists()


def test_check_exactly_once_catches_missing_and_duplicates(tmp_path):
    m = night(tmp_path, 2, 1)
    out = tmp_path / "out"
    for s, cids in zip(m["shards"], (["T0000"], ["T0000"])):  # T0001 missing, T0000 twice
        data = "".join(json.dumps({"custom_id": c, "error": None}) + "\n" for c in cids)
        shards.write_atomic(out / f"{s['name']}.jsonl", data)
        shards.write_atomic(shards.done_path(out, s["name"]),
                            json.dumps({"output_sha256": shards.sha256_file(out / f"{s['name']}.jsonl")}))
    with pytest.raises(shards.BatchIntegrityError, match=r"missing \['T0001'\].*duplicated \['T0000'\]"):
        shards.check_exactly_once(m, tmp_path / "shards", out)
    (out / "shard-00001.jsonl").write_text(json.dumps({"custom_id": "T0001", "error": None}) + "\n")
    with pytest.raises(shards.BatchIntegrityError, match="unfinished shards"):  # changed after its done record
        shards.check_exactly_once(m, tmp_path / "shards", out)


def test_sigkill_mid_shard_then_retry_exactly_once(tmp_path):
    """Kill the engine process of shard 0 once it is generating; no output or done record is visible; the
    retry completes; a rerun of everything skips both shards; every custom_id arrives exactly once."""
    m = night(tmp_path, 6, 4, max_tokens=160)  # 160 decode steps: the kill lands before the end
    cfg, log = tmp_path / "engine.yaml", tmp_path / "logs" / "shard-00000.log"
    errors = []

    def worker():
        try:
            run_shard(tmp_path, "shard-00000", cfg)
        except ShardFailed as e:
            errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    deadline = time.time() + 300
    while time.time() < deadline and not (log.exists() and "KV cache size" in log.read_text(errors="replace")):
        time.sleep(0.2)
    time.sleep(1.0)  # into the shard's generation: the output is only written when all its rows are done
    pid = int((tmp_path / "out" / ".shard-00000.worker.pid").read_text())
    os.kill(pid, signal.SIGKILL)
    t.join(60)
    assert errors and "-9" in str(errors[0])
    visible = sorted(p.name for p in (tmp_path / "out").iterdir() if not p.name.startswith("."))
    assert visible == []  # neither a partial shard file nor a done record
    first = run_shard(tmp_path, "shard-00000", cfg)
    assert first["skipped"] is False and first["num_rows"] == 4
    assert run_shard(tmp_path, "shard-00001", cfg)["skipped"] is False
    assert all(run_shard(tmp_path, s["name"], cfg)["skipped"] for s in m["shards"])  # the rerun skips
    counts = shards.check_exactly_once(m, tmp_path / "shards", tmp_path / "out")
    assert counts == {"num_custom_ids": 6, "num_error_rows": 0, "num_rows_without_custom_id": 0}
