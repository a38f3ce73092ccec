# Prometheus for machines with no registry: Debian's prometheus binary on the local Debian base.
# Real users run prom/prometheus instead (the compose files' default); both have /bin/prometheus as entrypoint
# and wget for the healthcheck. Build context: a folder holding `prometheus` (scripts/build_images.sh).
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
COPY prometheus /bin/prometheus
RUN mkdir -p /prometheus /etc/prometheus && chown 65534:65534 /prometheus
USER 65534:65534
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
