"""Registry credentials stay with the registry: never across a redirect, never to a plain-http token
realm on another origin; tag pagination stays on the registry's origin, stops on a loop and is capped.
Real HTTP servers on loopback addresses play the registry, a token realm and a redirect target."""

from __future__ import annotations

import base64
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from builder.distribute import registry
from builder.distribute.registry import RegistryError, list_tags, repository

LOGIN = base64.b64encode(b"alice:s3cret").decode()
Handler = Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]]


class Server:
    """A loopback HTTP server answering with `handle`, recording each request's path and headers."""

    def __init__(self, host: str, handle: Handler) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        outer = self

        class _Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                outer.seen.append((self.path, dict(self.headers)))
                status, headers, body = handle(self)
                self.send_response(status)
                for key, value in headers.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer((host, 0), _Handler)
        self.origin = f"http://{host}:{self.httpd.server_port}"
        self.host = f"{host}:{self.httpd.server_port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def authorizations(self) -> list[str]:
        return [headers["Authorization"] for _, headers in self.seen if "Authorization" in headers]


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.httpd.shutdown()


def _login_for(host: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".docker").mkdir()
    (tmp_path / ".docker/config.json").write_text(json.dumps({"auths": {host: {"auth": LOGIN}}}))
    monkeypatch.setenv("HOME", str(tmp_path))


def _tags(body: list[str], extra: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    return 200, {"Content-Type": "application/json", **(extra or {})}, json.dumps({"tags": body}).encode()


def test_basic_login_never_goes_to_a_plain_http_realm_elsewhere(
    servers: list[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    realm = Server("127.0.0.2", lambda h: (200, {}, b'{"token": "anonymous"}'))
    servers.append(realm)

    def handle(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if h.headers.get("Authorization") == "Bearer anonymous":
            return _tags(["a"])
        return 401, {"WWW-Authenticate": f'Bearer realm="{realm.origin}/token",service="reg"'}, b""

    reg = Server("127.0.0.1", handle)
    servers.append(reg)
    _login_for(reg.host, tmp_path, monkeypatch)
    assert list_tags(repository(f"{reg.host}/ns/repo")) == ["a"]
    assert realm.seen and realm.authorizations() == [], "the login went to another origin over plain http"


def test_basic_login_goes_to_the_registrys_own_realm(
    servers: list[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def handle(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if h.path.startswith("/token"):
            return 200, {}, b'{"token": "granted"}'
        if h.headers.get("Authorization") == "Bearer granted":
            return _tags(["b"])
        return 401, {"WWW-Authenticate": f'Bearer realm="{reg.origin}/token"'}, b""

    reg = Server("127.0.0.1", handle)
    servers.append(reg)
    _login_for(reg.host, tmp_path, monkeypatch)
    assert list_tags(repository(f"{reg.host}/ns/repo")) == ["b"]
    assert f"Basic {LOGIN}" in reg.authorizations()


def test_credentials_are_not_carried_across_a_redirect(
    servers: list[Server], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    elsewhere = Server("127.0.0.3", lambda h: _tags(["c"]))
    servers.append(elsewhere)

    def handle(h: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        if "Authorization" not in h.headers:
            return 401, {"WWW-Authenticate": 'Basic realm="reg"'}, b""
        return 302, {"Location": f"{elsewhere.origin}/v2/ns/repo/tags/list"}, b""

    reg = Server("127.0.0.1", handle)
    servers.append(reg)
    _login_for(reg.host, tmp_path, monkeypatch)
    assert list_tags(repository(f"{reg.host}/ns/repo")) == ["c"]
    assert reg.authorizations() == [f"Basic {LOGIN}"]
    assert elsewhere.authorizations() == [], "the Basic login followed the redirect to another host"


def test_tag_pages_stay_on_the_registry(servers: list[Server]) -> None:
    reg = Server(
        "127.0.0.1", lambda h: _tags(["d"], {"Link": '<http://127.0.0.4:9/v2/x/tags/list>; rel="next"'})
    )
    servers.append(reg)
    with pytest.raises(RegistryError, match="next page of tags to another host"):
        list_tags(repository(f"{reg.host}/ns/repo"))


def test_tag_pages_stop_on_a_loop_and_at_the_cap(
    servers: list[Server], monkeypatch: pytest.MonkeyPatch
) -> None:
    looping = Server("127.0.0.1", lambda h: _tags(["e"], {"Link": f'<{h.path}>; rel="next"'}))
    servers.append(looping)
    assert list_tags(repository(f"{looping.host}/ns/repo")) == ["e"]
    assert len(looping.seen) == 1
    counter = iter(range(10_000))
    endless = Server(
        "127.0.0.1",
        lambda h: _tags(["f"], {"Link": f'</v2/ns/repo/tags/list?last={next(counter)}>; rel="next"'}),
    )
    servers.append(endless)
    monkeypatch.setattr(registry, "_MAX_TAG_PAGES", 5)
    assert list_tags(repository(f"{endless.host}/ns/repo")) == ["f"] * 5
