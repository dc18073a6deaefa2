"""`moe-stack base --cuda 13.0|12.4`: CUDA devel and runtime base images, for hosts that reach a PyPI
mirror and a Debian mirror but no container registry.

CUDA 13.0 comes from NVIDIA's PyPI wheels: downloaded on the host (pinned by sha256; containers here
can't reach PyPI over TLS) and handed to the build as the named context `cuda-wheels`. CUDA 12.4 comes
from Debian's non-free archive: apt installs the pinned packages in the build from the mirror the
Debian base was made from, through a sources list of its own. Before either image is tagged, the
Dockerfile's `check` stage compiles a kernel + cuBLAS program against the devel image and resolves
it with `ldd` in the runtime image; `check_report` turns that into a pass or one clear error.
"""

from __future__ import annotations

import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from python_on_whales import DockerClient

from builder import __version__
from builder.contract import LABEL_PREFIX
from builder.docker_client import docker
from builder.errors import BaseImageError
from builder.files import content_dir, templates_root
from builder.images.baseimage import host_mirror
from builder.images.build_plan import BuildPlan, stream_build
from builder.images.render import template_environment
from builder.images.source import pip_download
from builder.platform.cuda_wheels import WHEEL_PLATFORMS, PypiCuda
from builder.platform.debian_cuda import DebianCuda
from builder.platform.local_cuda import LocalCuda

WHEELS_CONTEXT = "cuda-wheels"
CHECK_STAGE = "check"
# The one GPU arch the check compiles (the device's H200); any arch proves the toolchain links.
CHECK_ARCH = 90
_TEMPLATE_DIR = "cuda-base"
_HELPERS = ("cuda-layout.sh", "make-cuda-stub.sh", "cuda-check.cu")
_DEBIAN_HELPERS = ("cuda-view.sh", "cuda-check.cu")
# The package a Debian base installs in place of the driver's libraries that nvidia-cuda-dev depends on
# (libcuda1, and libnvidia-ml1 through libnvidia-ml-dev): a container gets them from the host driver
# (NVIDIA's container toolkit mounts them), so no image may hold its own.
HOST_DRIVER_PACKAGE = "moe-stack-host-driver"
HOST_DRIVER_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
MIRROR_LABEL = "io.moe-stack.base-mirror"


@dataclass(frozen=True)
class CudaBase:
    devel: str
    runtime: str
    stub_symbols: int | None  # entry points in the devel image's libcuda link stub (None: kept, not made)


def current_images(client: DockerClient, cuda: LocalCuda) -> bool:
    """Whether both base images exist and carry exactly this release's pinned wheels or packages."""
    for flavour in ("devel", "runtime"):
        if not client.image.exists(cuda.image(flavour)):
            return False
        labels = client.image.inspect(cuda.image(flavour)).config.labels or {}
        pinned = content_labels(cuda, flavour == "runtime")
        if any(labels.get(key) != value for key, value in pinned.items()):
            return False
    return True


def content_labels(cuda: LocalCuda, runtime: bool) -> dict[str, str]:
    """The labels that pin what a (devel or runtime) base holds: `io.moe-stack.wheel.<name>`, the version
    and sha256 of each wheel, or `io.moe-stack.deb.<name>`, the version of each Debian package."""
    return {f"{LABEL_PREFIX}.{key}": value for key, value in (p.label for p in cuda.parts(runtime))}


def wheel_file_name(name: str, version: str, directory: Path) -> Path:
    """The downloaded wheel of `name==version` in `directory` (pip normalises '-' to '_')."""
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in directory.glob("*.whl") if p.name.startswith(stem))
    if not found:
        raise BaseImageError(
            f"{name}=={version} is missing from {directory} after the download; rerun, or check "
            "the PyPI mirror"
        )
    return found[0]


def download_wheels(cuda: PypiCuda, dest: Path) -> dict[str, Path]:
    """pip-download the release's wheels into `dest` with their pinned hashes (files already there
    are checked, not fetched again); returns each wheel's file by package name."""
    dest.mkdir(parents=True, exist_ok=True)
    requirements = dest / "requirements.txt"
    requirements.write_text("".join(wheel.requirement + "\n" for wheel in cuda.packages))
    platforms = (arg for platform in WHEEL_PLATFORMS for arg in ("--platform", platform))
    failed = pip_download(
        dest, "--only-binary=:all:", "--require-hashes", "-r", str(requirements), *platforms
    )
    if failed is not None:
        raise BaseImageError(
            f"can't download CUDA {cuda.version}'s wheels from PyPI ({failed}); check pip's index "
            "(PIP_INDEX_URL) and that it mirrors NVIDIA's nvidia-* packages"
        )
    return {wheel.name: wheel_file_name(wheel.name, wheel.version, dest) for wheel in cuda.packages}


