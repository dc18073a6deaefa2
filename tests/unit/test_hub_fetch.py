"""`moe-stack fetch-model --hf`: huggingface_hub against a local stand-in for the hub (HF_ENDPOINT):
split shards by pattern into a plain directory, a cut download resumed, a corrupted file refused."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi

from builder.errors import ModelError
from builder.models import hub as hub_module
from builder.models.hub import MANIFEST, HubFile, recorded
from tests.cli import run_cli
from tests.hub_server import COMMIT, Hub, serve

REPO = "unsloth/Tiny-MoE-GGUF"
SHARDS = {
    f"Q4_K_M/Tiny-MoE-Q4_K_M-0000{i}-of-00002.gguf": b"GGUF\x03\0\0\0" + os.urandom(300_000 + i)
    for i in (1, 2)
}
FILES = {**SHARDS, "Q8_0/Tiny-MoE-Q8_0.gguf": os.urandom(1000), "README.md": b"# tiny\n"}


def _fetch(hub: Hub, dest: Path, *extra: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = run_cli(
        "fetch-model",
        "--hf",
        REPO,
        "--include",
        "Q4_K_M/*",
        "--dest",
        str(dest),
        *extra,
        env={
            "HF_ENDPOINT": hub.url,
            "HF_HOME": str(dest.parent / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_XET": "1",
            **(env or {}),
        },
    )
    return result.returncode, result.stdout, result.stderr


@pytest.mark.cli
def test_shards_by_pattern_into_a_plain_directory(tmp_path: Path) -> None:
    with serve(Hub(REPO, dict(FILES))) as hub:
        status, stdout, stderr = _fetch(hub, tmp_path / "models")
    assert status == 0, stderr
    first = tmp_path / "models/Q4_K_M/Tiny-MoE-Q4_K_M-00001-of-00002.gguf"
    assert stdout.strip() == str(first)
    for name, data in SHARDS.items():
        path = tmp_path / "models" / name
        assert not path.is_symlink() and path.read_bytes() == data
    assert not (tmp_path / "models/Q8_0").exists() and not (tmp_path / "models/README.md").exists()
    manifest = json.loads((tmp_path / "models/moe-stack-model.json").read_text())
    assert (
        manifest["commit"] == COMMIT
        and len(manifest["files"]) == 2
        and all(f["sha256"] for f in manifest["files"])
    )


@pytest.mark.cli
def test_a_cut_download_resumes(tmp_path: Path) -> None:
    """A connection cut after 12 MB (past huggingface_hub's 10 MB chunk): the rest is asked for with a
    ranged GET, and the file is whole."""
    files = {**FILES, "Q4_K_M/Big-00001-of-00001.gguf": os.urandom(24 << 20)}
    with serve(Hub(REPO, files, cut_after=12 << 20, cuts=1)) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 0, stderr
    assert max(hub.ranges) >= 10 << 20, hub.ranges  # resumed, not started over
    assert (tmp_path / "models/Q4_K_M/Big-00001-of-00001.gguf").read_bytes() == files[
        "Q4_K_M/Big-00001-of-00001.gguf"
    ]


@pytest.mark.cli
def test_a_download_that_keeps_breaking_says_what_to_do(tmp_path: Path) -> None:
    with serve(Hub(REPO, dict(FILES), cut_after=100_000, cuts=50)) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 1 and "broke off" in stderr and "run the same command again" in stderr, stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1, stderr


@pytest.mark.cli
def test_a_corrupted_file_is_refused(tmp_path: Path) -> None:
    name = next(iter(SHARDS))
    with serve(Hub(REPO, dict(FILES), corrupt={name})) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 1 and "does not have the sha256 the repository lists" in stderr, stderr
    assert len([line for line in stderr.splitlines() if line.strip()]) == 1
    assert (
        not (tmp_path / "models" / name).exists() and not (tmp_path / "models/moe-stack-model.json").exists()
    )


@pytest.mark.cli
def test_nothing_matches(tmp_path: Path) -> None:
    with serve(Hub(REPO, dict(FILES))) as hub:
        result = run_cli(
            "fetch-model",
            "--hf",
            REPO,
            "--include",
            "Q2_K/*",
            "--dest",
            str(tmp_path / "m"),
            env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home")},
        )
    assert result.returncode == 1 and f"no file of {REPO} matches Q2_K/*" in result.stderr


@pytest.mark.cli
def test_doctor_checks_a_fetched_model_against_its_record(tmp_path: Path) -> None:
    with serve(Hub(REPO, dict(FILES))) as hub:
        status, stdout, stderr = _fetch(hub, tmp_path / "models")
    assert status == 0, stderr
    first = Path(stdout.strip())
    assert recorded(first) == HubFile(
        str(first.relative_to(tmp_path / "models")),
        len(SHARDS[next(iter(SHARDS))]),
        hashlib.sha256(SHARDS[next(iter(SHARDS))]).hexdigest(),
    )

    def model_finding() -> dict[str, str]:
        doctor = run_cli("doctor", "--model", str(first), "--json")
        return next(f for f in json.loads(doctor.stdout) if f["topic"] == "model-files")

    assert model_finding()["level"] == "OK"
    second = tmp_path / "models" / list(SHARDS)[1]
    second.write_bytes(second.read_bytes()[:-10])  # a part cut short after the fetch
    finding = model_finding()
    assert finding["level"] == "FAIL" and second.name in finding["message"], finding


def _written(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


@pytest.mark.cli
@pytest.mark.parametrize(
    "commit", ["../../../../escaped", "main", "0123456789abcdef0123456789abcdef0123456\n"]
)
def test_a_hostile_commit_from_the_hub_is_refused(tmp_path: Path, commit: str) -> None:
    """huggingface_hub files a revision under refs/<revision> in its cache: `../` chose a path, and a
    second answer its content. Only a 40-hex commit goes on."""
    with serve(Hub(REPO, dict(FILES), commit=commit)) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 1 and "not a 40-hex commit id: refused, nothing was written" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1 and _written(tmp_path) == set()


@pytest.mark.cli
@pytest.mark.parametrize(
    "name",
    [
        "/tmp/moe-stack-hostile.gguf",
        "Q4_K_M/../../outside.gguf",
        "Q4_K_M/a\nb.gguf",
        "Q4_K_M/[ab].gguf",
        "Q4_K_M//x.gguf",
    ],
)
def test_a_hostile_file_name_from_the_hub_is_refused(tmp_path: Path, name: str) -> None:
    """Listed names became paths under --dest unchecked: an absolute one or `X/../../y` with a wrong sha256
    was hashed (a FIFO hangs it) and deleted."""
    victim = tmp_path / "outside.gguf"
    victim.write_bytes(b"the user's own file")
    with serve(Hub(REPO, {**FILES, name: b"GGUF hostile"}, corrupt={name})) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 1 and "which is not a plain relative path" in stderr, stderr
    assert len(stderr.strip().splitlines()) == 1
    assert _written(tmp_path) == {"outside.gguf"} and victim.read_bytes() == b"the user's own file"
    assert not Path("/tmp/moe-stack-hostile.gguf").exists()


def test_a_file_the_download_did_not_write_is_not_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only what the download wrote is removed on a sha256 mismatch: a file it left as it was (huggingface_hub
    skips what its own records call complete) is the user's to remove. At the module boundary: the hub's
    listing from the stand-in, the download step a no-op."""
    name = next(iter(SHARDS))
    theirs = tmp_path / "models" / name
    theirs.parent.mkdir(parents=True)
    theirs.write_bytes(b"x" * len(SHARDS[name]))
    monkeypatch.setattr(hub_module, "snapshot_download", lambda *args, **kwargs: None)
    with serve(Hub(REPO, dict(FILES))) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setattr(hub_module, "HfApi", lambda: HfApi(endpoint=hub.url))
        with pytest.raises(ModelError, match="was there before this run"):
            hub_module.fetch(REPO, ["Q4_K_M/*"], tmp_path / "models")
    assert theirs.read_bytes() == b"x" * len(SHARDS[name]) and not (tmp_path / "models" / MANIFEST).exists()


@pytest.mark.cli
@pytest.mark.parametrize("revision", ["../../x", "/etc", "main/../../x", "v1.lock", "a b"])
def test_a_bad_revision_is_refused_before_asking(tmp_path: Path, revision: str) -> None:
    with serve(Hub(REPO, dict(FILES))) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models", "--revision", revision)
    assert status == 1 and "is not a branch, tag or commit name" in stderr, stderr
    assert hub.ranges == [] and _written(tmp_path) == set()


@pytest.mark.cli
def test_an_answer_that_is_not_json_is_one_line(tmp_path: Path) -> None:
    with serve(Hub(REPO, dict(FILES), raw_listing=b"<html>captive portal</html>")) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
    assert status == 1 and "is not a model listing" in stderr and len(stderr.strip().splitlines()) == 1, (
        stderr
    )


@pytest.mark.cli
def test_a_hub_that_refuses_connections_is_one_line(tmp_path: Path) -> None:
    """An air-gapped site's normal state, or a typo in HF_ENDPOINT: huggingface_hub 2.x raises its HTTP
    stack's ConnectError (not an OSError), which printed a 60-line traceback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # nothing listens there once it is closed
    status, _, stderr = _fetch(SimpleNamespace(url=f"http://127.0.0.1:{port}"), tmp_path / "models")  # type: ignore[arg-type]
    assert status == 1 and len(stderr.strip().splitlines()) == 1, stderr
    assert f"can't reach the hub at http://127.0.0.1:{port}" in stderr and "HF_ENDPOINT" in stderr, stderr
    assert not (tmp_path / "models").exists()


@pytest.mark.cli
def test_the_stored_login_is_not_sent_to_a_mirror(tmp_path: Path) -> None:
    """`hf auth login` stores a token for the hub; a mirror named in HF_ENDPOINT gets a token only when the
    user gives one for it (HF_TOKEN)."""
    stored = tmp_path / "hf-home" / "token"
    stored.parent.mkdir()
    stored.write_text("hf_stored_login_token_for_the_hub")
    with serve(Hub(REPO, dict(FILES))) as hub:
        status, _, stderr = _fetch(hub, tmp_path / "models")
        assert status == 0, stderr
        assert hub.authorizations == []
        status, _, stderr = _fetch(hub, tmp_path / "again", env={"HF_TOKEN": "hf_given_for_the_mirror"})
        assert status == 0, stderr
    assert hub.authorizations and set(hub.authorizations) == {"Bearer hf_given_for_the_mirror"}


@pytest.mark.cli
@pytest.mark.parametrize("endpoint", ["http://hub.mirror.example", "http://10.0.0.7:8080", "ftp://127.0.0.1"])
def test_plain_http_is_refused_off_loopback(tmp_path: Path, endpoint: str) -> None:
    result = run_cli(
        "fetch-model",
        "--hf",
        REPO,
        "--include",
        "*",
        "--dest",
        str(tmp_path / "m"),
        env={"HF_ENDPOINT": endpoint, "HF_HOME": str(tmp_path / "hf-home")},
    )
    assert result.returncode == 1 and "is not https" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "m").exists()


@pytest.mark.cli
def test_a_checkpoint_is_fetched_for_the_config_dir_and_a_gguf_repository_is_refused(tmp_path: Path) -> None:
    """KTransformers' pair: the model's own checkpoint for SGLang (--config-dir), its GGUF for kt-kernel."""
    checkpoint = {
        "config.json": b"{}",
        "generation_config.json": b"{}",
        "tokenizer.json": b"{}",
        "tokenizer_config.json": b"{}",
        "model-00001-of-00002.safetensors": os.urandom(2000),
        "model-00002-of-00002.safetensors": os.urandom(1000),
        "README.md": b"# the model\n",
        "original/consolidated.pth": os.urandom(500),
    }
    env = {"HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf-home")}
    with serve(Hub("Org/Tiny-MoE", checkpoint)) as hub:
        result = run_cli(
            "fetch-model",
            "--hf",
            "Org/Tiny-MoE",
            "--checkpoint",
            "--dest",
            str(tmp_path / "hf"),
            env={"HF_ENDPOINT": hub.url, **env},
        )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str((tmp_path / "hf").resolve())
    fetched = sorted(  # huggingface_hub's .cache and moe-stack's record beside the checkpoint's files
        p.name for p in (tmp_path / "hf").iterdir() if p.name != "moe-stack-model.json" and p.name[0] != "."
    )
    assert fetched == sorted(name for name in checkpoint if name.endswith((".json", ".safetensors")))
    with serve(Hub(REPO, dict(FILES))) as hub:
        refused = run_cli(
            "fetch-model",
            "--hf",
            REPO,
            "--checkpoint",
            "--dest",
            str(tmp_path / "gguf"),
            env={"HF_ENDPOINT": hub.url, **env},
        )
    assert refused.returncode != 0 and "holds no Hugging Face checkpoint" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "gguf").exists()
