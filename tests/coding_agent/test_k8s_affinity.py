"""Session affinity on Kubernetes: ingress-nginx's `upstream-hash-by` in the case's manifests hashes the same
header that the load test and the replay send (X-Session-Id) and that the compose file's nginx hashes, and it
routes to the engine Service's named port, whose selector matches the engine pods. Schema validation of the
same files is tests/deploy/test_k8s_manifests.py; this checks what the schema cannot: that the routing key is
the session and that nothing in front of it overrides it per overlay."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from case_coding_agent.router import POLICIES

CASE = Path(__file__).resolve().parents[2] / "case_coding_agent"
HASH_BY = "nginx.ingress.kubernetes.io/upstream-hash-by"


def _docs(folder: Path) -> list[dict]:
    return [d for p in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _sent_header() -> set[str]:
    """The session header each client of the case sends (replay and locust user)."""
    found = set()
    for path in (CASE / "loadtest" / "replay.py", CASE / "loadtest" / "locustfile.py"):
        found |= set(re.findall(r'headers=\{"([^"]+)": *\w+', path.read_text()))
    return found


def test_ingress_hashes_the_session_header_the_clients_send():
    ingresses = [d for d in _docs(CASE / "k8s" / "base") if d["kind"] == "Ingress"]
    assert len(ingresses) == 1
    ingress = ingresses[0]
    hash_by = ingress["metadata"]["annotations"][HASH_BY]
    headers = _sent_header()
    assert headers == {"X-Session-Id"}
    # nginx's variable for a request header: $http_ + the name lower-cased with '-' as '_'
    assert hash_by == "$http_" + next(iter(headers)).lower().replace("-", "_")
    # the same key as the compose file's nginx (router.py writes its upstream block)
    assert POLICIES["session_hash"] == f"hash {hash_by} consistent;"
    assert "hash $http_x_session_id consistent;" in (CASE / "docker-compose.yaml").read_text()
    # a stream must not be buffered behind the hash (the agent streams its edits)
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"


def test_ingress_routes_to_the_engine_pods():
    docs = _docs(CASE / "k8s" / "base")
    ingress = next(d for d in docs if d["kind"] == "Ingress")
    service = next(d for d in docs if d["kind"] == "Service")
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    backends = [p["backend"]["service"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    assert backends and all(b["name"] == service["metadata"]["name"] for b in backends)
    port_names = {p["name"] for p in service["spec"]["ports"]}
    assert all(b["port"]["name"] in port_names for b in backends)
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container_ports = {p["name"] for c in deployment["spec"]["template"]["spec"]["containers"]
                       for p in c.get("ports", [])}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= container_ports


def test_no_overlay_drops_the_affinity():
    """The cpu and gpu overlays patch the Deployment and the ScaledObject only: no patch (strategic merge or JSON
    6902, inline or in a file) targets the Ingress or names its annotation, so both deploy the hash."""
    for overlay in ("cpu", "gpu"):
        folder = CASE / "k8s" / overlay
        kustomization = yaml.safe_load((folder / "kustomization.yaml").read_text())
        assert kustomization["resources"] == ["../base"]
        for patch in kustomization.get("patches", []) + kustomization.get("patchesStrategicMerge", []):
            if isinstance(patch, str):
                patch = {"path": patch}
            assert patch.get("target", {}).get("kind") != "Ingress", (overlay, patch)
            body = (folder / patch["path"]).read_text() if "path" in patch else patch.get("patch", "")
            assert "upstream-hash-by" not in body and "kind: Ingress" not in body, (overlay, patch)
