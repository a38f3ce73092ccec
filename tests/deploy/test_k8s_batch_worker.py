"""The batch case's k8s shard pod runs the case's shard worker from the batch-worker ConfigMap: the files
the Job mounts are enough to import it (a copy laid out as the pod sees it, site-packages off), and that
copy writes the done record after the output and skips the shard on a rerun, as compose and dag.test do.
The engine is a stand-in (`shared_engine` run-batch that copies custom_ids): the pod's engine image is not
what is tested here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "case_batch_summarisation" / "k8s"

FAKE_RUN_BATCH = '''
import json, sys
args = sys.argv[1:]
assert args[0] == "run-batch", args
src, out, summary = (args[args.index(flag) + 1] for flag in ("-i", "-o", "--summary-json"))
rows = [json.loads(line) for line in open(src)]
with open(out, "w") as f:
    for r in rows:
        f.write(json.dumps({"custom_id": r["custom_id"], "response": {"status_code": 200}}) + "\\n")
open(summary, "w").write(json.dumps({"num_rows": len(rows)}))
open(out + ".runs", "a").write("1")
'''


def job_and_generators():
    k = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    job = yaml.safe_load((K8S / "base" / "job-summarise-shards.yaml").read_text())
    gens = {g["name"]: dict(f.split("=", 1) for f in g["files"]) for g in k["configMapGenerator"]}
    return job, gens


def pod_layout(tmp: Path) -> tuple[Path, list[str], dict]:
    """The case-code volume as the pod sees it under `tmp` (mount path kept); the container's command; env."""
    job, gens = job_and_generators()
    pod = job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    volume = next(v for v in pod["volumes"] if v["name"] == "case-code")
    mount = next(m for m in c["volumeMounts"] if m["name"] == "case-code")
    files = gens[volume["configMap"]["name"]]
    root = tmp / mount["mountPath"].lstrip("/")
    for item in volume["configMap"]["items"]:
        dst = root / item["path"]
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((K8S / "base" / files[item["key"]]).resolve().read_bytes())
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["PYTHONPATH"] == mount["mountPath"]
    return root, c["command"] + c["args"], env


def test_every_mounted_file_is_the_repos_and_the_worker_imports_are_mounted(tmp_path):
    root, _, _ = pod_layout(tmp_path)
    mounted = {p.relative_to(root).as_posix() for p in root.rglob("*.py")}
    worker = (REPO / "case_batch_summarisation" / "batch" / "worker.py").read_text()
    for line in worker.splitlines():
        if line.startswith("from case_batch_summarisation."):
            module = line.split()[1].replace(".", "/") + ".py"
            assert module in mounted, module
    for rel in mounted:
        assert (root / rel).read_bytes() == (REPO / rel).read_bytes(), rel


def test_the_pods_worker_writes_the_done_record_and_skips_a_finished_shard(tmp_path):
    root, command, env = pod_layout(tmp_path)
    (root / "shared_engine").mkdir()
    (root / "shared_engine" / "__init__.py").write_text("")
    (root / "shared_engine" / "__main__.py").write_text(FAKE_RUN_BATCH)
    night = tmp_path / "data" / "nights" / env["NIGHT"]
    (night / "shards").mkdir(parents=True)
    rows = [{"custom_id": f"t-{i}", "method": "POST", "url": "/v1/chat/completions", "body": {}} for i in range(3)]
    (night / "shards" / "shard-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the container's shell line, with this test's paths and python (-S: nothing from site-packages)
    script = command[-1].replace("/data/nights", str(tmp_path / "data" / "nights")).replace(
        "python -m", f"{sys.executable} -S -m")
    run_env = {"PATH": os.environ["PATH"], **env, "PYTHONPATH": str(root), "JOB_COMPLETION_INDEX": "1",
               "BATCH_ENGINE_PYTHON": sys.executable}
    for attempt in range(2):
        p = subprocess.run(command[:-1] + [script], env=run_env, cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 0, p.stderr
        record = json.loads(p.stdout)
        assert record["skipped"] is (attempt == 1)
    out = night / "out"
    done = json.loads((out / "shard-00001.done.json").read_text())
    assert done["num_rows"] == 3 and done["summary"] == {"num_rows": 3}
    assert (out / "shard-00001.jsonl.runs").read_text() == "1"  # the rerun did not run the engine again
    ids = [json.loads(line)["custom_id"] for line in (out / "shard-00001.jsonl").read_text().splitlines()]
    assert ids == [r["custom_id"] for r in rows]
