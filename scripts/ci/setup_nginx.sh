#!/usr/bin/env bash
# nginx from Debian on the CI host, for the coding-agent case's router tests (tests/coding_agent/
# test_routing_and_summary.py checks the measured runs' nginx config with `nginx -t`; loadtest/run_case.py
# starts the same nginx on loopback). Usage: setup_nginx.sh ENV_FILE. Idempotent. .ci/run sets the variable
# below before running this script, so those tests fail (instead of skipping) if this set-up fails.
# ci-require: SHARED_ENGINE_REQUIRE_NGINX
set -euo pipefail
: "${1:?usage: setup_nginx.sh ENV_FILE}"
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || echo "apt-get update reported errors (unreachable extra sources?); going on"
    apt-get install -y -qq --no-install-recommends nginx-light >/dev/null
fi
/usr/sbin/nginx -v
