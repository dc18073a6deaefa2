"""Compose emission: the document's security defaults, flags, metadata; atomic write; port checks."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from builder.engines import get_engine
from builder.errors import StackError
from builder.host.probe import CpuInfo
from builder.images.image_facts import ImageFacts
from builder.models.model_files import check_gguf
from builder.platform.targets import cpu_target
from builder.stackfile.host_checks import check_host_runs, check_port_free
from builder.stackfile.stack_file import StackFile
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.document import cpu_only, project_name_for, start_period_for
from tests.specs import compose_dict, demo_stack, opened


def test_document_defaults(tmp_path: Path) -> None:
    doc = compose_dict(demo_stack(tmp_path), generated_by="moe-stack compose -m m.gguf")
    service = doc["services"]["engine"]
    assert service["ports"] == [
        {"target": 8080, "published": "8080", "host_ip": "127.0.0.1", "protocol": "tcp"}
    ]
    assert service["volumes"] == [
        {"type": "bind", "source": str(tmp_path / "models"), "target": "/models", "read_only": True}
    ]
    assert service["cap_drop"] == ["ALL"] and service["read_only"] is True
    assert "privileged" not in service and "cap_add" not in service
    assert service["healthcheck"]["test"] == ["CMD", "/usr/local/bin/moe-stack-health"]
    assert service["command"][:6] == ["--model", "/models/m.gguf", "--host", "0.0.0.0", "--port", "8080"]
    assert doc["x-moe-stack"]["generated-by"] == "moe-stack compose -m m.gguf"


def test_override_rules_become_engine_flags(tmp_path: Path) -> None:
    rule = r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"
    doc = compose_dict(demo_stack(tmp_path, override_tensors=(rule,), extra_args=("--swa-full",)), "x")
    command = doc["services"]["engine"]["command"]
    at = command.index("--override-tensor")
    assert (
        command[at : at + 2] == ["--override-tensor", rule] and command[-1] == "--swa-full"
    )  # extra args last
    assert yaml.safe_load(StackFile.parse(doc).to_yaml())["services"]["engine"]["command"] == command, (
        "regex survives YAML"
    )


def test_extra_args_may_not_repeat_stack_flags(tmp_path: Path) -> None:
    with pytest.raises(StackError, match=r"repeat flags the stack sets itself \(--port\)"):
        compose_dict(demo_stack(tmp_path, extra_args=("--port", "9000")), "x")
    # The `--flag=value` spelling too (it slipped through: --host=0.0.0.0, a key in the file twice).
    for arg in ("--host=0.0.0.0", "--port=9000", "--api-key=s3cret", "-ngl=0"):
        with pytest.raises(StackError, match=rf"\({arg.split('=')[0]}\)"):
            compose_dict(demo_stack(tmp_path, extra_args=(arg,)), "x")


def test_dollar_signs_reach_the_engine_literally(tmp_path: Path) -> None:
    """docker compose reads `$NAME` as a variable: a model directory named `$HOME` must be mounted as
    such, and an -ot regex ending in `$` must reach the engine whole."""
    odd = tmp_path / "$HOME"
    odd.mkdir()
    rule = r"blk\.1\.ffn_up_exps\.weight$=CPU"
    doc = compose_dict(demo_stack(odd, override_tensors=(rule,)), "x")
    service = doc["services"]["engine"]
    assert service["volumes"][0]["source"] == str(odd / "models").replace("$", "$$")
    assert rule.replace("$", "$$") in service["command"]
    assert doc["x-moe-stack"]["model"] == str(odd / "models/m.gguf").replace("$", "$$"), (
        "compose reads x- keys too"
    )
    assert StackFile.parse(doc).record.model == odd / "models/m.gguf", "and moe-stack reads it back as meant"


def test_start_period_grows_with_model_size() -> None:
    assert start_period_for(240 * 1024**2) == 60
    assert start_period_for(355 * 1000**3) > 1300  # DeepSeek-R1 IQ4_XS: minutes to load


def test_write_is_atomic_and_keeps_neighbours(tmp_path: Path) -> None:
    (tmp_path / "other.yaml").write_text("keep")
    path = write_stack(compose_stack(demo_stack(tmp_path), "x"), tmp_path / "compose.yaml")
    assert yaml.safe_load(path.read_text())["name"] == "demo"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compose.yaml", "models", "other.yaml"]


def test_port_in_use_is_named() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(StackError, match=f"port {port} on 127.0.0.1 is already in use"):
            check_port_free("127.0.0.1", port)
    check_port_free("127.0.0.1", port)  # free again


def test_model_the_container_user_cannot_read(tmp_path: Path) -> None:
    stack = demo_stack(tmp_path)
    (tmp_path / "models").chmod(0o700)
    with pytest.raises(StackError, match=r"not readable by the engine's user \(uid 10001\).*chmod o\+rx"):
        compose_dict(stack, "x")
    (tmp_path / "models").chmod(0o755)
    stack.model.path.chmod(0o600)
    with pytest.raises(StackError, match=r"chmod o\+r .*m\.gguf"):
        compose_dict(stack, "x")


def test_project_name_from_model_file_and_directory() -> None:
    name = project_name_for(Path("/m/DeepSeek-R1-671B.IQ4_XS-00001-of-00009.gguf"))
    assert name.startswith("moe-stack-deepseek-r1-671b-iq4_xs-00001-of-000") and len(name) <= 60
    # Same file name, another directory: another project (up/down of one leaves the other alone).
    assert project_name_for(Path("/n/DeepSeek-R1-671B.IQ4_XS-00001-of-00009.gguf")) != name
    assert project_name_for(Path("/m/DeepSeek-R1-671B.IQ4_XS-00001-of-00009.gguf")) == name


def _facts(**update: object) -> ImageFacts:
    values = {
        "image": "img:1",
        "engine": get_engine("llama.cpp"),
        "engine_ref": "r",
        "variant": "r-cpu-zen4",
        "cpu_target": "zen4",
        "required_cpu_flags": cpu_target("zen4").required_flags,
        "server_flags": {
            f: ""
            for f in (
                "--model",
                "--host",
                "--port",
                "--ctx-size",
                "--threads",
                "--parallel",
                "--override-tensor",
            )
        },
    }
    return ImageFacts(**(values | update))


def test_flags_are_checked_against_the_image_contract(tmp_path: Path) -> None:
    assert compose_dict(demo_stack(tmp_path), "x", _facts())["x-moe-stack"]["flags-checked"] is True
    with pytest.raises(StackError, match=r"llama.cpp r \(img:1\) does not accept --swa-full"):
        compose_dict(demo_stack(tmp_path, extra_args=("--swa-full",)), "x", _facts())
    # A neutral option the contract lacks: refused by the adapter, naming the option.
    with pytest.raises(
        StackError, match="this llama.cpp build has neither --no-mmap nor --load-mode; drop --no-mmap"
    ):
        compose_dict(demo_stack(tmp_path, mmap=False), "x", _facts())
    with pytest.raises(StackError, match="holds ik_llama.cpp, not llama.cpp"):
        compose_dict(demo_stack(tmp_path), "x", _facts(engine=get_engine("ik_llama.cpp")))


def test_host_without_the_image_flags_is_refused() -> None:
    avx2_host = CpuInfo(flags=frozenset(cpu_target("avx2").required_flags), logical_cpus=2, physical_cores=2)
    with pytest.raises(
        StackError,
        match=r"needs CPU flags this host lacks: avx512f .*; use the avx2 image, "
        r"or pass --for-other-host",
    ):
        check_host_runs(_facts(), avx2_host)
    check_host_runs(_facts(required_cpu_flags=cpu_target("avx2").required_flags), avx2_host)


def test_gpu_and_cpu_profiles(tmp_path: Path) -> None:
    rule = r"blk\.[0-9]+\.ffn_.*_exps\.weight=CPU"
    gpu = demo_stack(tmp_path, image_ref="img:cuda", gpu="nvidia", gpu_layers=99, override_tensors=(rule,))
    doc = compose_dict(gpu, "x", cpu_profile=(cpu_only(gpu, "img:cpu"), None))
    engine, fallback = doc["services"]["engine"], doc["services"]["engine-cpu"]
    assert engine["profiles"] == ["gpu"] and fallback["profiles"] == ["cpu"]
    assert doc["x-moe-stack"]["profiles"] == ["gpu", "cpu"], "moe-stack up starts the first by default"
    assert fallback["image"] == "img:cpu" and "deploy" not in fallback
    assert "--n-gpu-layers" not in fallback["command"] and rule not in fallback["command"]
    assert engine["ports"] == fallback["ports"], "one address, whichever profile runs"
    assert "profiles" not in compose_dict(gpu, "x")["services"]["engine"], (
        "a plain stack starts without --profile"
    )


def test_shm_size(tmp_path: Path) -> None:
    assert compose_dict(demo_stack(tmp_path), "x")["services"]["engine"]["shm_size"] == "1g"
    assert compose_dict(demo_stack(tmp_path, shm_size="16g"), "x")["services"]["engine"]["shm_size"] == "16g"
    with pytest.raises(ValueError, match="shm_size"):
        demo_stack(tmp_path, shm_size="lots")


def test_hugging_face_cache_layout_mounts_each_part_under_its_name(tmp_path: Path) -> None:
    """snapshots/<rev>/NAME are links into blobs/<hash>: the split names must reach the engine, and
    only the model's files (not the whole cache) are mounted."""
    blobs, snapshot = tmp_path / "blobs", tmp_path / "snapshots" / "abc123"
    blobs.mkdir()
    snapshot.mkdir(parents=True)
    for index, digest in ((1, "e3b0c4"), (2, "5f70bf")):
        (blobs / digest).write_bytes(b"GGUF")
        (blobs / digest).chmod(0o644)
        (snapshot / f"M-0000{index}-of-00002.gguf").symlink_to(f"../../blobs/{digest}")
    first = snapshot / "M-00001-of-00002.gguf"
    stack = demo_stack(tmp_path).model_copy(update={"model": opened(check_gguf(first))})
    service = compose_dict(stack, "x")["services"]["engine"]
    assert service["volumes"] == [
        {
            "type": "bind",
            "source": str(blobs / "e3b0c4"),
            "target": "/models/M-00001-of-00002.gguf",
            "read_only": True,
        },
        {
            "type": "bind",
            "source": str(blobs / "5f70bf"),
            "target": "/models/M-00002-of-00002.gguf",
            "read_only": True,
        },
    ]
    assert service["command"][:2] == ["--model", "/models/M-00001-of-00002.gguf"]


