# nginx for machines with no registry: Debian's nginx package (its /usr/sbin/nginx, extracted by
# scripts/build_images.sh) on the local Debian base, whose libraries (libc, libcrypt, libpcre2-8, libssl3,
# zlib) it links against. Real users may run the distribution's own `debian:bookworm` + `apt-get install
# nginx` or the official nginx image instead: the case's config (case_coding_agent/docker-compose.yaml) only
# needs the upstream `hash ... consistent` directive, in every nginx since 1.7.2.
# Build context: a folder holding `nginx` (the binary).
ARG BASE_IMAGE=local/debian:bookworm
FROM ${BASE_IMAGE}
COPY nginx /usr/sbin/nginx
RUN mkdir -p /etc/nginx /var/lib/nginx /var/log/nginx /run && /usr/sbin/nginx -V
EXPOSE 8000
ENTRYPOINT ["/usr/sbin/nginx", "-g", "daemon off;"]
CMD ["-c", "/etc/nginx/nginx.conf"]
