"""Kubernetes manifests, file by file: every built-in object in any `k8s/` folder of the repository (deploy/k8s,
case_*/k8s, ...) validates with kubernetes-validate --strict against Kubernetes 1.30, every KEDA object against
the JSON schema kept in deploy/k8s/schemas/, and every k8s folder follows the deploy conventions: one object
per file named `<kind>-<name>.yaml`, a base kustomization listing each of them and generating the ConfigMap
from a config.yaml, `cpu` and `gpu` overlays, probes on /health, a /dev/shm memory volume, a model-cache PVC,
a PodDisruptionBudget and a ScaledObject on `vllm:num_requests_waiting{model_name=...}`."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

kubernetes_validate = pytest.importorskip("kubernetes_validate")
jsonschema = pytest.importorskip("jsonschema")

REPO = Path(__file__).resolve().parents[2]
K8S_VERSION = "1.30"
SCHEMAS = REPO / "deploy" / "k8s" / "schemas"
KUSTOMIZE_KINDS = {"Kustomization", "Component"}
SKIP_DIRS = {".git", ".venv", "node_modules", "build", "dist", "__pycache__"}


def k8s_dirs() -> list[Path]:
    """Every folder named k8s in the repository (outside virtualenvs and hidden folders)."""
    found = []
    for root, dirs, _ in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith("."))
        if Path(root).name == "k8s":
            found.append(Path(root))
            dirs[:] = []
    return found


def yaml_files() -> list[Path]:
    return sorted(p for d in k8s_dirs() for p in d.rglob("*.y*ml") if p.suffix in (".yaml", ".yml"))


def is_object(doc) -> bool:
    return isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc and doc["kind"] not in KUSTOMIZE_KINDS


def objects() -> list[tuple[Path, dict]]:
    return [(p, doc) for p in yaml_files() for doc in yaml.safe_load_all(p.read_text()) if is_object(doc)]


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


def keda_schema(obj: dict) -> dict:
    version = obj["apiVersion"].split("/")[1]
    path = SCHEMAS / f"keda.sh-{version}-{obj['kind'].lower()}.json"
    assert path.exists(), f"no schema kept for {obj['apiVersion']} {obj['kind']} (expected {rel(path)})"
    return json.loads(path.read_text())


def validate(obj: dict) -> None:
    """Raises on an invalid object: KEDA kinds against the repo's schema, everything else as a built-in kind."""
    group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
    if group == "keda.sh":
        jsonschema.validate(obj, keda_schema(obj), cls=jsonschema.Draft202012Validator)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


OBJECTS = objects()


def test_the_repository_has_k8s_objects():
    assert (REPO / "deploy" / "k8s") in k8s_dirs()
    kinds = {obj["kind"] for _, obj in OBJECTS}
    assert {"Deployment", "Service", "PersistentVolumeClaim", "PodDisruptionBudget", "ScaledObject"} <= kinds


@pytest.mark.parametrize("path,obj", OBJECTS, ids=[f"{rel(p)}:{o['kind']}" for p, o in OBJECTS])
def test_object_validates(path, obj):
    validate(obj)


