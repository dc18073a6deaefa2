#!/usr/bin/env python3
"""Write dockerfiles/ktransformers/kt-kernel-cpu.lock, the wheels of KTransformers' CPU kernel image built
from a wheelhouse, each pinned by version and sha256 (builder/engines/kt_wheels.py): `pip download`
resolves kt-kernel (without its dependencies: it pins torch 2.9.1, whose CPU build only PyTorch's index
has) and a CPU torch with what kt-kernel's loader imports (numpy, gguf, safetensors) for CPython 3.11 on
manylinux x86-64, and the lock records the sha256 of each file it fetched. PyPI's x86-64 torch is a CUDA
build: pip must find the CPU one (`PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu`, or a
find-links directory holding it).

    python scripts/lock-kt-cpu-wheels.py [--kt-kernel VERSION] [--torch VERSION]
    python scripts/lock-kt-cpu-wheels.py --download DIR   # fill a wheelhouse with the locked wheels
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's builder package

from builder.engines import get_engine
from builder.engines.kt_wheels import (
    LOCK_FILE,
    LOCK_SCRIPT,
    download_locked,
    lock_path,
    lock_text,
    pip_download_command,
)
from builder.engines.ktransformers import KT_KERNEL_IMPORTS
from builder.errors import SpecError

# The CPU torch the image gets: kt-kernel's pinned 2.9.1 has no CPU build on PyPI, and this is the one
# the development machines' find-links hold (kt-kernel's ops run on it: tests/integration).
DEFAULT_TORCH = "2.13.0"


def resolve(dest: Path, kt_kernel: str, torch: str) -> None:
    """What the image installs, fetched into `dest` by pip."""
    for requirements in (
        ["--no-deps", f"kt-kernel=={kt_kernel}"],
        [f"torch=={torch}", *KT_KERNEL_IMPORTS[1:]],
    ):
        result = subprocess.run(
            [*pip_download_command(dest), *requirements], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            last = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecError(f"pip download {' '.join(requirements)} failed: {last}")
    if not list(dest.glob(f"torch-{torch}+cpu-*.whl")):
        raise SpecError(
            f"pip found no CPU build of torch {torch}: give it PyTorch's CPU index "
            "(PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) or a find-links directory holding it"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--kt-kernel", default=get_engine("ktransformers").default_ref, help="default: the pin"
    )
    parser.add_argument("--torch", default=DEFAULT_TORCH, help=f"the CPU torch (default {DEFAULT_TORCH})")
    parser.add_argument("--download", type=Path, metavar="DIR", help=f"fill DIR with {LOCK_FILE}'s wheels")
    args = parser.parse_args(argv)
    try:
        if args.download is not None:
            download_locked(args.download)
            print(f"{args.download}: the wheels of {LOCK_FILE}, each checked against its sha256")
            return 0
        with tempfile.TemporaryDirectory(prefix="kt-cpu-wheels-") as staging:
            resolve(Path(staging), args.kt_kernel, args.torch)
            command = shlex.join(
                ["python", LOCK_SCRIPT, "--kt-kernel", args.kt_kernel, "--torch", args.torch]
            )
            lock_path().write_text(lock_text(Path(staging), command))
    except SpecError as error:
        print(f"{LOCK_SCRIPT}: {error}", file=sys.stderr)
        return 1
    print(f"wrote {lock_path()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
