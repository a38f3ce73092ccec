# PostgreSQL for machines with no registry: Debian's postgresql-15 on the local Debian base, for the batch case's
# Airflow metadata database. Real users run the official postgres image instead (the compose file's default,
# POSTGRES_IMAGE); this one takes the same POSTGRES_USER / POSTGRES_PASSWORD / POSTGRES_DB / PGDATA settings
# and arguments (`postgres -p PORT ...`), and has pg_isready for the healthcheck.
# Build context: a folder holding postgres-entrypoint.sh (scripts/build_images.sh). The build fetches the
# packages from the base's Debian archive (`--network host`), the one network use of the CPU builds.
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql-15 >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
RUN chmod 0755 /usr/local/bin/postgres-entrypoint.sh \
 && mkdir -p "$PGDATA" /var/run/postgresql \
 && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
 && chmod 0700 "$PGDATA"
USER postgres
EXPOSE 5432
ENTRYPOINT ["postgres-entrypoint.sh"]
CMD ["postgres"]
