"""What a built moe-stack image says about itself (its labels): engine, CPU needs, flag contract."""

from __future__ import annotations

from dataclasses import dataclass

from python_on_whales.exceptions import DockerException

from builder.contract import ARCHITECTURES_LABEL, LABEL_PREFIX
from builder.docker_client import describe, docker
from builder.engines import Engine, get_engine
from builder.errors import SpecError, StackError
from builder.platform.flags import LABEL as FLAGS_LABEL
from builder.platform.flags import from_label


@dataclass(frozen=True)
class ImageFacts:
    image: str
    engine: Engine
    engine_ref: str
    variant: str  # `<ref>-<cpu|cudaX.Y>-<isa>`, the image's immutable tag
    cpu_target: str
    required_cpu_flags: tuple[str, ...]
    server_flags: dict[str, str]
    repo_digest: str | None = None  # sha256:… the registry serves for this image, once pushed or pulled
    architectures: tuple[str, ...] = ()  # the GGUF architectures its engine loads (empty: not recorded)

    @property
    def who(self) -> str:
        return f"{self.engine} {self.engine_ref} ({self.image})"


def read_image_facts(image: str) -> ImageFacts:
    """The facts of a local image; StackError when it is absent or not built by moe-stack."""
    client = docker()
    if not client.image.exists(image):
        raise StackError(
            f"image {image} is not present locally; build or pull it first so its flags and CPU "
            "needs can be checked, or pass --skip-image-checks"
        )
    try:
        inspected = client.image.inspect(image)
    except DockerException as err:
        raise StackError(f"can't inspect image {image}: {describe(err)}") from None
    labels = inspected.config.labels or {}
    repository = image.rpartition(":")[0] if ":" in image.rpartition("/")[2] else image
    digests = [d.partition("@")[2] for d in inspected.repo_digests or [] if d.partition("@")[0] == repository]
    if FLAGS_LABEL not in labels or f"{LABEL_PREFIX}.engine" not in labels:
        raise StackError(
            f"image {image} was not built by moe-stack (no flag contract label); rebuild it with "
            "`moe-stack build`, or pass --skip-image-checks"
        )
    try:
        engine = get_engine(labels[f"{LABEL_PREFIX}.engine"])
    except SpecError as err:
        raise StackError(
            f"image {image}: {err} (did a newer moe-stack build it?), or pass --skip-image-checks"
        ) from None
    return ImageFacts(
        image=image,
        engine=engine,
        engine_ref=labels.get(f"{LABEL_PREFIX}.engine-ref", "?"),
        variant=labels.get("org.opencontainers.image.version", "?"),
        cpu_target=labels.get(f"{LABEL_PREFIX}.cpu-target", "?"),
        required_cpu_flags=tuple(labels.get(f"{LABEL_PREFIX}.required-cpu-flags", "").split()),
        server_flags=from_label(labels[FLAGS_LABEL]),
        repo_digest=digests[0] if digests else None,
        architectures=tuple(labels.get(ARCHITECTURES_LABEL, "").split()),
    )