def test_monitoring_adds_prometheus_scraping_each_engine_service(tmp_path: Path) -> None:
    key = tmp_path / "key"
    key.write_text("k\n")
    key.chmod(0o644)
    stack = demo_stack(tmp_path, monitoring=True, monitoring_port=19090, gpu="nvidia", api_key_file=key)
    document = compose_dict(stack, "x", cpu_profile=(cpu_only(stack, "img:cpu"), None))
    prometheus = document["services"]["prometheus"]
    assert (
        prometheus["image"] == "moe-stack/prometheus:trixie" and "profiles" not in prometheus
    )  # with either profile
    assert prometheus["ports"][0] == {
        "target": 9090,
        "published": "19090",
        "host_ip": "127.0.0.1",
        "protocol": "tcp",
    }
    assert prometheus["read_only"] is True and prometheus["cap_drop"] == ["ALL"] and prometheus["secrets"]
    config = yaml.safe_load(prometheus["environment"]["MOE_STACK_PROMETHEUS_CONFIG"])
    job = config["scrape_configs"][0]
    assert job["static_configs"][0]["targets"] == ["engine:8080", "engine-cpu:8080"]
    assert job["authorization"] == {"credentials_file": "/run/secrets/moe-stack-api-key"}
    assert document["volumes"] == {"prometheus-data": {}}
    with pytest.raises(StackError, match="--monitoring scrapes one engine's /metrics"):
        compose_dict(demo_stack(tmp_path, monitoring=True, monitoring_port=19090, metrics=False), "x")


