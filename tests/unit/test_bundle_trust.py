"""What `load` trusts: its stack is rebuilt by moe-stack from a few parsed values (never the bundle's
text), images.tar may name only the stack's images, each with the ID its manifest lists (read from the
tar before Docker sees it), Docker is given it with no name in it and the images are named under the
bundle's own scope, the stack's compose project and API key are the loading host's, and the archive is
held to a sha256 given out of band, computed over exactly the bytes extracted."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
import yaml

from builder.distribute import bundle as bundle_module
from builder.distribute.bundle import BundleError, LoadOptions, load_bundle
from builder.distribute.bundle_trust import check_images_tar, check_saved_names, nameless
from builder.distribute.loaded_stack import (
    LoadChoices,
    UntrustedBundle,
    loaded_image,
    loaded_project_name,
    rebuild_stack,
)
from builder.engines.base import StackSpec
from builder.safe_tar import extract_files
from builder.stackfile.stack_file import StackFile
from builder.stacks.document import project_name_for
from tests.specs import compose_dict, routed_stacks

ROOT = Path(__file__).resolve().parents[2]
EMITTED = yaml.safe_load((ROOT / "compose/qwen3-235b-a22b.llama.cpp.yaml").read_text())
IMAGES = {service["image"].split("@")[0]: "sha256:x" for service in EMITTED["services"].values()}
BUNDLE = "sha256:" + "ab12" * 16  # the archive's digest: its images' names and project derive from it
DEST = Path("/srv/loaded")


def _choices(*model_files: Path, **choices: object) -> LoadChoices:
    given: dict[str, object] = {"bundle_digest": BUNDLE, "dest": DEST, **choices}
    return LoadChoices(model_files=model_files, **given)  # type: ignore[arg-type]


HERE = _choices(Path("/srv/models/Qwen3-235B-A22B-Q4_K_M-00001-of-00003.gguf"))


def _images(document: dict) -> dict[str, str]:
    return {service["image"].split("@")[0]: "sha256:x" for service in document["services"].values()}


def _as_loaded(document: dict) -> dict:
    """`document` with its images named as load names them: under the bundle's scope, never pulled."""
    document = copy.deepcopy(document)
    for service in document["services"].values():
        service["image"] = loaded_image(service["image"].split("@")[0], BUNDLE)
        service["pull_policy"] = "never"
    document["x-moe-stack"]["image"] = loaded_image(document["x-moe-stack"]["image"], BUNDLE)
    return document


def _without_model_mounts(document: dict) -> dict:
    """`document` less what load sets itself: the model's mounts and where the record says it is."""
    document = copy.deepcopy(document)
    document.pop("name")  # load's own (test_the_project_is_named_as_compose_names_it)
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
    rebuilt = _rebuilt(document, _images(document), _choices(Path("/srv/m/a.gguf"), config_dir=config))
    for service in document["services"].values():  # the emitted config mount's source is the example's
        for volume in service["volumes"]:
            if volume.get("target") == "/model-config":
                volume["source"] = "/srv/config"
    assert _without_model_mounts(rebuilt) == _without_model_mounts(_as_loaded(document))
    engine = rebuilt["services"]["engine"]
    assert [v for v in engine["volumes"] if str(v["target"]).startswith("/models")] == [
        {"type": "bind", "source": "/srv/m/a.gguf", "target": "/models/a.gguf", "read_only": True}
    ]
    assert rebuilt["x-moe-stack"]["model"] == "/srv/m/a.gguf"
    assert rebuilt["name"] == loaded_project_name(Path("/srv/m/a.gguf"), _choices())


def _rebuilt(document: object, images: dict[str, str], choices: LoadChoices) -> dict:
    """The stack `load` writes for `document`, as plain data."""
    return rebuild_stack(document, images, choices).document()


def _with(change: dict[str, object], service: str = "engine") -> dict:
    document = copy.deepcopy(EMITTED)
    document["services"][service].update(change)
    return document


def _top(change: dict[str, object]) -> dict:
    return {**copy.deepcopy(EMITTED), **change}


