"""What every push publishes, and what the example stacks name, is what was built: each published variant
names the test or recorded run that built it from the pinned tree, and that evidence holds the variant."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from builder.engines import adapters
from builder.engines.base import ImageSpec
from builder.images.matrix import buildable, publish_set, published
from builder.images.mirror import mirrored
from builder.images.naming import image_tag
from builder.images.recorded_contracts import recorded_contract
from builder.platform.pins import pinned_ref
from tests.sources import source_mirror

ROOT = Path(__file__).resolve().parents[2]


def _built_by_the_suite(text: str, engine: str, cpu: str) -> bool:
    """The suite's harness builds (engine, cpu): by name, or for every engine of its ENGINES list."""
    if re.search(rf'build_engine_image\("{re.escape(engine)}", "{cpu}"', text):
        return True
    listed = re.search(r"^ENGINES = \[(.*)\]$", text, re.MULTILINE)
    return (
        bool(listed and f'"{engine}"' in listed.group(1))
        and f'build_engine_image(request.param, "{cpu}"' in text
    )


def _variant(spec: ImageSpec) -> str:
    """The tag's variant part without the ref: cpu-zen4, cuda13.0-zen4."""
    return f"{'cpu' if spec.cuda.version is None else f'cuda{spec.cuda.version}'}-{spec.cpu.name}"


def _built_in_a_run(folder: Path, slug: str, variant: str) -> bool:
    """A recorded run's files name an image of the engine's repository and this variant (its ref may be the
    tree's other name: the sdist's, a local tag's)."""
    pattern = re.compile(rf"(?<![\w-]){re.escape(slug)}:\S*-{re.escape(variant)}\b")
    return any(pattern.search(f.read_text(errors="replace")) for f in folder.rglob("*") if f.is_file())


def test_every_published_variant_was_built_where_it_says() -> None:
    entries = published()
    assert entries and {entry.spec.engine.name for entry in entries} >= {
        "llama.cpp",
        "ik_llama.cpp",
        "ktransformers",
    }
    for entry in entries:
        where = ROOT / entry.built
        spec = entry.spec
        assert where.exists(), f"{image_tag(spec)}: {entry.built} does not exist"
        if where.is_file():
            assert _built_by_the_suite(where.read_text(), spec.engine.name, spec.cpu.name), (
                image_tag(spec),
                entry.built,
            )
        else:
            assert _built_in_a_run(where, spec.engine.slug, _variant(spec)), (
                image_tag(spec),
                entry.built,
            )


def test_every_published_variant_is_one_a_toolchain_builds() -> None:
    """The list names variants of the matrix (not one its toolchains refuse, nor a typo), once each."""
    tags = [image_tag(s) for s in publish_set("default")]
    assert len(tags) == len(set(tags)) and set(tags) <= {image_tag(spec) for spec in buildable()}


def test_the_example_stacks_name_only_published_images_and_their_driver() -> None:
    published_tags = {image_tag(entry.spec) for entry in published()}
    for example in sorted((ROOT / "compose").glob("*.*.yaml")):
        document = yaml.safe_load(example.read_text())
        named = {service["image"] for service in document["services"].values()}
        assert named <= published_tags, (example.name, named - published_tags)
        assert "needs NVIDIA driver >= " in " ".join(example.read_text().split()), example.name


def test_the_pinned_ref_is_the_tree_the_suite_builds() -> None:
    """The suite builds each llama.cpp engine from the source mirror's tree of its pin where the mirror
    holds it (held there to the manifest, file by file: tests/unit/test_mirror.py), else from the PyPI
    sdist that vendors it; `moe-stack build` without --ref clones the pin. They are one tree only while
    the mirror holds the pin or the sdist vendors it: a bump of one without the other fails here, and the
    flag contract the examples are checked against is the one recorded from that tree."""
    for engine in (e for e in adapters() if e.mirrored and recorded_contract(e) is not None):
        pin = pinned_ref(engine.name)
        mirror = source_mirror()
        in_mirror = mirror is not None and mirrored(mirror, engine, pin) is not None
        assert in_mirror or engine.sdist_ref == pin, (engine.name, pin, engine.sdist)
        contract = recorded_contract(engine)
        assert contract is not None and contract.ref == pin  # recorded from that build
