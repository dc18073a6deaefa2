"""What `load` trusts: its stack is rebuilt by moe-stack from a few parsed values (never the bundle's
text), images.tar may name only the stack's images and replace no local image unasked, and the
archive is held to a sha256 given out of band, computed over exactly the bytes extracted."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from builder.distribute.bundle import BundleError, LoadOptions, load_bundle
from builder.distribute.bundle_trust import check_local_names, check_tags, saved_image_tags
from builder.distribute.loaded_stack import LoadChoices, UntrustedBundle, rebuild_stack
from builder.safe_tar import extract_files
from builder.spec import StackSpec
from builder.stacks.compose import compose_dict
from builder.stacks.record import read_record
from tests.specs import routed_stacks

ROOT = Path(__file__).resolve().parents[2]
EMITTED = yaml.safe_load((ROOT / "compose/qwen3-235b-a22b.llama.cpp.yaml").read_text())
IMAGES = {service["image"].split("@")[0]: "sha256:x" for service in EMITTED["services"].values()}
HERE = LoadChoices(model_files=(Path("/srv/models/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf"),))


def _images(document: dict) -> dict[str, str]:
    return {service["image"].split("@")[0]: "sha256:x" for service in document["services"].values()}


def _without_model_mounts(document: dict) -> dict:
    """`document` less what load sets itself: the model's mounts and where the record says it is."""
    document = copy.deepcopy(document)
    for service in document["services"].values():
        service["volumes"] = [v for v in service["volumes"] if not str(v.get("target")).startswith("/models")]
    for key in ("model", "generator", "loaded-from"):
        document["x-moe-stack"].pop(key, None)
    return document


@pytest.mark.parametrize("path", sorted((ROOT / "compose").glob("*.*.yaml")), ids=lambda path: path.stem)
def test_every_example_stack_is_rebuilt_as_emitted(path: Path) -> None:
    """The rebuild goes through compose's own builders: it gives back the very stack, its model
    mounted file by file from where load put it."""
    document = yaml.safe_load(path.read_text())
    config = Path("/srv/config") if "/model-config" in path.read_text() else None
    rebuilt = rebuild_stack(
        document, _images(document), LoadChoices(model_files=(Path("/srv/m/a.gguf"),), config_dir=config)
    )
    for service in document["services"].values():  # the emitted config mount's source is the example's
        for volume in service["volumes"]:
            if volume.get("target") == "/model-config":
                volume["source"] = "/srv/config"
    assert _without_model_mounts(rebuilt) == _without_model_mounts(document)
    engine = rebuilt["services"]["engine"]
    assert [v for v in engine["volumes"] if str(v["target"]).startswith("/models")] == [
        {"type": "bind", "source": "/srv/m/a.gguf", "target": "/models/a.gguf", "read_only": True}
    ]
    assert rebuilt["x-moe-stack"]["model"] == "/srv/m/a.gguf"


def _with(change: dict[str, object], service: str = "engine") -> dict:
    document = copy.deepcopy(EMITTED)
    document["services"][service].update(change)
    return document


def _top(change: dict[str, object]) -> dict:
    return {**copy.deepcopy(EMITTED), **change}


