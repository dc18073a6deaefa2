"""P5, build time: a rebuild after a label-only change (target ≤ 10 s), and after an engine-source
change with the compiler cache warm vs cold (target: cold ÷ ccache ≥ 3), one run, the same image.

The source change is a comment appended to one C file of a copy of the engine tree: that file's
compile misses ccache, every other one hits. "Cold" first drops BuildKit's cache mounts (the
ccache of every image on this host), so run it where that is acceptable.

Usage: python bench/build_times.py [--engine llama.cpp] [--cpu avx2]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from builder.engines import get_engine
from builder.engines.base import ImageSpec
from builder.files import cache_dir
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.naming import image_spec
from builder.images.source import resolve_local
from builder.spec import BaseImages

CHANGED_FILE = "ggml/src/ggml-alloc.c"


def timed_build(spec: ImageSpec, tree: Path, name: str) -> float:
    started = time.monotonic()
    build_image(spec, tree, show=lambda line: None, log_path=cache_dir() / "logs" / f"bench-p5-{name}.log")
    return time.monotonic() - started


def touch_source(tree: Path, note: str) -> None:
    with (tree / CHANGED_FILE).open("a") as source:
        source.write(f"\n// moe-stack bench/build_times.py: {note} {time.time_ns()}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="llama.cpp")
    parser.add_argument("--cpu", default="avx2")
    options = parser.parse_args()
    engine = get_engine(options.engine)
    base = ensure_base()
    with tempfile.TemporaryDirectory(prefix="moe-stack-p5-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(resolve_local(engine, f"pypi:{engine.sdist}"), tree, symlinks=True)
        spec = image_spec(
            engine, options.cpu, tree=tree, ref="bench-p5", base=BaseImages(build=base, runtime=base)
        )
        timed_build(spec, tree, "prime")  # whatever state the cache was in
        label_only = timed_build(spec, tree, "label-only")  # same tree: only the `created` label differs
        subprocess.run(
            ["docker", "builder", "prune", "--force", "--filter", "type=exec.cachemount"],
            check=True,
            capture_output=True,
        )
        touch_source(tree, "cold")
        cold = timed_build(spec, tree, "cold")
        touch_source(tree, "ccache")
        warm = timed_build(spec, tree, "ccache")
    print(
        f"{engine.name} {options.cpu} image, this host "
        f"({subprocess.run(['nproc'], capture_output=True, text=True, check=False).stdout.strip()} cores)"
    )
    print("| rebuild after | seconds | target |")
    print("|---|---|---|")
    print(f"| a label-only change | {label_only:.1f} | ≤ 10 |")
    print(f"| a source change, ccache cold | {cold:.1f} | |")
    print(f"| a source change, ccache warm | {warm:.1f} | |")
    print(f"| cold ÷ warm | **{cold / warm:.1f}×** | ≥ 3× |")


if __name__ == "__main__":
    main()
