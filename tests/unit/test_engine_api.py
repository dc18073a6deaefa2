"""The one HTTP client of running engines (running.api): a redirect is never followed with the API key."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from builder.errors import StackError
from builder.running.api import EngineApi


@contextmanager
def _server(seen: list[str], redirect_to: str | None) -> Iterator[int]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            seen.append(f"{self.path} {self.headers.get('Authorization')}")
            if redirect_to is not None and self.path == "/health":
                self.send_response(302)
                self.send_header("Location", redirect_to)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_a_redirect_is_not_followed_with_the_key() -> None:
    seen: list[str] = []
    with _server(seen, None) as other, _server(seen, f"http://127.0.0.1:{other}/steal") as port:
        with pytest.raises(
            StackError, match=r"with a redirect \(HTTP 302\) .*not followed, the API key stays here"
        ):
            EngineApi(port, api_key="s3cret").get("/health")
        assert EngineApi(other, api_key="s3cret").get("/health") == "ok"
    assert seen == ["/health Bearer s3cret", "/health Bearer s3cret"], "nothing reached /steal"
