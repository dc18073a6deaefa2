"""`moe-stack refs --bump`'s gate (stacks/bump_gate.py) with real engines on a tiny model: a candidate that
fails a smoke check the pin passes, or loses more than 5 % of decode or prefill in the A/B bench, is
refused with its table; and the source mirror's ik_llama.cpp tree is judged against the sdist's, both
engines' own timings, rounds alternating."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from python_on_whales import DockerClient

from builder.engines import get_engine
from builder.images.build import build_image
from builder.images.naming import image_spec
from builder.images.source import resolve_local
from builder.spec import BaseImages
from builder.stacks.bump_gate import MAX_LOSS, ROUNDS, Contender, Verdict, prove
from tests.integration.conftest import build_engine_image, suite_tree

pytestmark = pytest.mark.integration

ENGINE_BIN = "/opt/engine/bin/llama-server"  # the images' MOE_STACK_ENGINE_BIN
WRAPPERS = {
    # Eight threads a CPU: each busy-waits at the graph's barriers for the others, descheduled (the same
    # build, its time sliced: decode and prefill slower; smoke's checks see the stack's own thread count).
    "slower": f'exec {ENGINE_BIN} "$@" --threads 16 --threads-batch 16\n',
    "broken": 'echo "error: this build cannot load anything" >&2\nexit 1\n',
}


@pytest.fixture
def candidates(docker_client: DockerClient, base_image: str, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The pin's mainline image with its server wrapped: the same build, made slower or broken."""
    pin = build_engine_image("llama.cpp", "avx2", base_image)
    tags = {}
    for name, script in WRAPPERS.items():
        context = tmp_path / f"context-{name}"
        context.mkdir()
        (context / "llama-server").write_text(f"#!/bin/sh\n{script}")
        (context / "Dockerfile").write_text(
            f"FROM {pin.tag}\nCOPY --chmod=0755 llama-server /opt/gate/llama-server\n"
            "ENV MOE_STACK_ENGINE_BIN=/opt/gate/llama-server\n"
        )
        tags[name] = f"moe-stack-test/gate-{name}:{uuid.uuid4().hex[:8]}"
        docker_client.buildx.build(context, tags=[tags[name]], load=True, progress=False)
    yield tags
    for tag in tags.values():
        docker_client.image.remove(tag, force=True)


def _judged(verdict: Verdict) -> None:
    """Both sides ran every round with the engines' own timings, and the verdict follows from them."""
    for line in verdict.table():
        print(line)
    assert verdict.bench_failure is None, verdict.bench_failure
    for side in (verdict.pin, verdict.candidate):
        assert len(side.decode) == len(side.prefill) == ROUNDS and min(side.decode + side.prefill) > 0, side
    lost = {c.name for c in verdict.pin.checks if c.passed} - {
        c.name for c in verdict.candidate.checks if c.passed
    }
    assert (verdict.refused is None) == (not lost and min(verdict.ratios) >= 1 - MAX_LOSS), verdict.refused


def test_the_gate_refuses_a_slower_or_a_broken_candidate(
    base_image: str, candidates: dict[str, str], moe_model: Path, tmp_path: Path
) -> None:
    pin = build_engine_image("llama.cpp", "avx2", base_image)
    engine = get_engine("llama.cpp")
    slower = prove(
        engine,
        Contender("pin", pin.ref, pin.tag),
        Contender("candidate", "slower", candidates["slower"]),
        moe_model,
        tmp_path / "slower",
        print,
    )
    _judged(slower)
    assert min(slower.ratios) < 1 - MAX_LOSS, slower.table()
    assert slower.refused is not None and slower.refused.startswith("the candidate's "), slower.refused
    broken = prove(
        engine,
        Contender("pin", pin.ref, pin.tag),
        Contender("candidate", "broken", candidates["broken"]),
        moe_model,
        tmp_path / "broken",
        print,
    )
    assert (
        broken.refused is not None and "fails smoke's healthy check, which the pin passes" in broken.refused
    )
    assert broken.candidate.decode == [] and "candidate False" in "\n".join(broken.table())


def test_the_mirrors_ik_tree_is_judged_against_the_sdists(
    base_image: str, moe_model: Path, tmp_path: Path
) -> None:
    """The bump the suite can make offline: ik_llama.cpp's pin in the source mirror (the candidate) against
    the tree ik-llama-cpp-python's sdist vendors (the pin before it), each built the same way here."""
    engine = get_engine("ik_llama.cpp")
    _, ref, source = suite_tree(engine)
    if not source.startswith("mirror:"):
        pytest.skip(f"no source mirror holds ik_llama.cpp's pin here (the suite built it from {source})")
    assert engine.sdist is not None and engine.sdist_ref is not None
    old_tree = resolve_local(engine, f"pypi:{engine.sdist}")
    bases = BaseImages(build=base_image, runtime=base_image)
    old = build_image(
        image_spec(engine, "avx2", old_tree, engine.sdist_ref, bases, "localhost", "moe-stack-test"),
        old_tree,
        show=lambda line: None,
    )
    new = build_engine_image("ik_llama.cpp", "avx2", base_image)
    verdict = prove(
        engine,
        Contender("pin", engine.sdist_ref, old),
        Contender("candidate", ref, new.tag),
        moe_model,
        tmp_path,
        print,
    )
    _judged(verdict)
