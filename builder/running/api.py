"""Talking to a running engine over its OpenAI-style HTTP API (and llama.cpp's own endpoints)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from builder.errors import StackError


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """urllib would send the API key on to wherever a redirect points: an engine never redirects."""

    def redirect_request(
        self, req: urllib.request.Request, fp: object, code: int, msg: str, headers: object, newurl: str
    ) -> None:
        return None


# No proxy either, whatever HTTP(S)_PROXY say (urllib bypasses none for loopback by default): a stack is
# local, and a proxy would get its API key and could fake what the engine answers (bench's figures).
_OPENER = urllib.request.build_opener(_NoRedirects, urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class EngineApi:
    port: int
    host: str = "127.0.0.1"
    api_key: str | None = None
    timeout_s: float = 300

    def get(self, path: str) -> str:
        """The body of GET `path` as text."""
        return self._send(urllib.request.Request(self._url(path), headers=self._headers())).decode(
            errors="replace"
        )

    def post(self, path: str, body: dict[str, object]) -> dict[str, Any]:
        """The JSON answer to POST `path` with the JSON `body`."""
        request = urllib.request.Request(
            self._url(path),
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **self._headers()},
        )
        answer = json.loads(self._send(request))
        if not isinstance(answer, dict):
            raise StackError(
                f"the engine on port {self.port} answered {path} with {type(answer).__name__}, not an object"
            )
        return answer

    def _url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}{path}"

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _send(self, request: urllib.request.Request) -> bytes:
        try:
            with _OPENER.open(request, timeout=self.timeout_s) as response:
                return response.read()
        except urllib.error.HTTPError as err:
            if 300 <= err.code < 400:
                raise StackError(
                    f"port {self.port} answered {request.full_url} with a redirect (HTTP {err.code}) to "
                    f"{err.headers.get('Location')}: not followed, the API key stays here; is the engine "
                    "on that port?"
                ) from None
            hint = (
                "pass the stack's API key (--api-key-file)"
                if err.code == 401
                else "see `docker compose logs`"
            )
            raise StackError(
                f"the engine on port {self.port} answered HTTP {err.code} to {request.full_url}; {hint}"
            ) from None
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise StackError(
                f"nothing answered on port {self.port} ({err}); start the stack with `moe-stack up` first"
            ) from None
