"""The registry's HTTP API (distribution v2 / OCI): tag lists and manifest digests, read directly so
pull can choose among what is published and publish can prove what landed.

Loopback registries are spoken to over plain HTTP (as Docker does), others over HTTPS. Token auth is
the anonymous bearer flow public registries (GHCR, Docker Hub) use for pulls, with the user's
`docker login` credentials when the registry asks for them.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from builder.errors import MoeStackError

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)
_LOOPBACK = re.compile(r"^(localhost|127\.[0-9.]+|\[::1\])(:[0-9]+)?$")
_TIMEOUT_S = 30
_MAX_TAG_PAGES = 100


class RegistryError(MoeStackError):
    """The registry could not be reached, refused us, or does not hold what was asked for."""


@dataclass(frozen=True)
class Repository:
    host: str  # e.g. ghcr.io or 127.0.0.1:5000
    path: str  # e.g. moe-stack/llama-cpp

    @property
    def name(self) -> str:
        return f"{self.host}/{self.path}"

    @property
    def base_url(self) -> str:
        scheme = "http" if _LOOPBACK.fullmatch(self.host) else "https"
        return f"{scheme}://{self.host}/v2/{self.path}"


def registry_host(name: str) -> str:
    """The registry host `name` (`HOST[/PATH]`) starts with; it must be explicit, as in every moe-stack
    tag."""
    host = name.partition("/")[0]
    if not ("." in host or ":" in host or host == "localhost"):
        raise RegistryError(
            f"{name!r} does not start with a registry host; write it like ghcr.io/OWNER or "
            "127.0.0.1:5000/moe-stack"
        )
    return host


def repository(name: str) -> Repository:
    """`HOST/PATH` (no tag) → Repository."""
    host, path = registry_host(name), name.partition("/")[2]
    if not path:
        raise RegistryError(
            f"{name!r} names a registry but no repository in it; write it like HOST/NAMESPACE/NAME"
        )
    return Repository(host=host, path=path)


def ping(host: str) -> None:
    """Fail clearly when nothing answers as a registry at `host` (an auth challenge counts as an answer)."""
    probe = Repository(host=host, path="")
    try:
        _open(probe, urllib.request.Request(probe.base_url.rstrip("/") + "/"), authenticate=False)
    except RegistryError as err:
        if "refused access" not in str(err):
            raise


def list_tags(repo: Repository) -> list[str]:
    """Every tag of `repo` ([] when the repository does not exist yet)."""
    url = f"{repo.base_url}/tags/list?n=10000"
    tags: list[str] = []
    seen: set[str] = set()
    while url:
        if url in seen or len(seen) >= _MAX_TAG_PAGES:
            break  # a loop, or more pages than any moe-stack repository has: what was read is enough
        seen.add(url)
        try:
            with _open(repo, urllib.request.Request(url)) as response:
                body = json.load(response)
                next_link = response.headers.get("Link", "")
        except RegistryError as err:
            if "no such repository" in str(err):
                return []
            raise
        tags += body.get("tags") or []
        match = re.search(r"<([^>]+)>;\s*rel=\"next\"", next_link)
        url = urllib.parse.urljoin(url, match[1]) if match else ""
        if url and _origin(url) != _origin(repo.base_url):
            raise RegistryError(
                f"registry {repo.host} sent the next page of tags to another host ({_origin(url)}); "
                "not followed"
            )
    return tags


def _origin(url: str) -> tuple[str, str]:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme, parts.netloc.lower()


def manifest_digest(repo: Repository, tag: str) -> str:
    """The digest the registry serves for `repo:tag` (what `docker pull repo@digest` fetches)."""
    request = urllib.request.Request(
        f"{repo.base_url}/manifests/{tag}", method="HEAD", headers={"Accept": MANIFEST_TYPES}
    )
    with _open(repo, request) as response:
        digest = response.headers.get("Docker-Content-Digest")
    if not digest:
        raise RegistryError(f"{repo.name}:{tag}: the registry sent no Docker-Content-Digest header")
    return digest


def _open(
    repo: Repository, request: urllib.request.Request, authenticate: bool = True
) -> http.client.HTTPResponse:
    try:
        return urllib.request.urlopen(request, timeout=_TIMEOUT_S)
    except urllib.error.HTTPError as err:
        if err.code == 401 and authenticate and not request.has_header("Authorization"):
            # Unredirected: urllib copies ordinary headers onto a redirect (to another host, or https to
            # http); credentials must stay with the request they were made for.
            request.add_unredirected_header(
                "Authorization", _credentials(repo, err.headers.get("WWW-Authenticate", ""))
            )
            return _open(repo, request, authenticate=False)
        raise _http_error(repo, err) from None
    except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        reason = getattr(err, "reason", err)
        raise RegistryError(
            f"registry {repo.host} is unreachable ({reason}); check the address, or start it"
        ) from None


def _http_error(repo: Repository, err: urllib.error.HTTPError) -> RegistryError:
    if err.code in (401, 403):
        return RegistryError(
            f"registry {repo.host} refused access to {repo.path or '/v2/'} (HTTP {err.code}); "
            f"run `docker login {repo.host}` with an account that may read it"
        )
    if err.code == 404:
        return RegistryError(f"{repo.name}: no such repository or tag on the registry")
    return RegistryError(f"registry {repo.host} answered HTTP {err.code} for {err.url}")


def _credentials(repo: Repository, challenge: str) -> str:
    """An Authorization header answering the registry's challenge (Bearer token or Basic)."""
    scheme, _, params = challenge.partition(" ")
    fields = dict(re.findall(r'(\w+)="([^"]*)"', params))
    login = _docker_login(repo.host)
    if scheme.lower() == "basic":
        if login is None:
            raise RegistryError(f"registry {repo.host} wants a login; run `docker login {repo.host}`")
        return f"Basic {login}"
    if scheme.lower() != "bearer" or "realm" not in fields:
        raise RegistryError(f"registry {repo.host} asks for unsupported auth {challenge!r}")
    query = {
        "service": fields.get("service", ""),
        "scope": fields.get("scope") or f"repository:{repo.path}:pull",
    }
    realm = fields["realm"]
    token_request = urllib.request.Request(f"{realm}?{urllib.parse.urlencode(query)}")
    # The login goes to the realm only over TLS or to the registry's own origin; anywhere else the
    # token is asked for anonymously (enough for public pulls, refused otherwise).
    if login is not None and (_origin(realm)[0] == "https" or _origin(realm) == _origin(repo.base_url)):
        token_request.add_unredirected_header("Authorization", f"Basic {login}")
    with _open(repo, token_request, authenticate=False) as response:
        body = json.load(response)
    return f"Bearer {body.get('token') or body.get('access_token')}"


def _docker_login(host: str) -> str | None:
    """The base64 user:password `docker login` stored for `host` in ~/.docker/config.json, if any."""
    config = Path.home() / ".docker" / "config.json"
    try:
        auths = json.loads(config.read_text()).get("auths", {})
    except (OSError, ValueError):
        return None
    entry = auths.get(host) or auths.get(f"https://{host}") or {}
    return entry.get("auth") or None


def checked_push(metadata_file: Path) -> list[tuple[str, str]]:
    """Each tag buildx pushed (its metadata file's `image.name`) with the digest it built
    (`containerimage.digest`), after asking the registry that the tag serves that digest."""
    try:
        metadata = json.loads(metadata_file.read_text())
        built, names = metadata["containerimage.digest"], metadata["image.name"]
    except (OSError, ValueError, KeyError) as err:
        raise RegistryError(f"buildx wrote no pushed digest to {metadata_file} ({err})") from err
    pushed = []
    for name in names.split(","):
        image, _, tag = name.rpartition(":")
        served = manifest_digest(repository(image), tag)
        if served != built:
            raise RegistryError(
                f"{name} serves {served}, not the {built} this build pushed (another push raced this "
                "one?): push again"
            )
        pushed.append((name, built))
    return pushed