@pytest.mark.parametrize(
    ("document", "why"),
    [
        (_with({"privileged": True}), "sets privileged"),
        (_with({"network_mode": "host"}), "sets network_mode"),
        (_with({"pid": "host"}), "sets pid"),
        (_with({"devices": ["/dev/sda:/dev/sda"]}), "sets devices"),
        (_with({"user": "0"}), "sets user"),
        (_with({"cap_add": ["SYS_ADMIN"]}), "adds"),
        (
            _with(
                {"volumes": [{"type": "bind", "source": "/etc", "target": "/host-etc", "read_only": True}]}
            ),
            "mounts /etc",
        ),
        (_with({"volumes": ["/:/host"]}), "moe-stack never writes"),
        (
            _with({"volumes": [{"type": "volume", "source": "other-stack-data", "target": "/data"}]}),
            "mounts other-stack",
        ),
        (_with({"image": "evil/miner:latest"}), "doesn't list"),
        (_with({"image": f"{EMITTED['services']['engine']['image']}@md5:0"}), "not a sha256 digest"),
        (_with({"environment": {"LD_PRELOAD": "/models/evil.so"}}), "LD_PRELOAD"),
        (_with({"environment": {"MOE_STACK_NUMA": "interleave; rm -rf /"}}), "NUMA policy"),
        (_with({"cpuset": "0-3; true"}), "cpuset"),
        (_with({"shm_size": "1g --privileged"}), "shm_size"),
        (_with({"command": ["--alias", "a\nb"]}), "control character"),
        (
            _with({"ports": [{"target": 8080, "published": "8080"}, {"target": 22, "published": "22"}]}),
            "single port",
        ),
        (
            _with(
                {
                    "deploy": {
                        "resources": {
                            "reservations": {
                                "devices": [
                                    {"driver": "nvidia", "device_ids": ["/dev/mem"], "capabilities": ["gpu"]}
                                ]
                            }
                        }
                    }
                }
            ),
            "GPU reservation",
        ),
        (_with({"secrets": ["moe-stack-api-key"]}), "pass --api-key-file"),
        (
            _with(
                {
                    "volumes": [
                        {"type": "bind", "source": "/home", "target": "/model-config", "read_only": True}
                    ]
                }
            ),
            "pass --config-dir",
        ),
        (_top({"x-moe-stack": {}}), "names the engine None"),
        (
            _top({"x-moe-stack": {**EMITTED["x-moe-stack"], "served-name": "x\n  evil: 1"}}),
            "control character",
        ),
        (
            _top({"x-moe-stack": {**EMITTED["x-moe-stack"], "serves": {"engine": {"threads": "2; true"}}}}),
            "serves.engine is not",
        ),
        (_top({"networks": {"default": {"external": True}}}), "top-level networks"),
        (_top({"name": "../other"}), "project name"),
        (
            _top({"services": {**EMITTED["services"], "miner": EMITTED["services"]["engine"]}}),
            "service miner",
        ),
        ("just text", "not written by `moe-stack compose`"),
    ],
)
def test_hostile_stacks_are_refused(document: object, why: str) -> None:
    with pytest.raises(UntrustedBundle, match=why):
        rebuild_stack(document, IMAGES, HERE)


def test_a_bundle_lists_exactly_its_stacks_images() -> None:
    with pytest.raises(UntrustedBundle, match="holds exactly its stack's images"):
        rebuild_stack(EMITTED, {**IMAGES, "moe-stack/debian:trixie": "sha256:y"}, HERE)


@pytest.mark.parametrize(
    "change",
    [
        {"read_only": False},
        {"cap_drop": []},
        {"security_opt": ["seccomp:unconfined"]},
        {"tmpfs": ["/models"]},
        {"logging": {"driver": "syslog", "options": {"syslog-address": "udp://203.0.113.9:514"}}},
        {"healthcheck": {"test": ["CMD", "curl", "http://203.0.113.9/"], "start_period": "900s"}},
        {"restart": "always"},
        {"ulimits": {"nofile": 1}},
    ],
)
def test_what_a_bundle_loosens_is_written_back_as_moe_stack_writes_it(change: dict[str, object]) -> None:
    engine = rebuild_stack(_with(change), IMAGES, HERE)["services"]["engine"]
    original = rebuild_stack(EMITTED, IMAGES, HERE)["services"]["engine"]
    for key in change:
        if key == "healthcheck":
            assert engine[key] == {**original[key], "start_period": "900s"}
        else:
            assert engine.get(key) == original.get(key), key


def test_the_host_side_is_the_users() -> None:
    """Published address, model, config directory, API key: set by load, whatever the bundle says."""
    hostile = _with(
        {
            "ports": [{"target": 8080, "published": "8080", "host_ip": "0.0.0.0", "protocol": "tcp"}],
            "volumes": [{"type": "bind", "source": "/", "target": "/models", "read_only": False}],
            "secrets": ["moe-stack-api-key"],
        }
    )
    hostile["secrets"] = {"moe-stack-api-key": {"file": "/etc/shadow"}}
    hostile["x-moe-stack"]["model"] = "/etc/shadow"
    key = Path("/srv/key")
    rebuilt = rebuild_stack(hostile, IMAGES, LoadChoices(model_files=HERE.model_files, api_key_file=key))
    engine = rebuilt["services"]["engine"]
    assert engine["ports"][0]["host_ip"] == "127.0.0.1"
    assert engine["volumes"] == [
        {
            "type": "bind",
            "source": str(HERE.model_files[0]),
            "target": f"/models/{HERE.model_files[0].name}",
            "read_only": True,
        }
    ]
    assert rebuilt["secrets"] == {"moe-stack-api-key": {"file": "/srv/key"}}
    assert rebuilt["x-moe-stack"]["model"] == str(HERE.model_files[0])
    wide = rebuild_stack(EMITTED, IMAGES, LoadChoices(model_files=HERE.model_files, bind="0.0.0.0"))
    assert {s["ports"][0]["host_ip"] for s in wide["services"].values()} == {"0.0.0.0"}
    without = rebuild_stack(EMITTED, IMAGES, HERE)
    assert "secrets" not in without and all("secrets" not in s for s in without["services"].values())


