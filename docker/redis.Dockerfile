# Redis for machines with no registry: Debian's redis-server on the local Debian base, for the multi-LoRA
# case's gateway limits (`limits` Redis storage). Real users run the official redis image instead (the compose
# file's default, REDIS_IMAGE); both take `redis-server ARGS` and have redis-cli for the healthcheck.
# The build fetches the package from the base's Debian archive (`--network host`).
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \
 && mkdir -p /data && chown redis:redis /data
USER redis
WORKDIR /data
EXPOSE 6379
ENTRYPOINT ["redis-server"]
CMD ["--save", "", "--appendonly", "no"]
