"""ccache across builders: a compiled engine's objects live in a BuildKit cache mount, which a CI runner
(a fresh builder each job) starts without, and which no registry or GitHub cache exports. `moe-stack
build --ccache-dir DIR` carries them through DIR: before the build, DIR seeds the mount (the template's
`ccache-import` stage, DIR handed in as a named context); after it, the mount is copied out into DIR
(its `ccache-export` stage, a local export into a new directory that then replaces DIR). Both stages are
built only by name, so the image's own layers, and their cache, are the same with or without them.

DIR is untrusted input to the compile: only the objects cross (the build context's ccache-objects.sh:
the regular files of the one-hex-digit directories, no ccache.conf, no links), and the compile reads
ccache's settings from the file the build context ships (CCACHE_CONFIGPATH: engines/llama_family.py),
never from the cache directory. CI's publishing jobs carry no DIR (GitHub's Actions cache can be written
by any job on the branch: .github/workflows/images.yml)."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from builder.images.build_plan import BuildPlan

SEED_CONTEXT = "ccache-seed"
IMPORT_STAGE = "ccache-import"
EXPORT_STAGE = "ccache-export"
RUN_CONTEXT = "ccache-run"  # a new id each export, so the copy runs again


def import_step(plan: BuildPlan, directory: Path) -> BuildPlan:
    """Seed the build's cache mount with `directory`'s ccache files."""
    step = plan.side_step(IMPORT_STAGE)
    return replace(step, build_contexts={**plan.build_contexts, SEED_CONTEXT: str(directory)})


def export_step(plan: BuildPlan, dest: Path, run_id: Path) -> BuildPlan:
    """Copy the build's cache mount into `dest`; `run_id` is a directory holding a new id (new_run_id)."""
    step = plan.contract_step(dest, EXPORT_STAGE)
    return replace(step, build_contexts={**plan.build_contexts, RUN_CONTEXT: str(run_id)})


def new_run_id(directory: Path) -> Path:
    """`directory` holding a new random id: a context no earlier export had."""
    (directory / "run-id").write_text(uuid.uuid4().hex + "\n")
    return directory


def replace_dir(new: Path, directory: Path) -> None:
    """Move `new` into `directory`'s place (the old one removed after), so an interrupted export leaves
    the previous cache whole."""
    if directory.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{directory.name}.old.", dir=directory.parent))
        directory.rename(old / directory.name)
        new.rename(directory)
        shutil.rmtree(old, ignore_errors=True)
    else:
        new.rename(directory)


@contextmanager
def carried(plan: BuildPlan, directory: Path, run: Callable[[BuildPlan], None]) -> Iterator[None]:
    """Around the builds of `plan` (the body): `directory` into the cache mount before, the mount back
    into `directory` after they succeeded. `run` builds one step."""
    directory.mkdir(parents=True, exist_ok=True)
    run(import_step(plan, directory))
    yield
    exported = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        with tempfile.TemporaryDirectory(prefix="moe-stack-ccache-run-") as run_id:
            run(export_step(plan, exported, new_run_id(Path(run_id))))
    except BaseException:
        shutil.rmtree(exported, ignore_errors=True)
        raise
    replace_dir(exported, directory)