def base_labels(cuda: LocalCuda, debian_base: str, runtime: bool, created: datetime) -> dict[str, str]:
    """Labels of one base image: the CUDA version and every wheel or package in it."""
    flavour = "runtime" if runtime else "devel"
    origin = "PyPI wheels" if isinstance(cuda, PypiCuda) else f"Debian {cuda.suite} {cuda.component} packages"
    labels = {
        "org.opencontainers.image.title": f"CUDA {cuda.version} {flavour} from {origin} (moe-stack base)",
        "org.opencontainers.image.created": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        f"{LABEL_PREFIX}.builder-version": __version__,
        f"{LABEL_PREFIX}.cuda": cuda.version,
        f"{LABEL_PREFIX}.cuda-full-version": cuda.full_version,
        f"{LABEL_PREFIX}.cuda-flavour": flavour,
        f"{LABEL_PREFIX}.os-base": debian_base,
    }
    return {**labels, **content_labels(cuda, runtime)}


def _base_env(cuda: LocalCuda) -> dict[str, str]:
    return {
        "CUDA_HOME": "/usr/local/cuda",
        "CUDA_VERSION": cuda.full_version,
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
        "NVIDIA_REQUIRE_CUDA": f"cuda>={cuda.version}",
    }


def _dockerfile(
    template: str,
    cuda: LocalCuda,
    debian_base: str,
    created: datetime,
    more_labels: dict[str, str],
    **values: object,
) -> str:
    """A base's Dockerfile: what both origins' templates place (the release, its prefix and environment,
    both images' labels, the check), and the origin's own `values`."""
    labels = {flavour: base_labels(cuda, debian_base, runtime, created) | more_labels
              for flavour, runtime in (("devel", False), ("runtime", True))}  # fmt: skip
    return (
        template_environment()
        .get_template(f"{_TEMPLATE_DIR}/{template}")
        .render(
            builder_version=__version__,
            cuda_version=cuda.version,
            debian_base=debian_base,
            prefix=cuda.prefix,
            prefix_name=Path(cuda.prefix).name,
            env=_base_env(cuda),
            devel_labels=labels["devel"],
            runtime_labels=labels["runtime"],
            check_arch=CHECK_ARCH,
            **values,
        )
    )


def render_files(
    cuda: PypiCuda, debian_base: str, wheel_files: dict[str, Path], created: datetime
) -> dict[str, str]:
    """Every file of the PyPI base images' build context, by name."""
    text = _dockerfile(
        "Dockerfile.j2",
        cuda,
        debian_base,
        created,
        {},
        wheel_root=cuda.wheel_root,
        wheel_files=[wheel_files[wheel.name].name for wheel in cuda.packages],
        runtime_libs=cuda.runtime_libs,
        check_packages=["g++"],
    )
    root = templates_root() / _TEMPLATE_DIR
    sums = "".join(f"{wheel.sha256}  /wheels/{wheel_files[wheel.name].name}\n" for wheel in cuda.packages)
    return {
        "Dockerfile": text,
        "cuda-wheels.sha256": sums,
        **{name: (root / name).read_text() for name in _HELPERS},
    }


