# Airflow 3 for the batch case (case_batch_summarisation): the engine image plus Airflow in a virtual
# environment of its own (/opt/airflow; it pins its own FastAPI, which must not replace the server's), and the
# case's package. A shard task runs `/opt/venv/bin/python -m shared_engine run-batch` (the engine image's own
# environment) in the LocalExecutor's task process, so the scheduler container is also the batch worker.
# No network in the build.
#
# Build context (scripts/build_images.sh --case batch_summarisation): deps/ (the wheels of
# apache-airflow[postgres] at the Makefile's AIRFLOW_VERSION, requirements.txt naming it) and
# src/case_batch_summarisation/ (the case's package: dags/, batch/, tickets/, the engine configs) and profiles/
# (shared_engine/sim/hardware_profiles: the night report's GPU prices).
ARG ENGINE_IMAGE=shared-engine:cpu

# Stage 1: the wheelhouse, only ever mounted into the next stage.
FROM scratch AS wheelhouse
COPY deps/ /deps/

FROM ${ENGINE_IMAGE}
USER root
# The base's own python3 (the engine's /opt/venv comes first on PATH): Airflow must not share its packages.
RUN --mount=type=bind,from=wheelhouse,source=/deps,target=/wheels/deps \
    /usr/bin/python3 -m venv /opt/airflow \
 && /opt/airflow/bin/pip install --no-cache-dir --no-compile --no-index --find-links /wheels/deps \
        -r /wheels/deps/requirements.txt \
 && /opt/airflow/bin/pip check
COPY src/ /srv/
COPY profiles/ /opt/hardware_profiles/
# AIRFLOW_HOME holds only logs and the generated config: the metadata lives in Postgres, the nights on a volume.
ENV PATH=/opt/airflow/bin:/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONPATH=/srv \
    AIRFLOW_HOME=/opt/airflow-home \
    HOME=/opt/airflow-home \
    AIRFLOW__CORE__DAGS_FOLDER=/srv/case_batch_summarisation/dags \
    AIRFLOW__CORE__LOAD_EXAMPLES=False \
    BATCH_ENGINE_PYTHON=/opt/venv/bin/python \
    BATCH_NIGHTS_DIR=/data/nights \
    BATCH_HARDWARE_PROFILES=/opt/hardware_profiles
# The import check writes the bytecode of the modules every component loads (and a config and logs/ that are
# then removed); AIRFLOW_HOME and /data/nights are owned by the runtime user, so a fresh named volume mounted
# there is writable.
# Airflow needs the runtime uid to have a user name (the engine image has none for 1000).
RUN airflow version && python -c "import airflow.sdk, psycopg2, case_batch_summarisation.batch.worker" \
 && rm -rf /opt/airflow-home && mkdir -p /opt/airflow-home /data/nights \
 && chown 1000:1000 /opt/airflow-home /data/nights \
 && if ! getent passwd 1000 >/dev/null; then \
        echo "airflow:x:1000:1000:Airflow:/opt/airflow-home:/bin/sh" >> /etc/passwd; fi \
 && if ! getent group 1000 >/dev/null; then echo "airflow:x:1000:" >> /etc/group; fi
USER 1000:1000
WORKDIR /opt/airflow-home
EXPOSE 8080
ENTRYPOINT ["airflow"]
CMD ["version"]