def test_compose_variables_in_a_bundle_reach_nothing() -> None:
    """`${VAR}` in a bundle's command would put this host's environment into the container's
    arguments; rebuilt, it is the literal text."""
    rebuilt = rebuild_stack(_with({"command": ["--alias", "${AWS_SECRET_ACCESS_KEY}"]}), IMAGES, HERE)
    assert rebuilt["services"]["engine"]["command"] == ["--alias", "$${AWS_SECRET_ACCESS_KEY}"]


def _monitored(tmp_path: Path) -> dict:
    tmp_path.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    return compose_dict(
        StackSpec(
            project="p",
            engine="llama.cpp",
            image="img:1",
            threads=4,
            model=model,
            monitoring_port=9090,
            hugetlbfs="2M",
        ),
        "x",
    )


def test_hugetlbfs_and_monitoring_are_rebuilt_in_moe_stacks_shape(tmp_path: Path) -> None:
    monitored = _monitored(tmp_path)
    rebuilt = rebuild_stack(monitored, _images(monitored), LoadChoices(model_files=(tmp_path / "m.gguf",)))
    assert rebuilt["volumes"] == monitored["volumes"]
    assert rebuilt["services"]["prometheus"] == monitored["services"]["prometheus"]
    assert rebuilt["services"]["prometheus"]["pull_policy"] == "never"
    hostile = copy.deepcopy(monitored)
    hostile["volumes"]["hugepages"] = {
        "driver": "local",
        "driver_opts": {"type": "hugetlbfs", "o": "bind", "device": "/etc"},
    }
    with pytest.raises(UntrustedBundle, match="not moe-stack's hugetlbfs volume"):
        rebuild_stack(hostile, _images(monitored), LoadChoices(model_files=(tmp_path / "m.gguf",)))
    hostile["volumes"]["hugepages"] = {**monitored["volumes"]["hugepages"], "name": "other-stack_data"}
    renamed = rebuild_stack(hostile, _images(monitored), LoadChoices(model_files=(tmp_path / "m.gguf",)))
    assert renamed["volumes"]["hugepages"] == monitored["volumes"]["hugepages"]  # no name: this stack's own
    spying = copy.deepcopy(monitored)
    spying["services"]["prometheus"]["environment"]["MOE_STACK_PROMETHEUS_CONFIG"] = "scrape_configs: [evil]"
    spying["services"]["prometheus"]["ports"][0]["host_ip"] = "0.0.0.0"
    assert (
        rebuild_stack(spying, _images(monitored), LoadChoices(model_files=(tmp_path / "m.gguf",)))[
            "services"
        ]["prometheus"]
        == monitored["services"]["prometheus"]
    )


def test_a_routed_stack_is_rebuilt(tmp_path: Path) -> None:
    routed = routed_stacks(tmp_path)
    files = [stack.model for stack in routed]
    router = compose_dict(routed[0], "x", routed=routed)
    rebuilt = rebuild_stack(router, {"img:1": "sha256:x"}, LoadChoices(model_files=tuple(files)))
    assert _without_model_mounts(rebuilt) == _without_model_mounts(router)


def test_dollar_signs_in_the_record_are_escaped_for_compose(tmp_path: Path) -> None:
    """compose reads `${X:?}` anywhere in the file: a model path holding one would stop the stack."""
    where = tmp_path / "${X:?}"
    where.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    model = where / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    document = compose_dict(
        StackSpec(project="p", engine="llama.cpp", image="img:1", threads=4, model=model), "x"
    )
    assert "${X:?}" not in yaml.safe_dump(document).replace("$${X:?}", "")
    assert read_record(document).model == model


