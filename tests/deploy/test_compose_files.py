"""Every compose file in the repository (deploy/, case_*/) passes `docker compose config` and follows the deploy
conventions: host networking, a healthcheck and a restart policy on every long-running service (the engine's on
/health), the model cache in the named volume `model-cache`, and a Prometheus service scraping the engine (services
of every profile).
Needs only the compose CLI (no engine); skips without it unless SHARED_ENGINE_REQUIRE_DOCKER=1, then fails."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from tests.deploy.docker_helpers import REPO, compose_problem, require

COMPOSE_FILES = sorted([REPO / "deploy" / "docker-compose.yaml", *REPO.glob("case_*/docker-compose.yaml")])


def rel(path):
    return str(path.relative_to(REPO))


def compose_config(path) -> dict:
    require(compose_problem())
    # every profile's services (the batch case's online engine and its Prometheus are in the `online` profile)
    out = subprocess.run(["docker", "compose", "-f", str(path), "--profile", "*", "config", "--format", "json"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def one_shot(service: dict) -> bool:
    return service.get("restart", "no") == "no"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=rel)
def test_compose_config_and_conventions(path):
    config = compose_config(path)
    services = config["services"]
    assert "prometheus" in services and "engine" in services
    for name, service in services.items():
        assert service.get("network_mode") == "host", f"{name}: network_mode host"
        if not one_shot(service):
            assert service["restart"] in ("unless-stopped", "always", "on-failure"), name
            assert service.get("healthcheck", {}).get("test"), f"{name}: a healthcheck"
    engine = services["engine"]
    assert any("/health" in part for part in engine["healthcheck"]["test"])
    assert any(v["type"] == "volume" and v["source"] == "model-cache" and v["target"] == "/models"
               for v in engine["volumes"])
    assert "model-cache" in config["volumes"]
    assert any(dep.get("condition") == "service_completed_successfully"
               for dep in engine.get("depends_on", {}).values()), "the model is prepared before the engine starts"


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=rel)
def test_prometheus_scrapes_the_engine_port(path):
    config = compose_config(path)
    scrape = yaml.safe_load(config["configs"]["prometheus-config"]["content"])
    targets = [t for job in scrape["scrape_configs"] for group in job["static_configs"] for t in group["targets"]]
    engine_port = config["services"]["engine"]["command"]
    port = engine_port[engine_port.index("--port") + 1]
    assert f"127.0.0.1:{port}" in targets, (targets, port)
