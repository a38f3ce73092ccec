"""`python -m case_multilora.app serve [--host H] [--port P]`: the gateway, configured from the environment
(settings.py: ENGINE_URL, ENGINE_API_KEY, TENANTS_FILE, LIMITS_STORAGE_URI, GATEWAY_CACHE_SALT_SECRET, ...)."""

from __future__ import annotations

import argparse
import logging
import sys

from .settings import GatewaySettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m case_multilora.app", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the gateway")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(asctime)s %(name)s: %(message)s")
    import uvicorn

    from .server import create_app

    uvicorn.run(create_app(GatewaySettings.from_env()), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