def test_no_mmap_is_a_gpu_stack_setting(tmp_path: Path) -> None:
    gpu = demo_stack(tmp_path, gpu="nvidia", gpu_layers=99, mmap=False)
    assert compose_dict(gpu, "x")["services"]["engine"]["command"][-2:] == ["--load-mode", "none"]
    assert cpu_only(gpu, "cpu:1").mmap is None  # the cpu profile maps as the engine does by default
    with pytest.raises(ValueError, match="--no-mmap reads the model into the engine's memory"):
        demo_stack(tmp_path, mmap=False, hugetlbfs="2M")
    with pytest.raises(StackError, match="ktransformers does not read --mmap/--no-mmap: drop it"):
        compose_dict(
            demo_stack(
                tmp_path, engine="ktransformers", gpu="nvidia", mmap=False, config_dir=tmp_path / "models"
            ),
            "x",
        )


def test_monitoring_stays_on_loopback_whatever_the_engine_binds(tmp_path: Path) -> None:
    """Prometheus' query API has no authentication: `--bind 0.0.0.0` publishes the engine (which needs the
    key), never Prometheus."""
    document = compose_dict(demo_stack(tmp_path, monitoring=True, monitoring_port=19090, bind="0.0.0.0"), "x")
    assert document["services"]["engine"]["ports"][0]["host_ip"] == "0.0.0.0"  # type: ignore[index]
    assert document["services"]["prometheus"]["ports"][0]["host_ip"] == "127.0.0.1"  # type: ignore[index]


@pytest.mark.parametrize("hostile", ["x\n[evil]\nmodel = /etc/shadow", "x\rmodels-max = 9"])
def test_a_control_character_cannot_reach_the_routers_preset(tmp_path: Path, hostile: str) -> None:
    """A newline in a flag value started keys and sections in the router's INI preset."""
    other = tmp_path / "models" / "n.gguf"
    demo_stack(tmp_path)
    other.write_bytes(b"GGUF")
    other.chmod(0o644)
    first = demo_stack(tmp_path, served_name="m", extra_args=("--system-prompt-file", hostile))
    routed = (first, demo_stack(tmp_path, model=other, served_name="n"))
    with pytest.raises(StackError, match="the router's preset can't hold .*a control character"):
        compose_dict(first, "x", routed=routed)
