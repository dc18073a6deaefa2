"""Each published variant (and the unpublished ones users build) renders to the checked-in files
under tests/golden/, byte for byte
(the Dockerfile and image.json; the scripts copied beside them are the dockerfiles/ files verbatim).

After an intended template change or a moved pin: MOE_STACK_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py
(it also removes the directories of variants no longer rendered).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from builder.files import replace_rendered_dir
from builder.images.render import render_files
from tests.unit.variants import all_specs

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
SPECS = all_specs()
CHECKED = ("Dockerfile", "image.json")


@pytest.mark.parametrize("name", sorted(SPECS))
def test_render_matches_golden(name: str) -> None:
    directory = GOLDEN / name
    rendered = {name: text for name, text in render_files(SPECS[name]).items() if name in CHECKED}
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":
        replace_rendered_dir(rendered, directory)
    assert directory.is_dir(), f"no golden render for {name}: run with MOE_STACK_UPDATE_GOLDEN=1"
    on_disk = {p.name: p.read_text() for p in directory.iterdir() if p.is_file()}
    assert sorted(on_disk) == sorted(rendered), (
        "golden file set differs: re-render with MOE_STACK_UPDATE_GOLDEN=1"
    )
    for filename, text in rendered.items():
        assert on_disk[filename] == text, (
            f"{name}/{filename} is stale: re-render with MOE_STACK_UPDATE_GOLDEN=1"
        )


def test_no_stale_golden_directories() -> None:
    stale = {p.name for p in GOLDEN.iterdir() if p.is_dir()} - set(SPECS)
    if os.environ.get("MOE_STACK_UPDATE_GOLDEN") == "1":  # a moved pin renames its variants' directories
        for name in stale:
            shutil.rmtree(GOLDEN / name)
        stale = set()
    assert not stale, f"golden renders for specs no longer published: {sorted(stale)}"
