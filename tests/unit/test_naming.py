"""The image naming scheme: every variant of the matrix formats to a tag that parses back to it."""

from __future__ import annotations

from builder.engines import get_engine
from builder.images.matrix import buildable
from builder.images.naming import (
    alias_image_tag,
    cache_key,
    image_spec,
    image_tag,
    parse_variant,
    publish_tags,
    short_ref,
    variant_tag,
)
from tests.unit.variants import all_specs


def test_every_variant_round_trips() -> None:
    specs = [*buildable(), *all_specs().values()]
    assert len(specs) > 60
    for spec in specs:
        tag = variant_tag(spec)
        parsed = parse_variant(tag)
        assert parsed is not None, tag
        assert (parsed.ref, parsed.cuda, parsed.cpu) == (
            short_ref(spec.ref),
            spec.cuda.version,
            spec.cpu.name,
        )
        assert image_tag(spec).endswith(f":{tag}") and alias_image_tag(spec).endswith(f":{parsed.alias}")
        assert image_tag(spec).rpartition(":")[0] == alias_image_tag(spec).rpartition(":")[0]
        assert publish_tags(spec.engine, parsed, f"{spec.registry}/{spec.namespace}") == [
            image_tag(spec),
            alias_image_tag(spec),
        ]


def test_the_scheme_itself() -> None:
    spec = image_spec(
        get_engine("ik_llama.cpp"), "zen4", ref="007d640098cbea95157d81846ada7fe50b9fed08"
    )  # shortened to 12
    assert image_tag(spec) == "ghcr.io/moe-stack/ik-llama-cpp:007d640098cb-cpu-zen4"
    assert alias_image_tag(spec) == "ghcr.io/moe-stack/ik-llama-cpp:cpu-zen4"
    assert cache_key(spec) == "ik-llama-cpp-cpu-zen4"
    assert parse_variant("cpu-zen4") is None  # an alias is no variant
    assert parse_variant("r1-cuda12.8-zen9") is None  # no such CPU target
