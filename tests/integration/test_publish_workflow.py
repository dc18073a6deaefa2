"""The image workflow's own step, run here: a row of `moe-stack matrix --json --set default` through
scripts/publish-variant.sh (the script .github/workflows/images.yml runs for every row) against a real
registry, then each pushed digest pulled back and read. What differs from GitHub is said in the
environment: the docker driver (no attestations, no registry cache export), PyPI's sdist of the pinned
ref instead of a clone, the suite's base image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from python_on_whales import DockerClient

from builder.distribute.registry import RegistryError, checked_push, manifest_digest, repository
from builder.engines import get_engine
from builder.images.image_facts import read_image_facts
from tests.cli import run_cli
from tests.integration.conftest import build_engine_image
from tests.integration.registry import running_registry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, docker_client: DockerClient) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


def _row(engine: str, cuda: str, cpu: str) -> dict[str, str]:
    result = run_cli("matrix", "--json", "--set", "default")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["include"]
    return next(r for r in rows if (r["engine"], r["cuda"], r["cpu"]) == (engine, cuda, cpu))


def test_the_workflow_step_publishes_a_matrix_row(
    registry: str, base_image: str, docker_client: DockerClient, tmp_path: Path
) -> None:
    # The suite's own builds of this row (server and tools): the script's builds reuse their layers.
    for tools in (False, True):
        build_engine_image("llama.cpp", "avx2", base_image, tools=tools)
    row = _row("llama.cpp", "none", "avx2")
    assert row["tools"] == "true" and int(row["timeout_minutes"]) > 0
    engine = get_engine(row["engine"])
    pushed_file = tmp_path / "pushed"
    # A compile cache carried in (COMPILE_CACHE, which images.yml no longer passes): a marker in one of
    # its object directories must reach the build's cache mount and come back with the objects the
    # suite's compile of this variant left there; a ccache.conf beside them never crosses (it would run
    # its prefix command on every compile).
    ccache = tmp_path / "ccache"
    (ccache / "0").mkdir(parents=True)
    marker = f"restored by the runner {uuid.uuid4().hex}\n"  # an earlier run's copy would hold another
    (ccache / "0/moe-stack-seed-marker").write_text(marker)
    (ccache / "ccache.conf").write_text("prefix_command = false\n")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # this checkout's moe-stack
        **{key.upper(): value for key, value in row.items() if key in ("engine", "cuda", "cpu", "tools")},
        "CUDA_ARCHS": row["cuda_archs"],
        "REF": row["ref"],
        "REGISTRY": registry,
        "NAMESPACE": "workflow",
        "PUSHED": str(pushed_file),
        "ATTEST": "false",
        "SOURCE": f"pypi:{engine.sdist}",
        "BASE_IMAGE": base_image,
        "COMPILE_CACHE": str(ccache),
    }
    result = subprocess.run(
        ["bash", str(ROOT / "scripts/publish-variant.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (ccache / "0/moe-stack-seed-marker").read_text() == marker
    assert not (ccache / "ccache.conf").exists()  # only the object directories came back
    results = [path for path in ccache.rglob("*R") if path.is_file()]  # ccache 4's result files
    assert len(results) > 100, f"{len(results)} ccache results exported: {sorted(ccache.iterdir())[:10]}"
    assert not list(tmp_path.glob(".ccache.*"))  # the exports' staging directories are gone
    # The row's tag under this registry, its moving alias, and the tools image's two: each as the
    # registry serves it (the build checked that before printing it).
    immutable = row["tag"].replace("ghcr.io/moe-stack/", f"{registry}/workflow/")
    image, _, variant = immutable.rpartition(":")
    alias = variant.split("-", 1)[1]
    printed = dict(line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("pushed "))
    assert set(printed) == {
        f"{image}:{variant}",
        f"{image}:{alias}",
        f"{image}-tools:{variant}",
        f"{image}-tools:{alias}",
    }, result.stdout[-2000:]
    assert printed[f"{image}:{variant}"] == printed[f"{image}:{alias}"]
    assert printed[f"{image}-tools:{variant}"] == printed[f"{image}-tools:{alias}"]
    for tag, digest in printed.items():
        name, _, short = tag.rpartition(":")
        assert manifest_digest(repository(name), short) == digest
    # What the workflow signs: one digest an image, and each pulls back as the image it was built as.
    digests = pushed_file.read_text().split()
    assert sorted(digests) == sorted(
        {f"{image}@{printed[f'{image}:{variant}']}", f"{image}-tools@{printed[f'{image}-tools:{variant}']}"}
    )
    for reference in digests:
        docker_client.image.pull(reference, quiet=True)
        facts = read_image_facts(reference)
        assert facts.engine.name == "llama.cpp" and facts.cpu_target == "avx2", reference
        assert "--override-tensor" in facts.server_flags
    # A tag the registry serves at another digest than the build's (a raced push) is refused in one line.
    stale = tmp_path / "stale.json"
    other = printed[f"{image}-tools:{variant}"]
    stale.write_text(json.dumps({"containerimage.digest": other, "image.name": f"{image}:{variant}"}))
    with pytest.raises(RegistryError, match=f"serves {printed[f'{image}:{variant}']}, not the {other}"):
        checked_push(stale)
    # The workflow hands the script the row the same way, and no compile cache (GitHub's Actions cache
    # can be written by any job on the branch: tests/unit/test_workflows.py).
    service = yaml.safe_load((ROOT / ".github/workflows/images.yml").read_text())["jobs"]["build"]
    step = next(s for s in service["steps"] if "publish-variant.sh" in str(s.get("run", "")))
    assert set(step["env"]) >= {
        "ENGINE",
        "CUDA",
        "CUDA_ARCHS",
        "CPU",
        "TOOLS",
        "REGISTRY",
        "NAMESPACE",
        "PUSHED",
    }
    assert "COMPILE_CACHE" not in step["env"]