@pytest.mark.parametrize(
    ("document", "why"),
    [
        (_with({"privileged": True}), "has services.engine.privileged, which moe-stack never writes"),
        (_with({"network_mode": "host"}), "services.engine.network_mode"),
        (_with({"pid": "host"}), "services.engine.pid"),
        (_with({"devices": ["/dev/sda:/dev/sda"]}), "services.engine.devices"),
        (_with({"user": "0"}), "services.engine.user"),
        (_with({"cap_add": ["SYS_ADMIN"]}), "adds"),
        (_with({"ulimits": {"nofile": 1}}), "services.engine.ulimits.nofile moe-stack never writes"),
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
        (_top({"x-moe-stack": {}}), "lacks x-moe-stack.generated-by"),
        (
            _top({"x-moe-stack": {**EMITTED["x-moe-stack"], "engine": "vllm"}}),
            "x-moe-stack.engine .*unknown engine 'vllm'",
        ),
        (
            _top({"x-moe-stack": {**EMITTED["x-moe-stack"], "served-name": "x\n  evil: 1"}}),
            "control character",
        ),
        (
            _top({"x-moe-stack": {**EMITTED["x-moe-stack"], "serves": {"engine": {"threads": "2; true"}}}}),
            "x-moe-stack.serves.engine.threads",
        ),
        (_top({"networks": {"default": {"external": True}}}), "top-level networks"),
        (
            _top({"services": {**EMITTED["services"], "miner": EMITTED["services"]["engine"]}}),
            "service miner",
        ),
        ("just text", "not written by `moe-stack compose`"),
    ],
)
def test_hostile_stacks_are_refused(document: object, why: str) -> None:
    with pytest.raises(UntrustedBundle, match=why):
        _rebuilt(document, IMAGES, HERE)


def test_a_bundle_lists_exactly_its_stacks_images() -> None:
    with pytest.raises(UntrustedBundle, match="holds exactly its stack's images"):
        _rebuilt(EMITTED, {**IMAGES, "moe-stack/debian:trixie": "sha256:y"}, HERE)


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
        {"ulimits": {"nofile": {"soft": 1, "hard": 1}}},
    ],
)
def test_what_a_bundle_loosens_is_written_back_as_moe_stack_writes_it(change: dict[str, object]) -> None:
    engine = _rebuilt(_with(change), IMAGES, HERE)["services"]["engine"]
    original = _rebuilt(EMITTED, IMAGES, HERE)["services"]["engine"]
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
    rebuilt = _rebuilt(hostile, IMAGES, _choices(*HERE.model_files, api_key_file=key))
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
    wide = _rebuilt(EMITTED, IMAGES, _choices(*HERE.model_files, bind="0.0.0.0"))
    assert {s["ports"][0]["host_ip"] for s in wide["services"].values()} == {"0.0.0.0"}
    without = _rebuilt(EMITTED, IMAGES, HERE)
    assert "secrets" not in without and all("secrets" not in s for s in without["services"].values())


def test_compose_variables_in_a_bundle_reach_nothing() -> None:
    """`${VAR}` in a bundle's command would put this host's environment into the container's
    arguments; rebuilt, it is the literal text."""
    rebuilt = _rebuilt(_with({"command": ["--alias", "${AWS_SECRET_ACCESS_KEY}"]}), IMAGES, HERE)
    assert rebuilt["services"]["engine"]["command"] == ["--alias", "$${AWS_SECRET_ACCESS_KEY}"]


def _monitored(tmp_path: Path) -> dict:
    tmp_path.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    return compose_dict(
        StackSpec(
            project_name="p",
            engine="llama.cpp",
            image_ref="img:1",
            cpu_threads=4,
            model=model,
            monitoring=True,
            hugetlbfs="2M",
        ),
        "x",
    )


def test_hugetlbfs_and_monitoring_are_rebuilt_in_moe_stacks_shape(tmp_path: Path) -> None:
    monitored = _monitored(tmp_path)
    rebuilt = _rebuilt(monitored, _images(monitored), _choices(tmp_path / "m.gguf"))
    assert rebuilt["volumes"] == monitored["volumes"]
    assert rebuilt["services"]["prometheus"] == _as_loaded(monitored)["services"]["prometheus"]
    assert rebuilt["services"]["prometheus"]["pull_policy"] == "never"
    hostile = copy.deepcopy(monitored)
    hostile["volumes"]["hugepages"] = {
        "driver": "local",
        "driver_opts": {"type": "hugetlbfs", "o": "bind", "device": "/etc"},
    }
    with pytest.raises(UntrustedBundle, match="not moe-stack's hugetlbfs volume"):
        _rebuilt(hostile, _images(monitored), _choices(tmp_path / "m.gguf"))
    hostile["volumes"]["hugepages"] = {**monitored["volumes"]["hugepages"], "name": "other-stack_data"}
    renamed = _rebuilt(hostile, _images(monitored), _choices(tmp_path / "m.gguf"))
    assert renamed["volumes"]["hugepages"] == monitored["volumes"]["hugepages"]  # no name: this stack's own
    spying = copy.deepcopy(monitored)
    spying["services"]["prometheus"]["environment"]["MOE_STACK_PROMETHEUS_CONFIG"] = "scrape_configs: [evil]"
    spying["services"]["prometheus"]["ports"][0]["host_ip"] = "0.0.0.0"
    assert (
        _rebuilt(spying, _images(monitored), _choices(tmp_path / "m.gguf"))["services"]["prometheus"]
        == _as_loaded(monitored)["services"]["prometheus"]
    )