@pytest.mark.parametrize("path", yaml_files(), ids=rel)
def test_one_object_per_file_named_kind_dash_name(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    objs = [d for d in docs if is_object(d)]
    if not objs:  # a kustomization or a JSON patch
        assert len(docs) == 1, f"{rel(path)}: one document per file"
        return
    assert len(docs) == 1, f"{rel(path)}: one object per file, found {len(docs)} documents"
    obj = objs[0]
    assert path.name == f"{obj['kind'].lower()}-{obj['metadata']['name']}.yaml", rel(path)


def kustomizations() -> list[Path]:
    return sorted(p for d in k8s_dirs() for p in d.rglob("kustomization.yaml"))


@pytest.mark.parametrize("path", kustomizations(), ids=rel)
def test_kustomization_references_exist_and_list_every_object(path):
    k = yaml.safe_load(path.read_text())
    here = path.parent
    for entry in k.get("resources", []):
        target = here / entry
        assert target.exists(), f"{rel(path)}: resource {entry} does not exist"
    for patch in k.get("patches", []):
        assert "path" not in patch or (here / patch["path"]).exists(), f"{rel(path)}: {patch}"
    for generator in k.get("configMapGenerator", []):
        for item in generator.get("files", []):
            assert (here / item.split("=", 1)[-1]).exists(), f"{rel(path)}: {item}"
    listed = {(here / r).resolve() for r in k.get("resources", [])}
    for sibling in here.glob("*.yaml"):
        docs = list(yaml.safe_load_all(sibling.read_text()))
        if any(is_object(d) for d in docs):
            assert sibling.resolve() in listed, f"{rel(sibling)} is not listed in {rel(path)}"


def k8s_roots() -> list[Path]:
    """k8s folders laid out as base/ + cpu/ + gpu/ (every one must be)."""
    return [d for d in k8s_dirs() if any(d.rglob("kustomization.yaml"))]


def _base_kinds(root: Path) -> set[str]:
    return {kind for kind, _ in load_base(root)}


def serving_roots() -> list[Path]:
    """Roots that serve the engine over HTTP (an engine Deployment); batch cases run Jobs instead."""
    return [r for r in k8s_roots() if "Deployment" in _base_kinds(r)]


def batch_roots() -> list[Path]:
    """Roots that run the engine as Jobs (the batch case: one pod per shard)."""
    return [r for r in k8s_roots() if "Job" in _base_kinds(r) and "Deployment" not in _base_kinds(r)]


def load_base(root: Path) -> dict[tuple[str, str], dict]:
    k = yaml.safe_load((root / "base" / "kustomization.yaml").read_text())
    objs = {}
    for entry in k["resources"]:
        obj = yaml.safe_load((root / "base" / entry).read_text())
        objs[(obj["kind"], obj["metadata"]["name"])] = obj
    return objs


def apply_json_patch(doc: dict, ops: list[dict]) -> dict:
    """RFC 6902 add / replace / remove, enough for the overlays' patches."""
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
        node = doc
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        key = int(last) if isinstance(node, list) and last != "-" else last
        if op["op"] == "remove":
            del node[key]
        elif op["op"] == "replace":
            assert key in node or (isinstance(node, list) and key < len(node)), f"replace of a missing {op['path']}"
            node[key] = op["value"]
        elif op["op"] == "add":
            if isinstance(node, list):
                node.insert(len(node) if key == "-" else key, op["value"])
            else:
                node[key] = op["value"]
        else:
            raise AssertionError(f"unsupported op {op['op']}")
    return doc


def overlay(root: Path, name: str) -> dict[tuple[str, str], dict]:
    """The base's objects with the overlay's JSON patches applied (what kustomize renders, minus names)."""
    objs = load_base(root)
    k = yaml.safe_load((root / name / "kustomization.yaml").read_text())
    assert k["resources"] == ["../base"], f"{name} overlay builds on ../base"
    for patch in k.get("patches", []):
        target = patch["target"]
        ops = yaml.safe_load((root / name / patch["path"]).read_text())
        objs[(target["kind"], target["name"])] = apply_json_patch(objs[(target["kind"], target["name"])], ops)
    return objs


def engine_deployment(objs: dict) -> dict:
    deployments = [o for (kind, _), o in objs.items() if kind == "Deployment"]
    engines = [d for d in deployments
               if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    assert len(engines) == 1, "one Deployment labelled app.kubernetes.io/component: engine"
    return engines[0]


def container(deployment: dict, name: str) -> dict:
    return next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name)


@pytest.mark.parametrize("root", k8s_roots(), ids=rel)
def test_layout_base_cpu_gpu(root):
    for name in ("base", "cpu", "gpu"):
        assert (root / name / "kustomization.yaml").exists(), f"{rel(root)}/{name}/kustomization.yaml"
    base = yaml.safe_load((root / "base" / "kustomization.yaml").read_text())
    generated = [g for g in base.get("configMapGenerator", []) if any(
        f.split("=", 1)[-1].endswith("config.yaml") for f in g.get("files", []))]
    assert generated, "the base generates its ConfigMap from the case's config.yaml"


@pytest.mark.parametrize("root", serving_roots(), ids=rel)
def test_engine_conventions(root):
    objs = load_base(root)
    engine = engine_deployment(objs)
    pod = engine["spec"]["template"]["spec"]
    c = container(engine, "engine")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"]["path"] == "/health", probe
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "startup probe allows for model load"
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    claim = volumes[mounts["/models"]]["persistentVolumeClaim"]["claimName"]
    assert ("PersistentVolumeClaim", claim) in objs
    assert any(kind == "Service" for kind, _ in objs)
    selector = engine["spec"]["selector"]["matchLabels"]
    pdbs = [o for (kind, _), o in objs.items() if kind == "PodDisruptionBudget"]
    assert any(p["spec"]["selector"]["matchLabels"] == selector for p in pdbs), "a PDB covers the engine"
    scaled = [o for (kind, _), o in objs.items() if kind == "ScaledObject"
              and o["spec"]["scaleTargetRef"]["name"] == engine["metadata"]["name"]]
    assert len(scaled) == 1, "one ScaledObject targets the engine"
    trigger = scaled[0]["spec"]["triggers"][0]
    assert trigger["type"] == "prometheus"
    assert 'vllm:num_requests_waiting{model_name="' in trigger["metadata"]["query"]


def _selects(policy: dict, labels: dict) -> bool:
    wanted = policy["spec"]["podSelector"].get("matchLabels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


@pytest.mark.parametrize("root", serving_roots(), ids=rel)
def test_api_key_from_a_secret_and_a_network_policy(root):
    objs = load_base(root)
    engine = engine_deployment(objs)
    env = {e["name"]: e for e in container(engine, "engine").get("env", [])}
    ref = env["SHARED_ENGINE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"] and not ref.get("optional"), "the engine never starts without its key"
    for (kind, name), obj in objs.items():  # any key-like variable anywhere comes from a Secret
        if kind != "Deployment":
            continue
        for c in obj["spec"]["template"]["spec"].get("containers", []):
            for e in c.get("env", []):
                if e["name"].endswith("API_KEY"):
                    assert "value" not in e and e["valueFrom"]["secretKeyRef"] == ref, (name, e)
    labels = engine["spec"]["template"]["metadata"]["labels"]
    policies = [o for (kind, _), o in objs.items() if kind == "NetworkPolicy" and _selects(o, labels)]
    assert len(policies) == 1, "one NetworkPolicy selects the engine's pods"
    spec = policies[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"] and spec["ingress"], "ingress rules (not an allow-all policy)"
    port = container(engine, "engine")["ports"][0]["containerPort"]
    for rule in spec["ingress"]:
        assert rule["from"], "every rule names its sources"
        assert [p["port"] for p in rule["ports"]] == [port], "only the engine's port is admitted"


@pytest.mark.parametrize("root", serving_roots(), ids=rel)
def test_overlays_render_valid_objects_and_gpu_requests_a_gpu(root):
    for name in ("cpu", "gpu"):
        for obj in overlay(root, name).values():
            validate(obj)
    gpu = container(engine_deployment(overlay(root, "gpu")), "engine")["resources"]
    assert gpu["requests"]["nvidia.com/gpu"] == gpu["limits"]["nvidia.com/gpu"] == "1"
    cpu = container(engine_deployment(overlay(root, "cpu")), "engine")["resources"]
    assert "nvidia.com/gpu" not in {**cpu.get("requests", {}), **cpu.get("limits", {})}


def test_a_wrong_field_fails():
    deployment = yaml.safe_load((REPO / "deploy/k8s/base/deployment-engine.yaml").read_text())
    container(deployment, "engine")["readinesProbe"] = container(deployment, "engine").pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        validate(deployment)
    scaled = yaml.safe_load((REPO / "deploy/k8s/base/scaledobject-engine.yaml").read_text())
    for mutate, message in [
        (lambda s: s["spec"].update(maxReplicas=4), "maxReplicas"),               # the HPA's name, not KEDA's
        (lambda s: s["spec"]["triggers"][0]["metadata"].update(threshold=4), "4"),  # metadata values are strings
        (lambda s: s["spec"]["triggers"][0]["metadata"].update(treshold="4"), "treshold"),
        (lambda s: s["spec"]["scaleTargetRef"].pop("name"), "name"),
    ]:
        bad = copy.deepcopy(scaled)
        mutate(bad)
        with pytest.raises(jsonschema.ValidationError, match=message):
            validate(bad)


def kubectl() -> str | None:
    return os.environ.get("SHARED_ENGINE_KUBECTL") or shutil.which("kubectl")


@pytest.mark.skipif(kubectl() is None, reason="kubectl not installed (kustomize rendering is checked where it is)")
@pytest.mark.parametrize("overlay_dir", [r / n for r in k8s_roots() for n in ("cpu", "gpu")], ids=rel)
def test_kubectl_kustomize_renders_valid_objects(overlay_dir):
    out = subprocess.run([kubectl(), "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay_dir)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    wanted = {"ConfigMap", "Job"} if overlay_dir.parent in batch_roots() else {"ConfigMap", "Deployment",
                                                                                "ScaledObject"}
    assert wanted <= {d["kind"] for d in rendered}
    for obj in rendered:
        validate(obj)


def engine_job(objs: dict) -> dict:
    jobs = [o for (kind, _), o in objs.items() if kind == "Job"
            and o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"]
    assert len(jobs) == 1, "one Job labelled app.kubernetes.io/component: engine"
    return jobs[0]


def test_the_batch_case_has_k8s_objects():
    assert REPO / "case_batch_summarisation" / "k8s" in batch_roots()


@pytest.mark.parametrize("root", batch_roots(), ids=rel)
def test_batch_job_conventions(root):
    """One pod per shard (an Indexed Job), at least two at a time (the GPU workers the shards fan out
    across), each index retried on its own, the case's shard worker (run-batch, then the done record) on the
    shard of its index, the nights volume shared by every pod, /dev/shm in memory, the model cache and config
    mounted (test_k8s_batch_worker.py runs the mounted worker)."""
    objs = load_base(root)
    job = engine_job(objs)
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed" and spec["parallelism"] >= 2
    assert spec["backoffLimitPerIndex"] >= 1 and pod["restartPolicy"] == "Never"
    c = next(c for c in pod["containers"] if c["name"] == "engine")
    command = " ".join(c.get("command", []) + c.get("args", []))
    assert "case_batch_summarisation.batch.worker" in command and "JOB_COMPLETION_INDEX" in command
    assert "/data/nights/$NIGHT" in command and "/etc/shared-engine/config.yaml" in command
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    for path in ("/models", "/data/nights"):
        claim = volumes[mounts[path]]["persistentVolumeClaim"]["claimName"]
        assert objs[("PersistentVolumeClaim", claim)]["spec"]["accessModes"] == ["ReadWriteMany"], path
    assert volumes[mounts["/etc/shared-engine"]]["configMap"]["name"] == "engine-config"


@pytest.mark.parametrize("root", batch_roots(), ids=rel)
def test_batch_overlays_valid_and_one_gpu_per_shard_pod(root):
    for name in ("cpu", "gpu"):
        for obj in overlay(root, name).values():
            validate(obj)
    gpu = next(c for c in engine_job(overlay(root, "gpu"))["spec"]["template"]["spec"]["containers"]
               if c["name"] == "engine")["resources"]
    assert gpu["requests"]["nvidia.com/gpu"] == gpu["limits"]["nvidia.com/gpu"] == "1"
    cpu = next(c for c in engine_job(overlay(root, "cpu"))["spec"]["template"]["spec"]["containers"]
               if c["name"] == "engine")["resources"]
    assert "nvidia.com/gpu" not in {**cpu.get("requests", {}), **cpu.get("limits", {})}
