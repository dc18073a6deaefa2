"""A small local stand-in for the Hugging Face hub's HTTP API (what huggingface_hub's model_info and
snapshot_download call), pointed at with HF_ENDPOINT: a repository's file list with LFS sha256 and
sizes, and `resolve` downloads with Range (resume). It can cut a download off once, or serve other
bytes than the sha256 it lists."""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    repo: str
    files: dict[str, bytes]
    cut_after: int | None = None  # GETs from the start stop after this many bytes, `cuts` times
    cuts: int = 0
    corrupt: set[str] = field(default_factory=set)  # files served with one byte flipped
    ranges: list[int] = field(default_factory=list)  # the start of every ranged GET seen
    commit: str = COMMIT  # what it answers as the repository's commit (a hostile hub: anything)
    raw_listing: bytes | None = None  # an answer that is not the hub's JSON
    authorizations: list[str] = field(default_factory=list)  # every Authorization header it was sent
    url: str = ""

    def tree(self) -> list[dict[str, object]]:
        return [_tree_entry(name, data) for name, data in self.files.items()]

    def listing(self) -> dict[str, object]:
        return {
            "id": self.repo,
            "modelId": self.repo,
            "sha": self.commit,
            "private": False,
            "siblings": [
                {
                    "rfilename": name,
                    "size": len(data),
                    "lfs": {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 134,
                    },
                }
                for name, data in self.files.items()
            ],
        }


def _tree_entry(name: str, data: bytes) -> dict[str, object]:
    return {
        "type": "file",
        "path": name,
        "size": len(data),
        "oid": hashlib.sha1(data).hexdigest(),
        "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
    }


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    resolve = re.compile(rf"^/{re.escape(hub.repo)}/resolve/[^/]+/(?P<name>.+)$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.headers.get("Authorization"):
                hub.authorizations.append(self.headers["Authorization"])
            path = self.path.split("?")[0]
            if path.startswith(f"/api/models/{hub.repo}"):
                body = (
                    hub.raw_listing or json.dumps(hub.tree() if "/tree/" in path else hub.listing()).encode()
                )
                self._headers(200, {"Content-Type": "application/json", "Content-Length": str(len(body))})
                self.wfile.write(body)
                return
            self._file(path, send=True)

        def do_HEAD(self) -> None:
            self._file(self.path.split("?")[0], send=False)

        def _file(self, path: str, send: bool) -> None:
            match = resolve.match(path)
            if match is None or match["name"] not in hub.files:
                self._headers(404, {"Content-Length": "0", "X-Error-Code": "EntryNotFound"})
                return
            name = match["name"]
            data = hub.files[name]
            if name in hub.corrupt:
                data = bytes([data[0] ^ 0xFF]) + data[1:]
            digest = hashlib.sha256(hub.files[name]).hexdigest()
            start = int(re.match(r"bytes=(\d+)-", self.headers.get("Range", "bytes=0-"))[1])  # type: ignore[index]
            headers = {
                "X-Repo-Commit": hub.commit,
                "ETag": f'"{digest}"',
                "X-Linked-Etag": f'"{digest}"',
                "X-Linked-Size": str(len(data)),
                "Accept-Ranges": "bytes",
                "Content-Length": str(len(data) - start),
            }
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._headers(206 if start else 200, headers)
            if not send:
                return
            hub.ranges.append(start)
            body = data[start:]
            if hub.cut_after is not None and hub.cuts > 0 and not start and len(body) > hub.cut_after:
                hub.cuts -= 1
                self.wfile.write(body[: hub.cut_after])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

        def _headers(self, status: int, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()

    return Handler


@contextmanager
def serve(hub: Hub) -> Iterator[Hub]:
    """The hub on a free loopback port; hub.url is its HF_ENDPOINT."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
