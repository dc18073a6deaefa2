"""What `load` trusts: a bundle's stack must have the shape moe-stack emits, its images.tar may tag only
the manifest's images, and the archive can be held to a sha256 given out of band."""

from __future__ import annotations

import copy
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from builder.distribute.bundle import BundleError, load_bundle
from builder.distribute.bundle_trust import UntrustedBundle, check_stack_shape, check_tags, saved_image_tags
from builder.spec import StackSpec
from builder.stacks.compose import compose_dict

ROOT = Path(__file__).resolve().parents[2]
EMITTED = yaml.safe_load((ROOT / "compose/qwen3-235b-a22b.llama.cpp.yaml").read_text())
IMAGES = {service["image"]: "sha256:x" for service in EMITTED["services"].values()}


def test_every_example_stack_has_the_emitted_shape() -> None:
    for path in sorted((ROOT / "compose").glob("*.*.yaml")):
        document = yaml.safe_load(path.read_text())
        check_stack_shape(document, {s["image"]: "sha256:x" for s in document["services"].values()})


def _with(change: dict[str, object]) -> dict:
    document = copy.deepcopy(EMITTED)
    document["services"]["engine"].update(change)
    return document


@pytest.mark.parametrize(("document", "why"), [
    (_with({"privileged": True}), "sets privileged"),
    (_with({"network_mode": "host"}), "sets network_mode"),
    (_with({"pid": "host"}), "sets pid"),
    (_with({"devices": ["/dev/sda:/dev/sda"]}), "sets devices"),
    (_with({"cap_add": ["SYS_ADMIN"]}), "adds SYS_ADMIN"),
    (_with({"security_opt": ["seccomp:unconfined"]}), "loosens"),
    (_with({"read_only": False}), "loosens"),
    (_with({"volumes": [{"type": "bind", "source": "/", "target": "/models", "read_only": False}]}), "mounts / at"),
    (_with({"volumes": [{"type": "bind", "source": "/etc", "target": "/host-etc", "read_only": True}]}), "mounts /etc"),
    (_with({"volumes": ["/:/host"]}), "short-syntax volume"),
    (_with({"image": "evil/miner:latest"}), "doesn't list"),
    (_with({"logging": {"driver": "syslog", "options": {"syslog-address": "udp://203.0.113.9:514"}}}),
     "sends its logs elsewhere"),
    ({**EMITTED, "x-moe-stack": {}}, "no services or x-moe-stack.model"),
    ({**EMITTED, "networks": {"default": {"external": True}}}, "top-level networks"),
    ({**EMITTED, "secrets": {"other": {"file": "/etc/shadow"}}}, "secret 'other'"),
    ({**EMITTED, "volumes": {"data": {"driver": "local"}}}, "not moe-stack's hugetlbfs volume"),
    ("just text", "not written by `moe-stack compose`"),
])
def test_hostile_stacks_are_refused(document: object, why: str) -> None:
    with pytest.raises(UntrustedBundle, match=why):
        check_stack_shape(document, IMAGES)


def _save_tar(path: Path, repo_tags: list[str], repositories: dict | None = None) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in (("manifest.json", [{"Config": "c.json", "RepoTags": repo_tags, "Layers": []}]),
                           *((("repositories", repositories),) if repositories else ())):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def test_images_tar_may_tag_only_the_listed_images(tmp_path: Path) -> None:
    listed = {"ghcr.io/moe-stack/llama-cpp:x-cpu-avx2": "sha256:1"}
    honest = _save_tar(tmp_path / "ok.tar", list(listed))
    check_tags(saved_image_tags(honest), listed)
    retag = _save_tar(tmp_path / "retag.tar", [*listed, "moe-stack/debian:trixie"])
    with pytest.raises(UntrustedBundle, match="would also tag moe-stack/debian:trixie"):
        check_tags(saved_image_tags(retag), listed)
    legacy = _save_tar(tmp_path / "legacy.tar", list(listed), {"debian": {"trixie-slim": "abc"}})
    with pytest.raises(UntrustedBundle, match="debian:trixie-slim"):
        check_tags(saved_image_tags(legacy), listed)
    with pytest.raises(UntrustedBundle, match="lists no images"):
        check_tags(set(), {})


def test_load_holds_the_archive_to_the_expected_sha256(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    bundle.write_bytes(b"not what was sent")
    with pytest.raises(BundleError, match="not the sha256:0000 you expect; don't load it"):
        load_bundle(bundle, tmp_path / "dest", expect_sha256="0000")
    assert not (tmp_path / "dest").exists()


def test_a_monitored_and_a_routed_stack_have_the_emitted_shape(tmp_path: Path) -> None:
    tmp_path.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    base = {"project": "p", "engine": "llama.cpp", "image": "img:1", "threads": 4}
    monitored = compose_dict(StackSpec(**base, model=model, monitoring_port=9090), "x")
    check_stack_shape(monitored, {s["image"]: "sha256:x" for s in monitored["services"].values()})
    other = tmp_path / "n.gguf"
    other.write_bytes(b"GGUF")
    other.chmod(0o644)
    routed = (StackSpec(**base, model=model, served_name="m"), StackSpec(**base, model=other, served_name="n"))
    router = compose_dict(routed[0], "x", routed=routed)
    check_stack_shape(router, {"img:1": "sha256:x"})
    hostile = copy.deepcopy(monitored)
    hostile["volumes"]["prometheus-data"] = {"driver": "local", "driver_opts": {"type": "none", "o": "bind",
                                                                                "device": "/etc"}}
    with pytest.raises(UntrustedBundle, match="not moe-stack's hugetlbfs volume"):
        check_stack_shape(hostile, {s["image"]: "sha256:x" for s in monitored["services"].values()})
