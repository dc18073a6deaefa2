"""The build call as a value: tags, labels, named source context, dry-run command line."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from python_on_whales.exceptions import DockerException

from builder.engines import get_engine
from builder.engines.base import SOURCE_CONTEXT
from builder.errors import BuildFailed, Interrupted
from builder.host.probe import CpuInfo
from builder.images.build import contract_stand_in, plan_build
from builder.images.build_plan import Publishing, local_bases, stream_build
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec, image_tag
from builder.platform.targets import cpu_target
from builder.spec import LocalSource
from tests.hosts import EPYC_9554_FLAGS
from tests.specs import default_spec


def test_tag_format() -> None:
    assert (
        image_tag(image_spec(get_engine("llama.cpp"), ref="0c1e57098"))
        == "ghcr.io/moe-stack/llama-cpp:0c1e57098-cpu-avx2"
    )
    spec = image_spec(
        get_engine("ik_llama.cpp"),
        ref="007d640098cbea95157d81846ada7fe50b9fed08",
        registry="localhost:5000",
        namespace="lab",
    )
    assert image_tag(spec) == "localhost:5000/lab/ik-llama-cpp:007d640098cb-cpu-avx2"


def test_git_build_has_no_source_context(tmp_path: Path) -> None:
    created = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    plan = plan_build(default_spec("llama.cpp"), tmp_path, None, created)
    kwargs = plan.kwargs()
    assert kwargs["build_contexts"] == {}
    assert kwargs["target"] == "runtime" and kwargs["load"] is True
    assert kwargs["file"] == tmp_path / "Dockerfile"
    assert kwargs["labels"] == {"org.opencontainers.image.created": "2026-01-02T03:04:05Z"}


def test_local_source_replaces_the_source_stage(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    spec = default_spec("llama.cpp").model_copy(update={"source": LocalSource(path=tree, ref="mine")})
    plan = plan_build(spec, tmp_path / "ctx", tree)
    assert plan.kwargs()["build_contexts"] == {SOURCE_CONTEXT: str(tree)}
    assert plan.tags == ("ghcr.io/moe-stack/llama-cpp:mine-cpu-avx2",)
    contract, line = plan.command_lines(tmp_path / "out")
    assert contract.endswith(
        f"--target contract --build-context engine-src={tree} "
        f"--output type=local,dest={tmp_path / 'out'} {tmp_path / 'ctx'}"
    )
    assert "--load" not in contract and "--tag" not in contract
    assert line.startswith("docker buildx build --file ")
    assert "--label 'io.moe-stack.server-flags=<flags parsed from" in line
    assert f"--build-context engine-src={tree}" in line
    assert "--tag ghcr.io/moe-stack/llama-cpp:mine-cpu-avx2" in line and line.endswith(str(tmp_path / "ctx"))


def test_publishing_pushes_tag_and_alias_with_attestations_and_a_scoped_cache(tmp_path: Path) -> None:
    spec = image_spec(
        get_engine("ik_llama.cpp"),
        "zen4",
        ref="007d640098cbea95157d81846ada7fe50b9fed08",
        cuda=cuda_target("12.8"),
        registry="ghcr.io",
        namespace="acme",
    )
    plan = plan_build(spec, tmp_path, None).for_publishing(
        spec, Publishing(cache_repo="ghcr.io/acme/moe-stack-cache", metadata_file=tmp_path / "m.json")
    )
    kwargs = plan.kwargs()
    assert kwargs["tags"] == [
        "ghcr.io/acme/ik-llama-cpp:007d640098cb-cuda12.8-zen4",
        "ghcr.io/acme/ik-llama-cpp:cuda12.8-zen4",
    ]
    assert kwargs["push"] is True and kwargs["load"] is False
    assert kwargs["sbom"] is True and kwargs["provenance"] == {"mode": "max"}
    # One string: python-on-whales reads a list as dicts (a list of strings was an AttributeError)
    cache = "ghcr.io/acme/moe-stack-cache:ik-llama-cpp-cuda12.8-zen4"  # the ref left out: a bump reuses it
    assert kwargs["cache_from"] == f"type=registry,ref={cache}"
    assert kwargs["cache_to"] == f"type=registry,ref={cache},mode=max,image-manifest=true,oci-mediatypes=true"
    contract = plan.contract_step(tmp_path / "c").kwargs()
    assert (
        "push" not in contract
        and "cache_to" not in contract
        and contract["cache_from"] == kwargs["cache_from"]
    )
    # The docker driver (the suite's dry run of the image workflow) pushes without attestations.
    bare = plan_build(spec, tmp_path, None).for_publishing(spec, Publishing(attest=False))
    assert bare.kwargs()["push"] is True and "sbom" not in bare.kwargs() and "cache_to" not in bare.kwargs()
    assert "--push" in bare.argv() and not any(a.startswith(("--sbom", "--provenance")) for a in bare.argv())


def test_a_build_cancelled_by_ctrl_c_is_an_interruption(tmp_path: Path) -> None:
    """buildx may see the Ctrl-C before Python does: its "context canceled" is the same interruption."""

    class CancelledBuildx:
        def build(self, **_: object):
            yield "#10 [build 3/5] RUN cmake ..."
            raise DockerException(
                ["docker", "buildx", "build"], 1, stderr=b"ERROR: failed to solve: Canceled: context canceled"
            )

    client = SimpleNamespace(buildx=CancelledBuildx())
    (tmp_path / "Dockerfile").write_text("FROM debian:trixie-slim\n")
    plan = plan_build(default_spec("llama.cpp"), tmp_path, None)
    with (
        (tmp_path / "log").open("w") as log,
        pytest.raises(Interrupted, match="interrupted; rerun the same command"),
    ):
        stream_build(client, plan, log, tmp_path / "log", show=lambda line: None)


def test_a_base_made_on_this_host_is_never_pulled(tmp_path: Path) -> None:
    """`moe-stack/...` would resolve to Docker Hub, where it is not moe-stack's: a missing one stops the
    build before buildx runs, with the command that makes it."""
    dockerfile = (
        "FROM moe-stack/cuda:13.0-devel AS build\nFROM build AS contract\n"
        "FROM --platform=linux/amd64 moe-stack/debian:trixie AS runtime\nFROM debian:trixie-slim\n"
    )
    assert local_bases(dockerfile) == ["moe-stack/cuda:13.0-devel", "moe-stack/debian:trixie"]
    (tmp_path / "Dockerfile").write_text(dockerfile)

    class NoBuildx:
        def build(self, **_: object):
            raise AssertionError("buildx ran")

    client = SimpleNamespace(
        buildx=NoBuildx(), image=SimpleNamespace(exists=lambda name: name.endswith("-devel"))
    )
    plan = plan_build(default_spec("llama.cpp"), tmp_path, None)
    with (
        (tmp_path / "log").open("w") as log,
        pytest.raises(
            BuildFailed,
            match=r"moe-stack/debian:trixie is made on "
            r"this host .*`moe-stack base`",
        ),
    ):
        stream_build(client, plan, log, tmp_path / "log", show=lambda line: None)


def _cpu(flags: str) -> CpuInfo:
    return CpuInfo(flags=frozenset(flags.split()), logical_cpus=2, physical_cores=2)


def test_a_host_that_cannot_run_the_image_reads_the_contract_from_a_build_it_can() -> None:
    """A zen4 image built on an AVX2-only host: its server's --help dies of an illegal instruction, so the
    contract comes from the same tree built for the host's best target (the flags don't depend on the ISA)."""
    avx2_host = _cpu(" ".join(cpu_target("avx2").required_flags))
    zen4 = image_spec(get_engine("llama.cpp"), "zen4", tools=True)
    stand_in = contract_stand_in(zen4, avx2_host)
    assert stand_in is not None and stand_in.cpu.name == "avx2" and stand_in.tools is False
    assert (stand_in.ref, stand_in.cuda, stand_in.base, stand_in.engine) == (
        zen4.ref,
        zen4.cuda,
        zen4.base,
        zen4.engine,
    )
    assert contract_stand_in(zen4, _cpu(EPYC_9554_FLAGS)) is None  # it runs its own
    assert (
        contract_stand_in(image_spec(get_engine("llama.cpp"), "portable"), avx2_host) is None
    )  # dispatches at run time
    assert (
        contract_stand_in(
            image_spec(get_engine("ik_llama.cpp"), "sapphirerapids"), _cpu(EPYC_9554_FLAGS)
        ).cpu.name
        == "zen4"
    )  # type: ignore[union-attr]
    with pytest.raises(BuildFailed, match="runs none of the CPU targets"):
        contract_stand_in(zen4, _cpu("sse2"))