def test_a_routed_stack_is_rebuilt(tmp_path: Path) -> None:
    routed = routed_stacks(tmp_path)
    files = [stack.model.path for stack in routed]
    router = compose_dict(routed[0], "x", routed=routed)
    rebuilt = _rebuilt(router, {"img:1": "sha256:x"}, _choices(*files))
    assert _without_model_mounts(rebuilt) == _without_model_mounts(_as_loaded(router))


def test_dollar_signs_in_the_record_are_escaped_for_compose(tmp_path: Path) -> None:
    """compose reads `${X:?}` anywhere in the file: a model path holding one would stop the stack."""
    where = tmp_path / "${X:?}"
    where.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    model = where / "m.gguf"
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    document = compose_dict(
        StackSpec(project_name="p", engine="llama.cpp", image_ref="img:1", cpu_threads=4, model=model), "x"
    )
    assert "${X:?}" not in yaml.safe_dump(document).replace("$${X:?}", "")
    assert StackFile.parse(document).record.model == model


def _digest(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def _blob(data: object) -> tuple[str, bytes]:
    """An OCI blob: its path in a `docker save` archive and its bytes."""
    raw = json.dumps(data).encode()
    return f"blobs/sha256/{hashlib.sha256(raw).hexdigest()}", raw


def _config(marker: str) -> tuple[str, bytes]:
    return _blob({"architecture": "amd64", "os": "linux", "config": {"Labels": {"m": marker}}})


def _manifest_of(config: tuple[str, bytes]) -> tuple[str, bytes]:
    return _blob(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"digest": _digest(config[1]), "size": len(config[1])},
            "layers": [],
        }
    )


