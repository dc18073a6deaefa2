"""The one place that reaches the Docker daemon: a client, checked once, with clear failures."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.errors import DockerUnavailable


@cache
def docker() -> DockerClient:
    """A client whose daemon answered and whose buildx and compose plugins exist."""
    client = DockerClient()
    try:
        client.system.info()
    except DockerException as err:
        raise DockerUnavailable(
            f"can't reach the Docker daemon ({_last_line(err)}); start it (e.g. `sudo systemctl start "
            "docker`) or point DOCKER_HOST at one"
        ) from None
    except FileNotFoundError:
        raise DockerUnavailable("the `docker` client is not installed; install Docker Engine") from None
    for plugin, probe in (("buildx", client.buildx.version), ("compose", client.compose.version)):
        try:
            probe()
        except DockerException:
            raise DockerUnavailable(
                f"the docker {plugin} plugin is missing; install it (Debian package docker-{plugin})"
            ) from None
    return client


def gpu_passthrough_available(
    client: DockerClient, cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
) -> bool:
    """Whether containers can get an NVIDIA GPU: Docker knows the nvidia runtime, or a CDI spec names one."""
    try:
        runtimes = client.system.info().runtimes or {}
    except DockerException:
        runtimes = {}
    if "nvidia" in runtimes:
        return True
    specs = [spec for directory in cdi_dirs if directory.is_dir() for spec in directory.glob("*.*")]
    return any("nvidia.com/gpu" in spec.read_text(errors="replace") for spec in specs if spec.is_file())


def _last_line(err: DockerException) -> str:
    text = (err.stderr or err.stdout or str(err)).strip()
    return text.splitlines()[-1] if text else "no output"


def describe(err: DockerException) -> str:
    """The useful line of a failed docker call: its stderr's last line."""
    return _last_line(err)
