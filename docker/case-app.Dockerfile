# A case's own service (e.g. the RAG app and its Chroma server): the engine image plus the wheels of the
# case's pyproject extra and the case's app source. No network in the build.
#
# Build context (scripts/build_images.sh --case NAME): deps/ (the extra's wheels, requirements.txt listing
# the extra) and src/case_NAME/app/ (the source; the cases are not part of the project's wheel).
ARG ENGINE_IMAGE=shared-engine:cpu

# Stage 1: the wheelhouse, only ever mounted into the next stage.
FROM scratch AS wheelhouse
COPY deps/ /deps/

FROM ${ENGINE_IMAGE}
USER root
RUN --mount=type=bind,from=wheelhouse,source=/deps,target=/wheels/deps \
    /opt/venv/bin/pip install --no-cache-dir --no-index --find-links /wheels/deps -r /wheels/deps/requirements.txt
COPY src/ /srv/
ARG APP_MODULE
# idle OpenMP threads (the app's embedding model) sleep instead of spinning on cores the engine shares
ENV PYTHONPATH=/srv \
    APP_MODULE=${APP_MODULE} \
    OMP_WAIT_POLICY=PASSIVE
# /data: a server's data directory (Chroma's), owned by the runtime user so a fresh volume is writable.
RUN python -c "import importlib, os; importlib.import_module(os.environ['APP_MODULE'])" \
 && mkdir -p /data && chown 1000:1000 /data
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["sh", "-c", "exec python -m \"$APP_MODULE\" \"$@\"", "--"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