def debian_sources(cuda: DebianCuda, mirror: str) -> str:
    """The archive's own apt list (deb822): the suite's non-free component, the base's keyring."""
    return (
        f"Types: deb\nURIs: {mirror}\nSuites: {cuda.suite}\nComponents: {cuda.component}\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )


def host_driver_control(cuda: DebianCuda) -> str:
    """The control file of the package that stands for the host driver's libraries."""
    provides = ", ".join(f"{library} (= {cuda.min_driver})" for library in HOST_DRIVER_LIBRARIES)
    return (
        f"Package: {HOST_DRIVER_PACKAGE}\nVersion: {cuda.min_driver}\nArchitecture: all\n"
        f"Maintainer: moe-stack\nProvides: {provides}\n"
        f"Description: the host driver's {' and '.join(HOST_DRIVER_LIBRARIES)}, mounted at run time\n"
        " NVIDIA's container toolkit mounts the host driver's libraries into a container; this\n"
        " package holds no file and satisfies what depends on them.\n"
    )


def render_debian_files(cuda: DebianCuda, debian_base: str, mirror: str, created: datetime) -> dict[str, str]:
    """Every file of the Debian base images' build context, by name."""
    text = _dockerfile(
        "debian.Dockerfile.j2",
        cuda,
        debian_base,
        created,
        {MIRROR_LABEL: mirror},
        suite=cuda.suite,
        component=cuda.component,
        host_gcc=cuda.host_gcc,
        host_driver_package=HOST_DRIVER_PACKAGE,
        devel_pins=[package.pin for package in cuda.parts(runtime=False)],
        runtime_pins=[package.pin for package in cuda.parts(runtime=True)],
        check_packages=[],
    )
    root = templates_root() / _TEMPLATE_DIR
    return {
        "Dockerfile": text,
        "moe-stack-cuda.sources": debian_sources(cuda, mirror),
        "host-driver.control": host_driver_control(cuda),
        **{name: (root / name).read_text() for name in _DEBIAN_HELPERS},
    }


def base_mirror(client: DockerClient, debian_base: str) -> str:
    """The Debian mirror the base was made from (`moe-stack base` labels it), else this host's."""
    labels = client.image.inspect(debian_base).config.labels or {}
    return labels.get(MIRROR_LABEL) or host_mirror()


def check_report(ldd: str, elf: str, arch: int) -> list[str]:
    """What is wrong with the check's output (empty: nothing). Every library but the driver's
    libcuda.so.1 (mounted by the NVIDIA container toolkit) must resolve in the runtime image, and the
    program must hold exactly the arch it was compiled for."""
    problems = [
        f"the runtime image can't resolve {line.split()[0]}"
        for line in ldd.splitlines()
        if "not found" in line and not line.strip().startswith("libcuda.so.1")
    ]
    archs = sorted(set(re.findall(r"sm_(\d+)", elf)))
    if archs != [str(arch)]:
        problems.append(
            f"the check program holds {', '.join('sm_' + a for a in archs) or 'no'} code, not sm_{arch}"
        )
    return problems


def make_cuda_base(
    cuda: LocalCuda,
    debian_base: str,
    cache_root: Path,
    show: Callable[[str], None],
    log_path: Path,
    force: bool = False,
) -> CudaBase:
    """Render (downloading the wheels first, for PyPI's), run the check, then build and tag the devel
    and runtime images. `cache_root` holds the wheels and the rendered contexts.

    Images already made from the same wheels or packages are kept unless `force`: re-made ones get new
    IDs (their `created` label), and every engine build on them would start again from its first layer."""
    client = docker()
    if not force and current_images(client, cuda):
        return CudaBase(devel=cuda.image("devel"), runtime=cuda.image("runtime"), stub_symbols=None)
    created = datetime.now(UTC)
    build_contexts: dict[str, str] = {}
    if isinstance(cuda, PypiCuda):
        wheel_dir = cache_root / "cuda-wheels" / cuda.version
        files = render_files(cuda, debian_base, download_wheels(cuda, wheel_dir), created)
        build_contexts[WHEELS_CONTEXT] = str(wheel_dir)
    else:
        files = render_debian_files(cuda, debian_base, base_mirror(client, debian_base), created)
    context = content_dir(files, cache_root / "contexts", f"cuda-{cuda.version}-base")
    plan = BuildPlan(context=context, tags=(), build_contexts=build_contexts)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log, tempfile.TemporaryDirectory(prefix="moe-stack-cuda-check-") as tmp:
        stream_build(client, plan.contract_step(Path(tmp), CHECK_STAGE), log, log_path, show)
        ldd = (Path(tmp) / "ldd.txt").read_text()
        problems = check_report(ldd, (Path(tmp) / "elf.txt").read_text(), CHECK_ARCH)
        if problems:
            raise BaseImageError(
                f"CUDA {cuda.version} base failed its check: {'; '.join(problems)} (full log: {log_path})"
            )
        for flavour in ("devel", "runtime"):
            stream_build(
                client, replace(plan, tags=(cuda.image(flavour),), target=flavour), log, log_path, show
            )
        stub_symbols = int((Path(tmp) / "stub-symbols.txt").read_text())
    return CudaBase(devel=cuda.image("devel"), runtime=cuda.image("runtime"), stub_symbols=stub_symbols)
