"""A loopback HTTP server standing in for the internet in the browser tests: it records every
request's path and answers with a page that would pass for part of the notebook (and tells
the page it ran, if a frame navigated to it). A module of its own, imported by name.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator
from typing import Any


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        body = (b"<!doctype html><title>x</title><h1 style='font:40px sans-serif'>"
                b"ATTACKER PAGE: looks like part of the notebook</h1><script>"
                b"parent.postMessage({sandboxFrameHeight: 1500}, '*');"
                b"top.postMessage({pwned: 'navigated:' + location.pathname}, '*')</script>")
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def loopback_sink() -> Iterator[Any]:
    """The server, with `.seen` (request paths, in order) and `.base` (its URL)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    server.seen = []  # type: ignore[attr-defined]
    server.base = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
