"""The nginx config in front of the engine replicas: `hash $http_x_session_id consistent;` (the fix: every
turn of a session on one replica) or nginx's default round-robin (the first attempt).

Used by loadtest/run_case.py (an nginx started on loopback) and mirrored by docker-compose.yaml's inline
config. `X-Upstream-Addr` in every response names the replica that served it.
"""

from __future__ import annotations

POLICIES = {"session_hash": "hash $http_x_session_id consistent;", "round_robin": ""}


def nginx_conf(upstreams: list[str], port: int, policy: str, prefix: str = "/tmp") -> str:
    """nginx.conf text. `upstreams`: host:port of each replica; `port`: loopback port nginx listens on;
    `prefix`: a writable folder for the pid file and temp paths. Raises ValueError on an unknown policy."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {sorted(POLICIES)}, got {policy!r}")
    servers = "\n".join(f"        server {u};" for u in upstreams)
    return f"""worker_processes 1;
pid {prefix}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 1024; }}
http {{
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    log_format upstream '$remote_addr "$request" $status upstream=$upstream_addr session=$http_x_session_id '
                        'request_time=$request_time';
    access_log {prefix}/access.log upstream;
    upstream engines {{
        {POLICIES[policy]}
{servers}
        keepalive 16;
    }}
    server {{
        listen 127.0.0.1:{port};
        client_max_body_size 16m;
        location = /nginx-health {{ return 200 "ok\\n"; }}
        location / {{
            proxy_pass http://engines;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 3600s;
            add_header X-Upstream-Addr $upstream_addr always;
        }}
    }}
}}
"""
