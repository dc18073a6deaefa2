"""The wheelhouse the KTransformers CPU kernel image is built from, made once into the cache."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from builder.engines import get_engine
from builder.files import cache_dir

# torch 2.13.0's CPU build is the one on this kind of host (the pip find-links); kt-kernel pins
# torch 2.9.1, whose CPU build only PyTorch's own index has.
TORCH = "torch==2.13.0"
_PLATFORMS = (
    "manylinux_2_35_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)


def make_kt_wheelhouse() -> Path:
    """kt-kernel (the engine's default version) + a CPU torch + numpy, gguf, safetensors, cp311."""
    version = get_engine("ktransformers").default_ref
    target = cache_dir() / "wheelhouses" / f"kt-kernel-{version}-cp311-{TORCH.replace('==', '-')}"
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".wheelhouse-", dir=target.parent))
    common = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--quiet",
        "--only-binary=:all:",
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        *(arg for p in _PLATFORMS for arg in ("--platform", p)),
        "--dest",
        str(staging),
    ]
    try:
        subprocess.run(
            [*common, "--no-deps", f"kt-kernel=={version}"], check=True, capture_output=True, text=True
        )
        subprocess.run(
            [*common, TORCH, "numpy", "gguf", "safetensors"], check=True, capture_output=True, text=True
        )
        if not list(staging.glob("torch-*+cpu-*.whl")):
            raise RuntimeError(
                f"pip found no CPU build of {TORCH} (it should come from this host's find-links)"
            )
        staging.rename(target)
    except subprocess.CalledProcessError as err:
        raise RuntimeError(f"pip download failed: {err.stderr.strip().splitlines()[-1:]}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
