#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the RAG chat page test (tests/rag/test_chat_page.py), from Debian.
# Usage: setup_chromium.sh ENV_FILE. Idempotent. .ci/run sets the variable below before running this script,
# so the page test fails (instead of skipping) if this set-up fails or Chromium is then missing.
# ci-require: SHARED_ENGINE_REQUIRE_CHROMIUM
set -euo pipefail
: "${1:?usage: setup_chromium.sh ENV_FILE}"
if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq || echo "apt-get update reported errors (unreachable extra sources?); going on"
    apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null
fi
chromium --version
chromedriver --version