def _save_tar(
    path: Path, repo_tags: list[str], repositories: dict | None = None, index: dict | None = None
) -> Path:
    with tarfile.open(path, "w") as tar:
        for name, data in (
            ("manifest.json", [{"Config": "c.json", "RepoTags": repo_tags, "Layers": []}]),
            *((("repositories", repositories),) if repositories else ()),
            *((("index.json", index),) if index else ()),
        ):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return path


def test_images_tar_may_name_only_the_listed_images(tmp_path: Path) -> None:
    listed = {"ghcr.io/moe-stack/llama-cpp:x-cpu-avx2": "sha256:1", "moe-stack/prometheus:trixie": "sha256:2"}
    containerd = {
        "manifests": [
            {
                "annotations": {
                    "io.containerd.image.name": "docker.io/moe-stack/prometheus:trixie",
                    "org.opencontainers.image.ref.name": "trixie",
                }
            }
        ]
    }
    honest = _save_tar(tmp_path / "ok.tar", list(listed), index=containerd)
    check_tags(saved_image_tags(honest), listed)
    retag = _save_tar(tmp_path / "retag.tar", [*listed, "moe-stack/debian:trixie"])
    with pytest.raises(UntrustedBundle, match="would also tag moe-stack/debian:trixie"):
        check_tags(saved_image_tags(retag), listed)
    legacy = _save_tar(tmp_path / "legacy.tar", list(listed), {"debian": {"trixie-slim": "abc"}})
    with pytest.raises(UntrustedBundle, match="debian:trixie-slim"):
        check_tags(saved_image_tags(legacy), listed)
    for annotation in (
        {"io.containerd.image.name": "docker.io/library/debian:trixie-slim"},
        {"org.opencontainers.image.ref.name": "docker.io/library/debian:trixie-slim"},
    ):
        index = _save_tar(
            tmp_path / "index.tar", list(listed), index={"manifests": [{"annotations": annotation}]}
        )
        with pytest.raises(UntrustedBundle, match="would also tag debian:trixie-slim"):
            check_tags(saved_image_tags(index), listed)
        (tmp_path / "index.tar").unlink()
    with pytest.raises(UntrustedBundle, match="lists no images"):
        check_tags(set(), {})


def test_a_local_image_of_the_same_name_is_replaced_only_when_asked() -> None:
    listed = {"moe-stack/prometheus:trixie": "sha256:bundle", "ghcr.io/moe-stack/llama-cpp:x": "sha256:same"}
    here = {"moe-stack/prometheus:trixie": "sha256:mine", "ghcr.io/moe-stack/llama-cpp:x": "sha256:same"}
    with pytest.raises(
        UntrustedBundle, match="replace the local image moe-stack/prometheus:trixie .*--replace-images"
    ):
        check_local_names(listed, here, replace=False)
    check_local_names(listed, here, replace=True)
    check_local_names(listed, {name: None for name in listed}, replace=False)


def test_the_archive_digest_is_of_the_bytes_extracted(tmp_path: Path) -> None:
    archive = tmp_path / "b.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in (("manifest.json", b"{}"), ("models/m.gguf", b"GGUF" * 1000)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o640
            tar.addfile(info, io.BytesIO(data))
        tar.fileobj.write(b"trailing bytes after the archive count too")  # type: ignore[union-attr]
    (tmp_path / "out").mkdir()
    digest = extract_files(archive, tmp_path / "out", lambda name: None)
    assert digest == f"sha256:{hashlib.sha256(archive.read_bytes()).hexdigest()}"
    assert (tmp_path / "out/models/m.gguf").stat().st_mode & 0o777 == 0o640  # the member's read bits, no more


def test_load_holds_the_archive_to_the_expected_sha256(tmp_path: Path) -> None:
    bundle = tmp_path / "b.tar"
    with tarfile.open(bundle, "w") as tar:
        info = tarfile.TarInfo("manifest.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    with pytest.raises(BundleError, match="not the sha256:0000 you expect; don't load it"):
        load_bundle(bundle, tmp_path / "dest", LoadOptions(expect_sha256="0000"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["b.tar"]
