"""Shards of a night's batch file: split with a manifest, outputs checked exactly once. Standard library only
(the Airflow tasks import it from their own virtual environment, which has no engine).

Layout under a night's directory:

    shards/manifest.json          {input, input_sha256, rows_per_shard, num_rows, shards: [{name, num_rows, sha256}]}
    shards/shard-00000.jsonl      rows 0 .. rows_per_shard - 1 of the input, byte for byte
    out/shard-00000.jsonl         the shard's OpenAI batch output (appears atomically: temp file + rename)
    out/shard-00000.done.json     written last, after the output: its sha256, rows and run summary

A shard is finished when its `.done.json` exists and names the output's current sha256 (worker.py); a rerun
skips finished shards, so a retried shard's rows appear once. Every file here is written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from pathlib import Path

MANIFEST = "manifest.json"


class BatchIntegrityError(RuntimeError):
    """Outputs do not hold every input custom_id exactly once (or a shard is unfinished)."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` through a hidden temp file in the same directory, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def custom_id_of(line: str) -> str | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError:
        return None
    cid = row.get("custom_id") if isinstance(row, dict) else None
    return cid if isinstance(cid, str) and cid else None


def input_custom_ids(path: Path) -> list[str]:
    """The custom_ids of an input file in order (rows without one are skipped). Raises `ValueError` on a
    duplicate: run-batch would refuse the file, so the night is refused before it is split."""
    ids = [cid for line in Path(path).read_text(encoding="utf-8").splitlines()
           if line.strip() and (cid := custom_id_of(line)) is not None]
    dup = [cid for cid, n in Counter(ids).items() if n > 1]
    if dup:
        raise ValueError(f"duplicate custom_id in {path}: {dup[:5]}{' ...' if len(dup) > 5 else ''}")
    return ids


def split(input_path: Path, shard_dir: Path, rows_per_shard: int) -> dict:
    """Split `input_path` into shards of `rows_per_shard` non-blank lines; returns the manifest. If the
    manifest already describes this input (same sha256 and shard size), the existing shards are kept."""
    if rows_per_shard < 1:
        raise ValueError(f"rows_per_shard must be >= 1, got {rows_per_shard}")
    input_path, shard_dir = Path(input_path), Path(shard_dir)
    digest = sha256_file(input_path)
    existing = shard_dir / MANIFEST
    if existing.exists():
        m = json.loads(existing.read_text())
        if m["input_sha256"] == digest and m["rows_per_shard"] == rows_per_shard:
            return m
    input_custom_ids(input_path)
    lines = [line for line in input_path.read_text(encoding="utf-8").splitlines() if line.strip()]
    shards = []
    for i in range(0, max(len(lines), 1), rows_per_shard):
        chunk = lines[i : i + rows_per_shard]
        if not chunk:
            break
        name = f"shard-{i // rows_per_shard:05d}"
        data = "\n".join(chunk) + "\n"
        write_atomic(shard_dir / f"{name}.jsonl", data)
        shards.append({"name": name, "num_rows": len(chunk), "sha256": hashlib.sha256(data.encode()).hexdigest()})
    manifest = {"input": str(input_path), "input_sha256": digest, "rows_per_shard": rows_per_shard,
                "num_rows": len(lines), "shards": shards}
    write_atomic(existing, json.dumps(manifest, indent=2))
    return manifest


def done_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / f"{name}.done.json"


def is_finished(out_dir: Path, name: str) -> dict | None:
    """The shard's done record if its output is complete and unchanged since, else None."""
    done, output = done_path(out_dir, name), Path(out_dir) / f"{name}.jsonl"
    if not (done.exists() and output.exists()):
        return None
    record = json.loads(done.read_text())
    return record if record.get("output_sha256") == sha256_file(output) else None


def check_exactly_once(manifest: dict, shard_dir: Path, out_dir: Path) -> dict:
    """Every input custom_id exactly once across the finished shards' outputs; returns counts.

    Raises `BatchIntegrityError` naming unfinished shards, missing, duplicated or unknown custom_ids."""
    unfinished = [s["name"] for s in manifest["shards"] if is_finished(out_dir, s["name"]) is None]
    if unfinished:
        raise BatchIntegrityError(f"unfinished shards: {unfinished}")
    expected = Counter()
    for s in manifest["shards"]:
        expected.update(input_custom_ids(Path(shard_dir) / f"{s['name']}.jsonl"))
    got, failed, null_ids = Counter(), 0, 0
    for s in manifest["shards"]:
        for line in (Path(out_dir) / f"{s['name']}.jsonl").read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if row["custom_id"] is None:
                null_ids += 1
            else:
                got[row["custom_id"]] += 1
            failed += row.get("error") is not None
    missing = sorted(set(expected) - set(got))
    dups = sorted(cid for cid, n in got.items() if n > 1)
    unknown = sorted(set(got) - set(expected))
    if missing or dups or unknown:
        raise BatchIntegrityError(f"missing {missing[:5]} ({len(missing)}), duplicated {dups[:5]} ({len(dups)}), "
                                  f"unknown {unknown[:5]} ({len(unknown)})")
    return {"num_custom_ids": len(got), "num_error_rows": failed, "num_rows_without_custom_id": null_ids}
