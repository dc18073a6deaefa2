"""The monitoring image: Prometheus from Debian's package on the local Debian base (`moe-stack base
--prometheus`), for `moe-stack compose --monitoring` where no registry can be reached."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from builder import __version__
from builder.contract import IMAGE_UID, LABEL_PREFIX, PROMETHEUS_DATA, PROMETHEUS_PORT, prometheus_image
from builder.docker_client import docker
from builder.files import content_dir, templates_root
from builder.images.build_plan import BuildPlan, stream_build
from builder.images.render import template_environment

_TEMPLATE_DIR = "prometheus"


def render_files(base_image: str) -> dict[str, str]:
    """The build context: the Dockerfile and the start script."""
    text = (
        template_environment()
        .get_template(f"{_TEMPLATE_DIR}/Dockerfile.j2")
        .render(
            builder_version=__version__,
            base_image=base_image,
            uid=IMAGE_UID,
            port=PROMETHEUS_PORT,
            data_dir=PROMETHEUS_DATA,
            config_file="/tmp/moe-stack-prometheus.yml",
            labels={
                "org.opencontainers.image.title": "Prometheus (Debian package) for moe-stack stacks",
                f"{LABEL_PREFIX}.builder-version": __version__,
                f"{LABEL_PREFIX}.base": base_image,
            },
        )
    )
    script = (templates_root() / _TEMPLATE_DIR / "moe-stack-prometheus").read_text()
    return {"Dockerfile": text, "moe-stack-prometheus": script}


def make_prometheus(
    base_image: str,
    suite: str,
    context_root: Path,
    show: Callable[[str], None],
    log_path: Path,
    force: bool = False,
) -> str:
    """Build the monitoring image on `base_image` (kept when it exists, unless `force`); its tag."""
    client = docker()
    tag = prometheus_image(suite)
    if client.image.exists(tag) and not force:
        return tag
    context = content_dir(render_files(base_image), context_root, f"prometheus-{suite}")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        stream_build(client, BuildPlan(context=context, tags=(tag,)), log, log_path, show)
    return tag
