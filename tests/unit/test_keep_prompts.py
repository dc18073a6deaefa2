"""`compose --keep-prompts`: the server's slots (llama.cpp engines) or SGLang's page files (KTransformers)
on a named volume of the stack, under a key of the model and the engine build, a stop long enough to save
them; refused where they can't be kept."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from builder.distribute.loaded_stack import LoadChoices, UntrustedBundle, rebuild_stack
from builder.engines.base import StackSpec
from builder.engines.sglang_hicache import FLAGS as HICACHE_FLAGS
from builder.errors import StackError
from builder.models import identity
from builder.models.gguf_facts import read_facts
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import MoeShape, write_moe_gguf
from builder.stacks.assemble import assemble_stack
from builder.stacks.memory_use import memory_use
from builder.stacks.options import StackOptions
from tests.hosts import epyc_host
from tests.specs import compose_dict, readable_file, routed_stacks

BUNDLE = "sha256:" + "0" * 64  # a loaded bundle's digest


def _stack(model: Path, **options: object) -> StackSpec:
    return StackSpec.model_validate(
        {
            "project_name": "p",
            "engine": "llama.cpp",
            "image_ref": "i:1",
            "model": model,
            "cpu_threads": 4,
            **options,
        }
    )


def test_the_slots_are_saved_on_the_stacks_volume_under_the_models_key(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF" + b"\0" * 60)
    doc = compose_dict(_stack(model, keep_prompts=True, parallel=2), "x")
    service = doc["services"]["engine"]
    command = service["command"]
    assert command[command.index("--slot-save-path") + 1] == "/var/lib/moe-stack/prompts/"
    mount = {"type": "volume", "source": "prompts", "target": "/var/lib/moe-stack/prompts"}
    assert mount in service["volumes"]
    assert doc["volumes"]["prompts"] == {}
    assert service["stop_grace_period"] == "5m"  # Docker's 10 s can't save a long context's cache
    key = service["environment"]["MOE_STACK_PROMPTS"]
    assert re.fullmatch(r"[0-9a-f]{16}", key) and service["environment"]["MOE_STACK_SLOTS"] == "2"
    # The same stack gets the same key; another model file, image or KV shape another one.
    again = compose_dict(_stack(model, keep_prompts=True, parallel=2), "y")["services"]["engine"]
    assert again["environment"]["MOE_STACK_PROMPTS"] == key
    model.write_bytes(b"GGUF" + b"\0" * 61)  # the same name, another file (a re-quantized download)
    others = [
        _stack(model, keep_prompts=True, parallel=2),
        _stack(tmp_path / "m" / "x.gguf", keep_prompts=True, parallel=2, image_ref="i:2"),
        _stack(tmp_path / "m" / "x.gguf", keep_prompts=True, parallel=2, ctx_size=8192),
    ]
    keys = {compose_dict(s, "x")["services"]["engine"]["environment"]["MOE_STACK_PROMPTS"] for s in others}
    assert len(keys) == 3 and key not in keys
    plain = compose_dict(_stack(model), "x")
    assert "volumes" not in plain and "stop_grace_period" not in plain["services"]["engine"]


def test_the_models_part_of_the_key_is_its_content_not_its_name_and_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another model file of the same name and size (another quantization of the same shapes, a
    fine-tune) restored the old model's cache: the key hashes the GGUF's header and tensor index, read
    once and kept under the file's inode, size and mtime."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))

    def key(model: Path) -> str:
        return compose_dict(_stack(model, keep_prompts=True), "x")["services"]["engine"]["environment"][
            "MOE_STACK_PROMPTS"
        ]

    models = tmp_path / "m"
    first = write_moe_gguf(models / "x.gguf", MoeShape(layers=2, rope_base=1e6))
    other = write_moe_gguf(tmp_path / "other" / "x.gguf", MoeShape(layers=2, rope_base=5e5))
    for path in (models, tmp_path / "other", first, other):
        path.chmod(0o755 if path.is_dir() else 0o644)
    assert first.stat().st_size == other.stat().st_size and first.name == other.name
    before = key(first)
    os.replace(other, first)  # the same name and size, another model
    after = key(first)
    assert after != before
    renamed = first.rename(models / "y.gguf")  # the same model under another name: the same cache
    assert key(renamed) == after
    read: list[Path] = []
    monkeypatch.setattr(identity, "check_header", lambda path: read.append(path) or 0)
    key(renamed)
    assert read == []  # the header was hashed once; its inode, size and mtime are unchanged
    os.utime(renamed, ns=(1, 1))
    key(renamed)
    assert read == [renamed]


def test_where_it_cant_be_kept_it_is_refused(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    with pytest.raises(StackError, match="ktransformers-legacy does not read --keep-prompts: drop it"):
        compose_dict(_stack(model, keep_prompts=True, engine="ktransformers-legacy"), "x")
    routed = routed_stacks(tmp_path)
    with pytest.raises(StackError, match="--keep-prompts keeps one model's slots"):
        compose_dict(routed[0].model_copy(update={"keep_prompts": True}), "x", routed=routed)


def _kt_stack(tmp_path: Path, arch: str, **options: object) -> StackSpec:
    model = write_moe_gguf(tmp_path / "models" / f"{arch}.gguf", synth_shape(arch, tiny=True))
    (tmp_path / "models").chmod(0o755)
    model.chmod(0o644)
    values = {"engine": "ktransformers", "gpu": "nvidia", "config_dir": tmp_path / "hf", "keep_prompts": True}
    return _stack(model, **values | options)


def test_ktransformers_keeps_its_prompts_in_sglangs_files_under_the_models_key(tmp_path: Path) -> None:
    stack = _kt_stack(tmp_path, "qwen3moe", ctx_size=8192, parallel=2)
    doc = compose_dict(stack, "x")
    service = doc["services"]["engine"]
    command = service["command"]
    # SGLang's hierarchical cache, a file a page of 64 tokens, each prompt written as its prefill ends and
    # read back whole before a request runs (engines/sglang_hicache.py says why each).
    for flag, value in HICACHE_FLAGS:
        assert flag in command and (value is None or command[command.index(flag) + 1] == value)
    assert {"type": "volume", "source": "prompts", "target": "/var/lib/moe-stack/prompts"} in service[
        "volumes"
    ]
    assert service["stop_grace_period"] == "5m"  # the helper writes the last prompt's pages at the stop
    environment = service["environment"]
    assert re.fullmatch(r"[0-9a-f]{16}", environment["MOE_STACK_PROMPTS"])
    assert "MOE_STACK_SLOTS" not in environment  # SGLang keeps pages, not slots
    kv = stack.kv_bytes()  # the stack's KV pool: 2 × 8192 tokens of the model's layers
    assert kv > 0 and int(environment["MOE_STACK_PROMPTS_MAX_MIB"]) == 4 * kv // 2**20
    # SGLang's host pool (2 × the GPU's pool, page-locked) is in the stack's memory, beside the default.
    plain = stack.model_copy(update={"keep_prompts": False})
    assert memory_use(stack).features_bytes - memory_use(plain).features_bytes == 2 * kv
    assert memory_use(stack).memory_bytes - memory_use(plain).memory_bytes == 2 * kv
    assert "--enable-hierarchical-cache" not in compose_dict(plain, "x")["services"]["engine"]["command"]
    # A bundle of it loads with its bound.
    choices = LoadChoices(
        model_files=(stack.model.path,),
        bundle_digest=BUNDLE,
        dest=tmp_path / "loaded",
        config_dir=tmp_path / "hf",
    )
    rebuilt = rebuild_stack(doc, {"i:1": "sha256:x"}, choices)
    assert rebuilt.document()["services"]["engine"]["environment"] == environment
    environment["MOE_STACK_PROMPTS_MAX_MIB"] = "0"  # a bundle that would have the helper remove every page
    with pytest.raises(UntrustedBundle, match="prompt cache is not named as moe-stack names it"):
        rebuild_stack(doc, {"i:1": "sha256:x"}, choices)


def test_ktransformers_prompts_key_follows_the_checkpoint_its_attention_comes_from(tmp_path: Path) -> None:
    # SGLang builds attention from --config-dir's weights: another checkpoint there writes other KV pages.
    hf = tmp_path / "hf"
    hf.mkdir()
    weights = hf / "model.safetensors"
    weights.write_bytes(b"\0" * 64)
    stack = _kt_stack(tmp_path, "qwen3moe")

    def key() -> str:
        return str(compose_dict(stack, "x")["services"]["engine"]["environment"]["MOE_STACK_PROMPTS"])

    first = key()
    assert key() == first
    weights.write_bytes(b"\0" * 65)  # the same name, other weights (another revision or precision)
    assert key() != first


@pytest.mark.parametrize(
    ("arch", "why"),
    [
        ("qwen3next", "holds attention's KV cache only \\(MHA and MLA\\), not the recurrent layers' state"),
        ("deepseek32", "hold the attention cache but not the sparse-attention indexer's keys"),
    ],
)
def test_ktransformers_refuses_to_keep_what_sglangs_files_cant_hold(
    tmp_path: Path, arch: str, why: str
) -> None:
    with pytest.raises(StackError, match=f"ktransformers can't keep {arch}'s prompts: SGLang's .*{why}"):
        compose_dict(_kt_stack(tmp_path, arch), "x")


def test_a_bundle_keeps_its_prompt_cache_and_nothing_else_by_that_name(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    doc = compose_dict(_stack(model, keep_prompts=True), "x")
    rebuilt = rebuild_stack(
        doc,
        {"i:1": "sha256:x"},
        LoadChoices(model_files=(model,), bundle_digest=BUNDLE, dest=tmp_path / "loaded"),
    ).document()
    assert rebuilt["volumes"] == doc["volumes"]
    assert rebuilt["services"]["engine"]["environment"] == doc["services"]["engine"]["environment"]
    assert rebuilt["services"]["engine"]["stop_grace_period"] == "5m"
    doc["services"]["engine"]["environment"]["MOE_STACK_PROMPTS"] = "../../etc"
    with pytest.raises(UntrustedBundle, match="prompt cache is not named as moe-stack names it"):
        rebuild_stack(
            doc,
            {"i:1": "sha256:x"},
            LoadChoices(model_files=(model,), bundle_digest=BUNDLE, dest=tmp_path / "loaded"),
        )


def test_a_sliding_window_model_keeps_its_full_cache_on_mainline(tmp_path: Path) -> None:
    # Gemma 3's restored slot was prefilled again without it (bench/results/prompt-restart-2026-12-03)
    host = epyc_host(tmp_path / "h", cores=8, threads=1, node_gib=64)
    swa = write_moe_gguf(tmp_path / "models" / "oss.gguf", synth_shape("gpt-oss", tiny=True))
    full = write_moe_gguf(tmp_path / "models" / "moe.gguf", MoeShape(layers=4))
    assert read_facts(swa).sliding_window > 0 and read_facts(full).sliding_window == 0

    def command(model: Path, engine: str, keep: bool) -> list[str]:
        stack = assemble_stack(
            StackOptions(model_path=model, engine=engine, image="i:1", keep_prompts=keep), host
        )
        return list(compose_dict(stack, "x")["services"]["engine"]["command"])

    assert "--swa-full" in command(swa, "llama.cpp", True)
    assert "--swa-full" not in command(swa, "llama.cpp", False)  # the window alone, as the engine chooses
    assert "--swa-full" not in command(full, "llama.cpp", True)


def test_an_idle_unload_saves_the_slots_before_the_server_sleeps(tmp_path: Path) -> None:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")

    def service(**options: object) -> dict:
        return compose_dict(_stack(model, **options), "x")["services"]["engine"]

    kept = service(keep_prompts=True, idle_unload=600)
    command = kept["command"]
    # The helper saves after a quarter of it without work; the save restarts the server's own timer,
    # which gets the rest: the server sleeps 600 s after the last request either way.
    assert kept["environment"]["MOE_STACK_PROMPTS_QUIET_S"] == "150"
    assert command[command.index("--sleep-idle-seconds") + 1] == "450"
    plain = service(idle_unload=600)
    assert plain["command"][plain["command"].index("--sleep-idle-seconds") + 1] == "600"
    assert "MOE_STACK_PROMPTS_QUIET_S" not in plain.get("environment", {})
    assert "MOE_STACK_PROMPTS_QUIET_S" not in service(keep_prompts=True)["environment"]
    with pytest.raises(ValueError, match="--idle-unload 3s leaves no time to save the prompt cache"):
        _stack(model, keep_prompts=True, idle_unload=3)
