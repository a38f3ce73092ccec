#!/bin/sh
# The official postgres image's contract, reduced to what the batch case uses: on an empty $PGDATA, initdb
# with POSTGRES_USER (password POSTGRES_PASSWORD, scram-sha-256 over TCP, trust on the local socket) and
# create POSTGRES_DB; then exec the command (`postgres ...`), listening on all addresses.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --username="$POSTGRES_USER" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --no-instructions -D "$PGDATA" >/dev/null
    rm -f "$pwfile"
    printf "host all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n" >> "$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\" OWNER \"$POSTGRES_USER\";" \
            | postgres --single -D "$PGDATA" -c listen_addresses='' postgres >/dev/null
    fi
fi
if [ "${1:-}" = postgres ]; then
    shift
    exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
fi
exec "$@"
