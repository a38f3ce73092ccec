#!/usr/bin/env bash
# Bring one deployment up or down with Docker compose: the bare engine (deploy/) or a case (case_<name>/).
#
# Usage: scripts/compose.sh up|down|logs|ps CASE      CASE: deploy, rag_chatbot, case_rag_chatbot, ...
#   up    docker compose up -d --wait (returns once every healthcheck passes; the first start converts the
#         default model into the model-cache volume)
#   down  stops and removes the containers; volumes stay (model cache, Prometheus data): `docker compose -f
#         FILE down -v` removes those too
# Images: ENGINE_IMAGE / PROMETHEUS_IMAGE / ... from the environment, else from the images.env that
# scripts/build_images.sh wrote, else the compose file's defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
action=${1:?usage: compose.sh up|down|logs|ps CASE}
case_name=${2:?usage: compose.sh up|down|logs|ps CASE}
case "$case_name" in
    deploy) file=deploy/docker-compose.yaml ;;
    case_*) file=$case_name/docker-compose.yaml ;;
    *) file=case_$case_name/docker-compose.yaml ;;
esac
[ -f "$file" ] || { echo "no compose file $file" >&2; exit 2; }
images_env=${SHARED_ENGINE_IMAGE_CACHE:-${SHARED_ENGINE_CACHE:-$HOME/.cache/shared_engine}/images}/images.env
if [ -f "$images_env" ]; then
    while IFS='=' read -r key value; do
        [ -n "$key" ] && [ -z "${!key:-}" ] && export "$key=$value"
    done < "$images_env"
fi
compose=(docker compose -f "$file")
case "$action" in
    up) "${compose[@]}" up -d --wait --wait-timeout "${WAIT_TIMEOUT:-900}" && "${compose[@]}" ps ;;
    down) "${compose[@]}" down --remove-orphans ;;
    logs) "${compose[@]}" logs --tail 100 ;;
    ps) "${compose[@]}" ps ;;
    *) echo "unknown action $action (up, down, logs, ps)" >&2; exit 2 ;;
esac
