"""An app served by a real uvicorn (HTTP parsing included) in a thread of the test process."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import httpx


@contextlib.contextmanager
def serve_in_thread(app, **uvicorn_options):
    """Yields the base URL of `app` served by uvicorn on a free 127.0.0.1 port; stops it afterwards."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           **uvicorn_options))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        with contextlib.suppress(httpx.HTTPError):
            httpx.get(url + "/health", timeout=1)
            break
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(20)
