"""A real registry for the tests: Debian's docker-registry (distribution v2) on 127.0.0.1, with its
storage in a temporary directory, optionally behind htpasswd auth."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import yaml

from builder.stackfile.host_checks import free_local_port


@contextmanager
def running_registry(root: Path, users: dict[str, str] | None = None) -> Iterator[str]:
    """Start a registry serving from `root`; yields its address (127.0.0.1:PORT)."""
    binary = shutil.which("docker-registry")
    if binary is None:
        raise FileNotFoundError(
            "docker-registry is not installed (Debian package docker-registry; "
            "scripts/prepare-host.sh test installs it)"
        )
    address = f"127.0.0.1:{free_local_port()}"
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": address},
    }
    if users:
        htpasswd = root / "htpasswd"
        htpasswd.write_text(
            "".join(
                f"{user}:{bcrypt.hashpw(password.encode(), bcrypt.gensalt(rounds=4)).decode()}\n"
                for user, password in users.items()
            )
        )
        config["auth"] = {"htpasswd": {"realm": "moe-stack-test", "path": str(htpasswd)}}
    (root / "config.yml").write_text(yaml.safe_dump(config))
    log = (root / "registry.log").open("w")
    process = subprocess.Popen(
        [binary, "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        _wait_until_up(address, process, root / "registry.log")
        yield address
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        _untag(address)


def _untag(address: str) -> None:
    """The host's tags of images pushed to or pulled from this registry, removed with it: its port is
    never used again, and a day of test runs left dozens of them (an image they name keeps its other tags;
    one in use by a container stays)."""
    listed = subprocess.run(
        ["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"],
        check=False,
        capture_output=True,
        text=True,
    )
    tags = [tag for tag in listed.stdout.split() if tag.startswith(f"{address}/")]
    if tags:
        subprocess.run(["docker", "image", "rm", *tags], check=False, capture_output=True)


def _wait_until_up(address: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"http://{address}/v2/", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # 401: up, and asking for credentials
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"docker-registry did not answer on {address} within 30 s")
