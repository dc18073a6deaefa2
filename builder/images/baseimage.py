"""Base images for hosts that can't pull one: debootstrap a minimal Debian and `docker import` it.

Air-gapped and registry-less hosts still reach a Debian mirror (or a local one); that is enough to
make the same kind of base the images are designed for (`debian:<suite>-slim`-sized, ~80 MB).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from python_on_whales.exceptions import DockerException

from builder.contract import LOCAL_ONLY
from builder.docker_client import describe, docker
from builder.errors import BaseImageError
from builder.platform.toolchain import CPU_BASE, CPU_BASE_SUITE

DEFAULT_SUITE = CPU_BASE_SUITE
DEFAULT_PULL = CPU_BASE
DEFAULT_LOCAL_TAG = f"{LOCAL_ONLY}debian:{CPU_BASE_SUITE}"
FALLBACK_MIRROR = "http://deb.debian.org/debian"

# What a slim image leaves out, also for packages installed later (dpkg honours these).
_DPKG_EXCLUDES = """\
# moe-stack base: keep images slim, as debian:*-slim does
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
path-exclude /usr/share/lintian/*
"""
_APT_NO_CACHE = (
    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\nAPT::Keep-Downloaded-Packages "false";\n'
)


def host_mirror(sources_root: Path = Path("/etc/apt")) -> str:
    """The Debian mirror this host's apt uses (deb822 or one-line format), else deb.debian.org."""
    candidates = sorted((sources_root / "sources.list.d").glob("*.sources")) + [sources_root / "sources.list"]
    for path in candidates:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        match = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.MULTILINE) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text, re.MULTILINE
        )
        if match:
            return match.group(1)
    return FALLBACK_MIRROR


def image_exists(name: str) -> bool:
    return docker().image.exists(name)


def make_base(
    tag: str = DEFAULT_LOCAL_TAG, suite: str = DEFAULT_SUITE, mirror: str | None = None, force: bool = False
) -> str:
    """debootstrap `suite` into a temp dir, slim it, import it as `tag`. Idempotent unless `force`.

    Re-making an existing tag would give it a new digest and so throw away every build cache layer
    on top of it; that is why an existing image is kept unless asked.
    """
    if not force and image_exists(tag):
        return tag
    if shutil.which("debootstrap") is None:
        raise BaseImageError(
            "debootstrap is not installed; install it (`apt-get install debootstrap`) or "
            "pass a pullable base with --base-image"
        )
    if os.geteuid() != 0:
        raise BaseImageError(
            "making a base image needs root (debootstrap creates device nodes); run `sudo moe-stack base`"
        )
    mirror = mirror or host_mirror()
    with tempfile.TemporaryDirectory(prefix="moe-stack-base-") as work:
        rootfs = Path(work) / "rootfs"
        _debootstrap(suite, rootfs, mirror)
        _slim(rootfs)
        tarball = Path(work) / "rootfs.tar"
        subprocess.run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(tarball), "."], check=True)
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        changes = [
            'CMD ["bash"]',
            (
                f'LABEL org.opencontainers.image.title="Debian {suite} minbase (moe-stack base)" '
                f'org.opencontainers.image.created="{created}" io.moe-stack.base-mirror="{mirror}"'
            ),
        ]
        try:
            docker().image.import_(tarball, tag=tag, changes=changes)
        except DockerException as err:
            raise BaseImageError(f"docker import of the base image failed: {describe(err)}") from None
    return tag


def _debootstrap(suite: str, rootfs: Path, mirror: str) -> None:
    cmd = ["debootstrap", "--variant=minbase", suite, str(rootfs), mirror]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        tail = (result.stdout + result.stderr).strip().splitlines()[-1:] or ["no output"]
        raise BaseImageError(
            f"debootstrap {suite} from {mirror} failed: {tail[0]}; check the mirror with --mirror"
        )


def _slim(rootfs: Path) -> None:
    """Drop caches, lists, docs and locales, and keep later installs from bringing them back."""
    for rel in (
        "var/cache/apt/archives",
        "var/lib/apt/lists",
        "usr/share/doc",
        "usr/share/man",
        "usr/share/info",
        "usr/share/locale",
        "var/log",
    ):
        target = rootfs / rel
        if target.is_dir():
            for child in target.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                elif child.name != "lock":
                    child.unlink()
    for leftover in (rootfs / "var/cache/apt").glob("*.bin"):
        leftover.unlink()
    (rootfs / "var/cache/apt/archives/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "var/lib/apt/lists/partial").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/dpkg/dpkg.cfg.d/moe-stack-slim").write_text(_DPKG_EXCLUDES)
    (rootfs / "etc/apt/apt.conf.d/docker-clean").write_text(_APT_NO_CACHE)


def ensure_base(
    preferred: str = DEFAULT_PULL, local_tag: str = DEFAULT_LOCAL_TAG, suite: str = DEFAULT_SUITE
) -> str:
    """A usable base image name: `preferred` if present or pullable, else one made locally from `suite`."""
    if image_exists(preferred):
        return preferred
    try:
        docker().image.pull(preferred, quiet=True)
        return preferred
    except DockerException:
        return make_base(tag=local_tag, suite=suite)
