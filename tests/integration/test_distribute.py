"""Images leave the machine and come back: a real registry (distribution v2 on 127.0.0.1) for publish
and pull, and an air-gapped bundle loaded back and served."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from python_on_whales import DockerClient

from builder.distribute.bundle import sha256
from builder.distribute.choose import choose_variant
from builder.distribute.loaded_stack import loaded_image
from builder.distribute.registry import manifest_digest, repository
from builder.engines.base import StackSpec
from builder.host.probe import probe
from builder.images.image_facts import read_image_facts
from builder.images.naming import parse_variant
from builder.running.run import down, up
from builder.stackfile.host_checks import free_local_port
from builder.stackfile.stack_file import StackFile
from builder.stacks.compose import compose_stack, write_stack
from tests.cli import run_cli
from tests.integration.conftest import BuiltImage, StackFactory, build_engine_image
from tests.integration.registry import running_registry

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory, docker_client: DockerClient) -> Iterator[str]:
    with running_registry(tmp_path_factory.mktemp("registry")) as address:
        yield address


@pytest.fixture
def locked_registry(tmp_path: Path, docker_client: DockerClient) -> Iterator[str]:
    with running_registry(tmp_path, users={"alice": "s3cret-for-tests"}) as address:
        yield address
        subprocess.run(["docker", "logout", address], capture_output=True, check=False)


def _untag(client: DockerClient, prefix: str) -> None:
    """Forget every local tag under `prefix`, so the next pull really fetches."""
    for image in client.image.list():
        for tag in image.repo_tags:
            if tag.startswith(prefix):
                client.image.remove(tag)


def test_publish_then_pull_the_variant_for_this_host(
    registry: str, base_image: str, docker_client: DockerClient, start_stack: StackFactory, moe_model: Path
) -> None:
    empty = run_cli("pull", "--from", f"{registry}/nobody-published-here")
    assert empty.returncode == 1 and "holds no moe-stack variants" in empty.stderr
    assert len(empty.stderr.strip().splitlines()) == 1, empty.stderr
    # The better variant this host can't run (no AMX here, nor on CI) is published and passed over.
    images = [build_engine_image("llama.cpp", cpu, base_image) for cpu in ("avx2", "sapphirerapids")]
    prefix = f"{registry}/moe-stack"
    result = run_cli("publish", *(i.tag for i in images), "--to", prefix)
    assert result.returncode == 0, result.stderr
    pushed = dict(re.findall(r"^pushed (\S+) (sha256:[0-9a-f]{64})$", result.stdout, re.MULTILINE))
    assert len(pushed) == 4, result.stdout  # each image: immutable tag + moving alias
    repo = repository(f"{prefix}/llama-cpp")
    for tag, digest in pushed.items():
        assert manifest_digest(repo, tag.rpartition(":")[2]) == digest
    assert pushed[f"{repo.name}:cpu-sapphirerapids"] == pushed[f"{repo.name}:0c1e57098-cpu-sapphirerapids"]

    _untag(docker_client, prefix)
    result = run_cli("pull", "--from", prefix, "--engine", "llama.cpp")
    assert result.returncode == 0, result.stderr
    expected = choose_variant(probe(), [parse_variant(i.tag.rpartition(":")[2]) for i in images]).offered.tag
    pulled = f"{repo.name}:{expected}"
    assert f"pulled {pulled} ({pushed[pulled]})" in result.stdout
    facts = read_image_facts(pulled)  # labels survived the round trip
    assert facts.engine.name == "llama.cpp" and "--override-tensor" in facts.server_flags
    stack = start_stack(
        BuiltImage(engine="llama.cpp", tag=pulled, ref="0c1e57098", cpu=facts.cpu_target), moe_model
    )
    service = yaml.safe_load(stack.compose_file.read_text())["services"]["engine"]
    assert service["image"] == f"{pulled}@{pushed[pulled]}", "a stack from a pulled image pins its digest"
    assert stack.client.compose.ps()[0].image == docker_client.image.inspect(pulled).id


def test_registry_unreachable_and_auth_refused(locked_registry: str, base_image: str) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image)
    closed = f"127.0.0.1:{free_local_port()}"
    result = run_cli("publish", image.tag, "--to", f"{closed}/moe-stack")
    assert result.returncode == 1 and f"registry {closed} is unreachable" in result.stderr
    result = run_cli("pull", "--from", f"{closed}/moe-stack")
    assert result.returncode == 1 and f"registry {closed} is unreachable" in result.stderr

    prefix = f"{locked_registry}/moe-stack"
    result = run_cli("publish", image.tag, "--to", prefix)
    assert result.returncode == 1, result.stdout
    assert (
        "pushed before it: nothing" in result.stderr
        and f"run `docker login {locked_registry}`" in result.stderr
    )
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    result = run_cli("pull", "--from", prefix)
    assert result.returncode == 1 and f"run `docker login {locked_registry}`" in result.stderr

    login = subprocess.run(
        ["docker", "login", "-u", "alice", "--password-stdin", locked_registry],
        input="s3cret-for-tests",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert login.returncode == 0, login.stderr
    result = run_cli("publish", image.tag, "--to", prefix)
    assert result.returncode == 0, result.stderr
    result = run_cli("pull", "--from", prefix, "--cpu-only")  # tag list read with the stored login
    assert result.returncode == 0, result.stderr


def test_bundle_round_trip(
    base_image: str, docker_client: DockerClient, moe_model: Path, tmp_path: Path
) -> None:
    built = build_engine_image("llama.cpp", "avx2", base_image)
    image = f"localhost/moe-stack-bundle/llama-cpp:{uuid.uuid4().hex[:8]}"  # a tag only this test holds
    docker_client.image.tag(built.tag, image)
    port = free_local_port()
    stack = StackSpec(
        project_name=f"mst-bundle-{port}",
        engine="llama.cpp",
        image_ref=image,
        model=moe_model,
        port=port,
        cpu_threads=2,
    )
    compose_file = write_stack(
        compose_stack(stack, "pytest", read_image_facts(image)), tmp_path / "made" / "compose.yaml"
    )
    archive = tmp_path / "stack.tar"
    result = run_cli("bundle", str(compose_file), "--out", str(archive), "--include-model")
    assert result.returncode == 0, result.stderr
    digest = sha256(archive).removeprefix("sha256:")
    image_id = docker_client.image.inspect(image).id
    docker_client.image.remove(image)  # the other machine has never seen it

    corrupt = tmp_path / "corrupt.tar"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside images.tar, the largest member
    corrupt.write_bytes(bytes(data))
    result = run_cli("load", str(corrupt), "--dest", str(tmp_path / "bad"), "--unverified")
    assert result.returncode == 1 and re.search(
        r"images\.tar is sha256:[0-9a-f]{64}, the manifest says sha256:", result.stderr
    ), result.stderr
    truncated = tmp_path / "truncated.tar"
    truncated.write_bytes(archive.read_bytes()[: archive.stat().st_size // 3])
    result = run_cli("load", str(truncated), "--dest", str(tmp_path / "bad"), "--unverified")
    assert result.returncode == 1 and "is truncated or not a tar archive" in result.stderr, result.stderr
    assert not docker_client.image.exists(image) and not (tmp_path / "bad" / "compose.yaml").exists()

    empty_key = tmp_path / "empty-key"
    empty_key.write_text(" \n")
    result = run_cli(
        "load",
        str(archive),
        "--dest",
        str(tmp_path / "bad"),
        "--expect-sha256",
        digest,
        "--api-key-file",
        str(empty_key),
    )
    assert result.returncode == 1 and "has no key on its first line" in result.stderr, result.stderr

    # The bundle's stack checks no key; this host's key is the user's: the loaded stack checks it.
    key = tmp_path / "key"
    key.write_text("this-hosts-key\n")
    key.chmod(0o644)
    dest = tmp_path / "elsewhere"
    result = run_cli(
        "load", str(archive), "--dest", str(dest), "--expect-sha256", digest, "--api-key-file", str(key)
    )
    assert result.returncode == 0, result.stderr
    # Loaded with no name of its own: only under the bundle's scope (the builder or another stack may
    # resolve the bundle's name, here one no image on this host had before).
    assert not docker_client.image.exists(image)
    assert docker_client.image.inspect(loaded_image(image, f"sha256:{digest}")).id == image_id
    loaded_model = dest / "models" / moe_model.name
    assert loaded_model.read_bytes() == moe_model.read_bytes()
    assert (
        loaded_model.stat().st_mode & 0o777 == moe_model.stat().st_mode & 0o644 | 0o400
    )  # no wider than it was
    dest.chmod(0o755)
    loaded = dest / "compose.yaml"
    document = StackFile.read(loaded)
    assert document.name.startswith("moe-loaded-") and document.name != stack.project_name
    try:
        up(loaded, timeout_s=180)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60)
        assert refused.value.code == 401
        asked = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "Bearer this-hosts-key"}
        )
        with urllib.request.urlopen(asked, timeout=60) as response:
            assert response.status == 200
        mounts = DockerClient(compose_files=[loaded]).compose.ps()[0].mounts
        assert [(m.destination, m.source) for m in mounts if m.destination.startswith("/models")] == [
            (f"/models/{moe_model.name}", str(loaded_model.resolve()))
        ]
    finally:
        down(loaded)
        docker_client.image.remove(loaded_image(image, f"sha256:{digest}"), force=True)


def test_a_bundle_that_would_retag_local_images_is_refused(
    base_image: str, docker_client: DockerClient, moe_model: Path, tmp_path: Path
) -> None:
    """images.tar holding a second tag (here: the local base image every build starts from) would
    replace that image on `docker load`; load refuses before loading anything, and --expect-sha256
    holds the archive to the hash `bundle` printed."""
    built = build_engine_image("llama.cpp", "avx2", base_image)
    image = f"localhost/moe-stack-bundle/llama-cpp:{uuid.uuid4().hex[:8]}"
    docker_client.image.tag(built.tag, image)
    made = [image]
    try:
        stack = StackSpec(
            project_name="mst-retag", engine="llama.cpp", image_ref=image, model=moe_model, cpu_threads=2
        )
        compose_file = write_stack(
            compose_stack(stack, "pytest", read_image_facts(image)), tmp_path / "compose.yaml"
        )
        archive = tmp_path / "stack.tar"
        result = run_cli("bundle", str(compose_file), "--out", str(archive))
        assert result.returncode == 0, result.stderr
        printed = re.search(r"--expect-sha256 ([0-9a-f]{64})", " ".join(result.stdout.split()))
        assert printed and f"sha256:{printed[1]}" == sha256(archive)
        # The hostile copy: the same bundle, its images.tar re-saved with the base image's tag too and
        # the manifest's checksum of it updated (the manifest vouches only for itself).
        work = tmp_path / "hostile"
        work.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        docker_client.image.save([image, base_image], output=work / "images.tar")
        manifest = json.loads((work / "manifest.json").read_text())
        manifest["files"]["images.tar"] = sha256(work / "images.tar")
        (work / "manifest.json").write_text(json.dumps(manifest))
        hostile = tmp_path / "hostile.tar"
        with tarfile.open(hostile, "w") as tar:
            for name in ("manifest.json", "compose.yaml", "images.tar"):
                tar.add(work / name, arcname=name)
        base_id = docker_client.image.inspect(base_image).id
        result = run_cli(
            "load",
            str(hostile),
            "--dest",
            str(tmp_path / "dest"),
            "--unverified",
            "--model-dir",
            str(moe_model.parent),
        )
        assert result.returncode == 1 and f"would also tag {base_image}" in result.stderr, result.stderr
        assert docker_client.image.inspect(base_image).id == base_id
        result = run_cli(
            "load", str(hostile), "--dest", str(tmp_path / "dest"), "--expect-sha256", printed[1]
        )
        assert result.returncode == 1 and "you expect; don't load it" in result.stderr, result.stderr
        assert not (tmp_path / "dest" / "compose.yaml").exists()
        # The honest bundle, where this host has another image under the bundle's image name: that one
        # stays what it is; the loaded stack runs the bundle's image under the bundle's own scope.
        own_id = docker_client.image.inspect(image).id
        docker_client.image.tag(base_image, image)
        result = run_cli(
            "load",
            str(archive),
            "--dest",
            str(tmp_path / "dest"),
            "--expect-sha256",
            printed[1],
            "--model-dir",
            str(moe_model.parent),
        )
        assert result.returncode == 0, result.stderr
        assert docker_client.image.inspect(image).id == base_id
        scoped = loaded_image(image, f"sha256:{printed[1]}")
        made.append(scoped)
        assert docker_client.image.inspect(scoped).id == own_id
        assert StackFile.read(tmp_path / "dest" / "compose.yaml").service("engine").image == scoped
    finally:
        for name in made:
            if docker_client.image.exists(name):
                docker_client.image.remove(name, force=True)


def test_a_bundle_listing_a_local_images_id_cannot_re_point_its_name(
    base_image: str, docker_client: DockerClient, moe_model: Path, tmp_path: Path
) -> None:
    """The victim's name listed with the victim's own (public) ID clashes with nothing here, and
    `docker load` would apply the name to images.tar's image before any check of IDs after it: load
    reads each name's image ID from images.tar itself and refuses before Docker loads anything."""
    tag = uuid.uuid4().hex[:8]
    victim, theirs = f"localhost/moe-stack-victim/llama-cpp:{tag}", f"localhost/moe-stack-theirs/x:{tag}"
    docker_client.image.tag(base_image, victim)
    container = docker_client.container.create(base_image, ["true"])
    try:
        docker_client.container.commit(container, theirs)  # another image: the bundle's own code
        victim_id = docker_client.image.inspect(victim).id
        assert docker_client.image.inspect(theirs).id != victim_id
        stack = StackSpec(
            project_name="mst-victim", engine="llama.cpp", image_ref=victim, model=moe_model, cpu_threads=2
        )
        compose_file = write_stack(compose_stack(stack, "pytest"), tmp_path / "compose.yaml")
        archive = tmp_path / "stack.tar"
        result = run_cli("bundle", str(compose_file), "--out", str(archive))
        assert result.returncode == 0, result.stderr
        work = tmp_path / "hostile"
        work.mkdir()
        with tarfile.open(archive) as tar:
            tar.extractall(work, filter="data")
        assert json.loads((work / "manifest.json").read_text())["images"] == {victim: victim_id}
        docker_client.image.tag(theirs, victim)  # saved under the victim's name...
        docker_client.image.save([victim], output=work / "images.tar")
        docker_client.image.tag(base_image, victim)  # ...which is the victim's again here
        manifest = json.loads((work / "manifest.json").read_text())
        manifest["files"]["images.tar"] = sha256(work / "images.tar")  # the manifest vouches for itself
        (work / "manifest.json").write_text(json.dumps(manifest))
        hostile = tmp_path / "hostile.tar"
        with tarfile.open(hostile, "w") as tar:
            for name in ("manifest.json", "compose.yaml", "images.tar"):
                tar.add(work / name, arcname=name)
        result = run_cli(
            "load",
            str(hostile),
            "--dest",
            str(tmp_path / "dest"),
            "--unverified",
            "--model-dir",
            str(moe_model.parent),
        )
        assert result.returncode == 1 and f"manifest.json gives {victim} the image" in result.stderr, (
            result.stderr
        )
        assert docker_client.image.inspect(victim).id == victim_id
        assert not (tmp_path / "dest" / "compose.yaml").exists()
    finally:
        docker_client.container.remove(container)
        for image in (victim, theirs):
            if docker_client.image.exists(image):
                docker_client.image.remove(image, force=True)
