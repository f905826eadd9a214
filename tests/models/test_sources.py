"""`qace.models.sources.reachable`: which hosts answer, asked once each, on loopback."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from qace.models.sources import reachable


class Handler(BaseHTTPRequestHandler):
    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/here" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_reachable_counts_any_answer_and_a_closed_port_as_none() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    with socket.socket() as probe:  # a free loopback port, closed again
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        urls = [f"{base}/here", f"{base}/not-here", f"http://127.0.0.1:{closed}/", "not a url"]
        assert reachable(urls) == dict(zip(urls, [True, True, False, False], strict=True))
    finally:
        server.shutdown()
        server.server_close()
