"""Run one shard through the engine's `run-batch`, exactly once. Standard library only (Airflow imports it).

`run_shard` starts `$BATCH_ENGINE_PYTHON -m shared_engine run-batch -i shard -o out/shard.jsonl` in its own
process (the engine's virtual environment is not Airflow's), with the case's engine config. The output
appears atomically (run-batch writes a hidden temp file, then renames it), then the done record
(shards.py). A worker killed at any point (SIGKILL included) leaves at most a hidden temp file, never a
partial `shard-*.jsonl` and never a done record; the retry removes the temp files and runs the shard again;
a finished shard is skipped. Exit status and the last log lines of a failed worker are in the raised error.
On a host with `BATCH_NUM_GPUS` GPUs, each worker holds one of them alone (gpu_slots.py).

    python -m case_batch_summarisation.batch.worker NIGHT_DIR shard-00000 [--config the_fix/config_cpu.yaml]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from case_batch_summarisation.batch.gpu_slots import gpu_slot
from case_batch_summarisation.batch.shards import done_path, is_finished, sha256_file, write_atomic

CASE_DIR = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = CASE_DIR / "the_fix" / "config_cpu.yaml"


class ShardFailed(RuntimeError):
    """The engine process for a shard exited non-zero or was killed."""


def engine_python() -> str:
    return os.environ.get("BATCH_ENGINE_PYTHON", sys.executable)


def num_gpus() -> int:
    """GPUs on this host that shard workers share, one each (`BATCH_NUM_GPUS`; 0 on a CPU host)."""
    return int(os.environ.get("BATCH_NUM_GPUS", "0"))


def run_shard(night_dir: Path, name: str, config: Path | None = None, extra_args: list[str] | None = None) -> dict:
    """Run shard `name` of `night_dir` (shards/ in, out/ out) unless it is finished; returns its done record
    (`skipped` true when it was already finished). Raises `ShardFailed`."""
    night_dir = Path(night_dir)
    shard, out_dir = night_dir / "shards" / f"{name}.jsonl", night_dir / "out"
    record = is_finished(out_dir, name)
    if record is not None:
        return {**record, "skipped": True}
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob(f".{name}.*tmp-*"):  # a killed worker's temp files, never read
        stale.unlink(missing_ok=True)
    output, summary = out_dir / f"{name}.jsonl", out_dir / f".{name}.summary.json"
    cmd = [engine_python(), "-m", "shared_engine", "run-batch", "-i", str(shard), "-o", str(output),
           "--summary-json", str(summary), "--disable-progress-bar", "--config", str(config or DEFAULT_CONFIG),
           *(extra_args or [])]
    log_path = night_dir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    with gpu_slot(night_dir / "locks", num_gpus()) as gpu, open(log_path, "ab") as log:
        env = dict(os.environ) if gpu is None else {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        log.write(f"\n== {time.strftime('%H:%M:%S')} gpu {gpu}: {' '.join(cmd)}\n".encode())
        log.flush()
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=CASE_DIR.parent, env=env)
        write_atomic(out_dir / f".{name}.worker.pid", str(proc.pid))
        rc = proc.wait()
    if rc != 0 or not output.exists() or not summary.exists():
        tail = log_path.read_text(errors="replace").splitlines()[-8:]
        raise ShardFailed(f"{name}: run-batch exited with {rc} (negative: killed by that signal); log "
                          f"{log_path}:\n" + "\n".join(tail))
    record = {"name": name, "output_sha256": sha256_file(output),
              "num_rows": len(output.read_text(encoding="utf-8").splitlines()),
              "wall_s": time.time() - started, "gpu": gpu, "host": os.uname().nodename,
              "summary": json.loads(summary.read_text())}
    write_atomic(done_path(out_dir, name), json.dumps(record, indent=2))
    summary.unlink(missing_ok=True)
    return {**record, "skipped": False}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("night_dir", type=Path)
    p.add_argument("name")
    p.add_argument("--config", type=Path, default=None)
    args, extra = p.parse_known_args(argv)
    print(json.dumps(run_shard(args.night_dir, args.name, args.config, extra)))


if __name__ == "__main__":
    main()
