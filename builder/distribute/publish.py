"""Publish built images to a registry and pull the variant that fits this host, proving by digest
that what landed (or arrived) is what the registry serves."""

from __future__ import annotations

from dataclasses import dataclass

from python_on_whales import DockerClient
from python_on_whales.exceptions import DockerException

from builder.distribute.choose import Choice, choose_variant
from builder.distribute.registry import (
    RegistryError,
    Repository,
    list_tags,
    manifest_digest,
    ping,
    registry_host,
    repository,
)
from builder.docker_client import describe, docker
from builder.engines import Engine
from builder.host.probe import HostFacts, missing_flags
from builder.images import naming
from builder.images.image_facts import ImageFacts, read_image_facts
from builder.images.naming import Variant, image_spec, parse_variant, publish_tags, short_ref


@dataclass(frozen=True)
class Pushed:
    tag: str
    digest: str


@dataclass(frozen=True)
class Pulled:
    image: str  # repo:tag as pulled
    digest: str
    choice: Choice


def publish_targets(facts: ImageFacts, prefix: str) -> list[str]:
    """Where `facts`' image goes under `prefix` (REGISTRY/NAMESPACE): its immutable tag, then its alias."""
    variant = parse_variant(facts.variant)
    if variant is None:
        raise RegistryError(
            f"image version {facts.variant!r} is not a moe-stack variant tag; rebuild it with "
            "`moe-stack build`"
        )
    return publish_tags(facts.engine, variant, prefix)


def publish(images: list[str], prefix: str) -> list[Pushed]:
    """Push every tag of every image; each one's registry digest must equal the local image's.

    On a failure nothing is reported as done that wasn't: the error names what was pushed so far.
    """
    client = docker()
    ping(registry_host(prefix))
    plans = [(image, read_image_facts(image)) for image in images]  # all refused before any push
    pushed: list[Pushed] = []
    for image, facts in plans:
        for target in publish_targets(facts, prefix):
            try:
                client.image.tag(image, target)
                client.image.push(target, quiet=True)
            except DockerException as err:
                done = ", ".join(p.tag for p in pushed) or "nothing"
                reason = describe(err)
                if any(word in reason.lower() for word in ("auth", "denied", "unauthorized")):
                    reason += (
                        f"; run `docker login {target.split('/')[0]}` with an account that may push there"
                    )
                raise RegistryError(
                    f"push of {target} failed ({reason}); pushed before it: {done}. Rerun "
                    "when fixed: the registry skips layers it already holds"
                ) from None
            pushed.append(Pushed(target, _verified_digest(client, target)))
    return pushed


def pull(
    adapter: Engine, prefix: str, host: HostFacts, ref: str | None = None, cpu_only: bool = False
) -> Pulled:
    """Pull the variant of the engine at `ref` (default: the pinned one) that fits `host` best."""
    repo = repository(naming.repository(prefix, adapter))
    offered = offered_variants(repo)
    wanted = ref or short_ref(image_spec(adapter).ref)
    at_ref = [o for o in offered if o.ref == wanted]
    if not offered:
        raise RegistryError(no_variants(repo.name, prefix))
    if not at_ref:
        refs = ", ".join(sorted({o.ref for o in offered}))
        raise RegistryError(f"{repo.name} holds no variant of ref {wanted} (it has: {refs}); pass --ref")
    choice = choose_variant(host, at_ref, cpu_only)
    image = f"{repo.name}:{choice.offered.tag}"
    client = docker()
    try:
        client.image.pull(image, quiet=True)
    except DockerException as err:
        raise RegistryError(f"pull of {image} failed ({describe(err)})") from None
    digest = _verified_digest(client, image)
    facts = read_image_facts(image)  # its labels came along: the flag contract, the CPU needs
    lacking = missing_flags(facts.required_cpu_flags, host.cpu)
    if lacking:  # the tag said one target, the labels another
        raise RegistryError(f"{image} is labelled as needing {' '.join(lacking)}, which this host lacks")
    return Pulled(image=image, digest=digest, choice=choice)


def no_variants(repository_name: str, prefix: str) -> str:
    """What `pull` says when the repository holds no variant tag."""
    if prefix.rstrip("/") == naming.DEFAULT_PREFIX:
        return (
            f"{repository_name} holds no moe-stack images: none has been published yet (images.yml has not "
            "run); build one here with `moe-stack build`, or pull --from a registry you published to"
        )
    return (
        f"{repository_name} holds no moe-stack variants; publish some (`moe-stack publish`) or check --from"
    )


def offered_variants(repo: Repository) -> list[Variant]:
    """The variant tags `repo` holds (aliases left out)."""
    return [o for o in (parse_variant(tag) for tag in list_tags(repo)) if o is not None]


def _verified_digest(client: DockerClient, image: str) -> str:
    """The registry's digest for `image`, checked against the digest Docker recorded locally."""
    name, _, tag = image.rpartition(":")
    served = manifest_digest(repository(name), tag)
    local = {
        d.partition("@")[2]
        for d in client.image.inspect(image).repo_digests or []
        if d.startswith(name + "@")
    }
    if served not in local:
        raise RegistryError(
            f"{image}: the registry serves {served}, but the local image is "
            f"{', '.join(sorted(local)) or 'not recorded as pushed'}; push or pull it again"
        )
    return served