def _entry(manifest: tuple[str, bytes], name: str) -> dict:
    """index.json's entry for `manifest` under `name`, as docker save writes it."""
    return {
        "digest": _digest(manifest[1]),
        "annotations": {"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "1"},
    }


def _images_tar(path: Path, members: list[tuple[str, bytes | str]]) -> Path:
    """A tar of `members` (bytes: a file; str: a symlink to that name), in that order."""
    with tarfile.open(path, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if isinstance(data, str):
                info.type, info.linkname = tarfile.SYMTYPE, data
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def _saved(
    path: Path,
    tagged: list[tuple[tuple[str, bytes], list[str]]],
    index: list[dict] | None = None,
    extra: tuple[tuple[str, bytes], ...] = (),
) -> Path:
    """images.tar as docker save writes it: each config with its tags in manifest.json, the
    manifests named in `index` (index.json) with their blobs."""
    manifests = [_manifest_of(config) for config, _ in tagged]
    return _images_tar(
        path,
        [
            *dict.fromkeys([*(config for config, _ in tagged), *manifests]),
            (
                "manifest.json",
                json.dumps([{"Config": c[0], "RepoTags": tags, "Layers": []} for c, tags in tagged]).encode(),
            ),
            *(
                (("index.json", json.dumps({"schemaVersion": 2, "manifests": index}).encode()),)
                if index
                else ()
            ),
            *extra,
        ],
    )


VICTIM, THEIRS = _config("the victim's own image"), _config("the bundle's code")
NAME = "ghcr.io/moe-stack/llama-cpp:x-cpu-avx2"


def test_images_tar_gives_each_name_the_id_listed(tmp_path: Path) -> None:
    """Each name gets from images.tar the ID the manifest lists: the config's sha256 (Docker's own
    store) or the digest index.json names (the containerd store), hashed from the tar's bytes."""
    manifest = _manifest_of(VICTIM)
    honest = _saved(tmp_path / "ok.tar", [(VICTIM, [NAME])], [_entry(manifest, f"docker.io/{NAME}")])
    check_images_tar(honest, {NAME: _digest(VICTIM[1])})
    check_images_tar(honest, {NAME: _digest(manifest[1])})  # as a containerd-store host lists it


@pytest.mark.parametrize(
    ("members", "why"),
    [
        # The victim's name with the victim's own (public) ID, on the bundle's image: manifest.json...
        (
            [THEIRS, ("manifest.json", json.dumps([{"Config": THEIRS[0], "RepoTags": [NAME]}]).encode())],
            "manifest.json gives",
        ),
        # ...or index.json, the name on a manifest of the bundle's config.
        (
            [
                VICTIM,
                THEIRS,
                _manifest_of(THEIRS),
                ("manifest.json", json.dumps([{"Config": VICTIM[0], "RepoTags": [NAME]}]).encode()),
                ("index.json", json.dumps({"manifests": [_entry(_manifest_of(THEIRS), NAME)]}).encode()),
            ],
            "index.json gives",
        ),
        # A blob that is not what its name says.
        (
            [
                VICTIM,
                (_manifest_of(VICTIM)[0], _manifest_of(THEIRS)[1]),
                ("manifest.json", json.dumps([{"Config": VICTIM[0], "RepoTags": [NAME]}]).encode()),
                ("index.json", json.dumps({"manifests": [_entry(_manifest_of(VICTIM), NAME)]}).encode()),
            ],
            "does not hash to its name",
        ),
        # The same config path twice (Docker reads the last), or under a link to other bytes.
        (
            [
                VICTIM,
                (VICTIM[0], THEIRS[1]),
                ("manifest.json", json.dumps([{"Config": VICTIM[0], "RepoTags": [NAME]}]).encode()),
            ],
            "twice",
        ),
        (
            [
                ("blobs", "other"),
                (f"other/{VICTIM[0].removeprefix('blobs/')}", THEIRS[1]),
                VICTIM,
                ("manifest.json", json.dumps([{"Config": VICTIM[0], "RepoTags": [NAME]}]).encode()),
            ],
            "under blobs, which is not a directory",
        ),
        (
            [("manifest.json", json.dumps([{"Config": "../c.json", "RepoTags": [NAME]}]).encode())],
            "not a plain relative path",
        ),
        (
            [("manifest.json", json.dumps([{"Config": "c.json", "RepoTags": [NAME]}]).encode())],
            "lacks c.json",
        ),
    ],
)
def test_images_tar_may_not_re_point_a_name(tmp_path: Path, members: list, why: str) -> None:
    with pytest.raises(UntrustedBundle, match=why):
        check_images_tar(_images_tar(tmp_path / "hostile.tar", members), {NAME: _digest(VICTIM[1])})


def test_images_tar_may_name_only_the_listed_images(tmp_path: Path) -> None:
    prometheus = _config("prometheus")
    listed = {NAME: _digest(VICTIM[1]), "moe-stack/prometheus:trixie": _digest(prometheus[1])}
    index = [_entry(_manifest_of(prometheus), "docker.io/moe-stack/prometheus:trixie")]
    tagged = [(VICTIM, [NAME]), (prometheus, ["moe-stack/prometheus:trixie"])]
    check_images_tar(_saved(tmp_path / "ok.tar", tagged, index), listed)
    retag = _saved(
        tmp_path / "retag.tar",
        [(VICTIM, [NAME]), (prometheus, ["moe-stack/prometheus:trixie", "moe-stack/debian:trixie"])],
    )
    with pytest.raises(UntrustedBundle, match="would also tag moe-stack/debian:trixie"):
        check_images_tar(retag, listed)
    repositories = ("repositories", json.dumps({"debian": {"trixie-slim": "abc"}}).encode())
    with pytest.raises(UntrustedBundle, match="debian:trixie-slim"):
        check_images_tar(_saved(tmp_path / "legacy.tar", tagged, extra=(repositories,)), listed)
    for annotation in (
        {"io.containerd.image.name": "docker.io/library/debian:trixie-slim"},
        {"org.opencontainers.image.ref.name": "docker.io/library/debian:trixie-slim"},
    ):
        entry = {**_entry(_manifest_of(prometheus), ""), "annotations": annotation}
        named = _saved(tmp_path / "index.tar", tagged, [entry])
        with pytest.raises(UntrustedBundle, match="would also tag debian:trixie-slim"):
            check_images_tar(named, listed)
        named.unlink()
    with pytest.raises(UntrustedBundle, match="holds no image named moe-stack/prometheus:trixie"):
        check_images_tar(_saved(tmp_path / "short.tar", tagged[:1]), listed)
    with pytest.raises(UntrustedBundle, match="lists no images"):
        check_saved_names([], {})


def test_load_reads_images_tar_before_docker_sees_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bundle listing the stack's image names with the IDs they have on this host, its images.tar
    tagging them onto its own image, is refused from the tar alone: Docker is never called (once
    `docker load` applies a name, refusing is too late)."""

    def no_docker() -> None:
        raise AssertionError("load reached Docker before it checked images.tar")

    monkeypatch.setattr(bundle_module, "docker", no_docker)
    compose = (ROOT / "compose/qwen3-235b-a22b.llama.cpp.yaml").read_bytes()
    names = sorted(IMAGES)
    images = _saved(tmp_path / "images.tar", [(THEIRS, names)])
    model_dir = tmp_path / "models"
    model_dir.mkdir()
    (model_dir / "m.gguf").write_bytes(b"GGUF")
    manifest = {
        "format": 1,
        "files": {"compose.yaml": _digest(compose), "images.tar": _digest(images.read_bytes())},
        "images": {name: _digest(VICTIM[1]) for name in names},  # what this host has under them
        "models": [{"name": "m.gguf", "bytes": 4, "sha256": _digest(b"GGUF"), "included": False}],
    }
    bundle = _images_tar(
        tmp_path / "bundle.tar",
        [
            ("manifest.json", json.dumps(manifest).encode()),
            ("compose.yaml", compose),
            ("images.tar", images.read_bytes()),
        ],
    )
    with pytest.raises(BundleError, match=f"refused: images.tar's manifest.json gives {names[0]} the image "):
        load_bundle(bundle, tmp_path / "dest", LoadOptions(expect_sha256=None, model_dir=model_dir))
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("name", ["qwen3-235b-a22b-llama-cpp", "someone-elses-stack", "../other"])
def test_the_project_is_the_loaded_stacks_own(name: str) -> None:
    """A bundle's `name:` could be another stack's, and so could the project compose gives the same
    model in the same place (a bundle loaded with --model-dir for a model the user serves): `up` would
    recreate that stack, share its prompt cache volume, and `down -v` remove its volumes. The loaded
    stack's project comes from the bundle and where it was loaded, in a namespace compose never uses."""
    rebuilt = _rebuilt(_top({"name": name}), IMAGES, HERE)
    model = HERE.model_files[0]
    assert rebuilt["name"] == loaded_project_name(model, HERE)
    assert rebuilt["name"] != project_name_for(model.parent.resolve() / model.name)
    assert rebuilt["name"].startswith("moe-loaded-qwen3-235b-a22b-q4_k_m-00001-of-00003-")
    assert not project_name_for(model).startswith("moe-loaded-")
    elsewhere = _rebuilt(_top({"name": name}), IMAGES, _choices(model, dest=Path("/srv/other")))
    other_bundle = LoadChoices(model_files=(model,), bundle_digest="sha256:" + "cd34" * 16, dest=DEST)
    assert len({rebuilt["name"], elsewhere["name"], _rebuilt(EMITTED, IMAGES, other_bundle)["name"]}) == 3
    with pytest.raises(UntrustedBundle, match="has a name moe-stack never writes"):
        _rebuilt(_top({"name": None}), IMAGES, HERE)


@pytest.mark.parametrize(
    ("image", "loaded"),
    [
        ("ghcr.io/moe-stack/llama-cpp:x-cpu-avx2", "moe-stack/llama-cpp:x-cpu-avx2"),
        ("localhost:5000/a/b:1", "a/b:1"),
        ("localhost/moe-stack-bundle/llama-cpp:t", "moe-stack-bundle/llama-cpp:t"),
        ("debian:trixie-slim", "debian:trixie-slim"),
        ("moe-stack/prometheus:trixie", "moe-stack/prometheus:trixie"),
    ],
)
def test_a_bundles_images_are_named_under_its_own_scope(image: str, loaded: str) -> None:
    """A bundle's image could carry a name the builder starts FROM later (debian:trixie-slim,
    moe-stack/debian) or one every monitored stack runs with its API key (moe-stack/prometheus): it is
    loaded with no name and tagged under the bundle's digest alone."""
    assert loaded_image(image, BUNDLE) == f"moe-stack-loaded/{BUNDLE[7:23]}/{loaded}"
    assert loaded_image(image, "sha256:" + "cd34" * 16) != loaded_image(image, BUNDLE)
    with pytest.raises(UntrustedBundle, match="not a sha256 digest"):
        loaded_image(image, "sha256:../../x")


def test_the_loaded_stack_runs_its_images_by_their_loaded_names() -> None:
    rebuilt = _rebuilt(EMITTED, IMAGES, HERE)
    for service in rebuilt["services"].values():
        assert (
            service["image"].startswith(f"moe-stack-loaded/{BUNDLE[7:23]}/") and "@" not in service["image"]
        )
        assert service["pull_policy"] == "never"  # the scoped name on Docker Hub is nobody's we know
    assert rebuilt["x-moe-stack"]["image"] == loaded_image(EMITTED["x-moe-stack"]["image"], BUNDLE)


def _keyed(command: list[str]) -> dict:
    return _with({"command": command, "secrets": ["moe-stack-api-key"]})


@pytest.mark.parametrize(
    "command",
    [
        ["-m", "/models/m.gguf", "--api-key", "the-authors-key"],
        ["-m", "/models/m.gguf", "--api-key=the-authors-key"],
        ["-m", "/models/m.gguf", "--api-key-file", "/models/authors-key"],
        ["-m", "/models/m.gguf", "--api-key-file", "/run/secrets/moe-stack-api-key", "--api-key", "k"],
    ],
)
def test_a_bundle_carrying_a_key_of_its_own_is_refused(command: list[str]) -> None:
    """The key is the loading host's: a bundle's command holding its author's key (seen: the user's key
    401, the author's 200) is refused in one line."""
    with pytest.raises(UntrustedBundle, match="sets its own API key .*load it with --api-key-file"):
        _rebuilt(_keyed(command), IMAGES, _choices(*HERE.model_files, api_key_file=Path("/srv/key")))


def test_the_users_key_is_read_whatever_the_bundles_command_says() -> None:
    """A bundle whose stack dropped the key file's flag can't serve open when the user gives a key: load
    writes the engine's key reading itself."""
    command = list(EMITTED["services"]["engine"]["command"])
    assert "--api-key-file" not in command
    for given in (command, [*command, "--api-key-file", "/run/secrets/moe-stack-api-key"]):
        rebuilt = _rebuilt(_keyed(given), IMAGES, _choices(*HERE.model_files, api_key_file=Path("/srv/key")))
        engine = rebuilt["services"]["engine"]
        assert engine["command"] == [*command, "--api-key-file", "/run/secrets/moe-stack-api-key"]
        assert engine["secrets"] == ["moe-stack-api-key"]
        assert rebuilt["secrets"] == {"moe-stack-api-key": {"file": "/srv/key"}}
    unkeyed = _rebuilt(EMITTED, IMAGES, _choices(*HERE.model_files, api_key_file=Path("/srv/key")))
    assert unkeyed["services"]["engine"]["command"][-2:] == [
        "--api-key-file",
        "/run/secrets/moe-stack-api-key",
    ]
    router = copy.deepcopy(EMITTED)
    router["services"]["engine"]["environment"] = {"MOE_STACK_ROUTER_PRESET": "[m]\napi-key = theirs\n"}
    with pytest.raises(UntrustedBundle, match="router preset sets an API key"):
        _rebuilt(router, IMAGES, HERE)


def test_images_tar_is_given_to_docker_with_no_name_in_it(tmp_path: Path) -> None:
    """What `docker load` reads names nothing: manifest.json's RepoTags, index.json's name annotations and
    the legacy repositories file are gone; every other byte (the blobs) is as saved."""
    manifest = _manifest_of(VICTIM)
    saved = _saved(
        tmp_path / "saved.tar",
        [(VICTIM, [NAME, "debian:trixie-slim"])],
        [_entry(manifest, f"docker.io/{NAME}")],
        extra=(("repositories", json.dumps({"debian": {"trixie-slim": "x"}}).encode()),),
    )
    given = tmp_path / "given.tar"
    given.write_bytes(b"".join(nameless(saved)))
    with tarfile.open(given) as tar, tarfile.open(saved) as original:
        names = tar.getnames()
        assert "repositories" not in names and set(names) == set(original.getnames()) - {"repositories"}
        assert json.load(tar.extractfile("manifest.json"))[0]["RepoTags"] is None  # type: ignore[arg-type]
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        assert index["manifests"][0]["annotations"] == {} and index["manifests"][0]["digest"] == _digest(
            manifest[1]
        )
        for name in names:
            if name.startswith("blobs/"):
                assert tar.extractfile(name).read() == original.extractfile(name).read()  # type: ignore[union-attr]


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
