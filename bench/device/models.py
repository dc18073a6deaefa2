"""The models the device cases name: synthetic GGUFs of the real per-layer and per-expert shapes
(random weights: speed and memory depend on shapes and bytes, not on values), each with the preset
moe-stack serves its family with. Fewer layers and experts than the real models keep a file writable
within a call; a token still reads its experts of the real width.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from machine import WORK, Tree

from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import MoeShape, token_read_bytes, write_moe_gguf

R1, QN, Q235 = "deepseek-r1-671b", "qwen3-next-80b-a3b", "qwen3-235b-a22b"
MODELS: dict[str, tuple[str, MoeShape]] = {
    "r1-8": (R1, synth_shape("deepseek2", layers=8, experts=32)),
    "r1-16": (R1, synth_shape("deepseek2", layers=16, experts=32)),
    "qn-8": (QN, synth_shape("qwen3next", layers=8, experts=128)),
    "qn-16": (QN, synth_shape("qwen3next", layers=16, experts=128)),
    "q235-8": (Q235, synth_shape("qwen3moe", layers=8, experts=32)),
    # Twice the experts of r1-8, else the same: the growth of prefill's expert copy in the compute buffer.
    "r1-8-e64": (R1, synth_shape("deepseek2", layers=8, experts=64)),
    # q235-8 with Qwen3's real vocabulary (151936): the compute buffer's output stage at its real width.
    "q235-8-v": (Q235, synth_shape("qwen3moe", layers=8, experts=32, vocab=151936)),
    "qn-full": (QN, synth_shape("qwen3next")),  # the real shape: 48 layers, 512 experts, 44.6 GB
    # Decode against the read bound: R1's widths at 12 layers (3 dense) and 6 (1 dense), Qwen3-235B's at 12,
    # all Q4_0; R1's 256 experts in 1 dense and 3 MoE layers (prefill's expert upload at its real size).
    "r1-12": (R1, synth_shape("deepseek2", layers=12, experts=32, quant="Q4_0")),
    "r1-6": (R1, synth_shape("deepseek2", layers=6, experts=32, dense_layers=1, quant="Q4_0")),
    "q235-12": (Q235, synth_shape("qwen3moe", layers=12, experts=32, quant="Q4_0")),
    "r1p": (R1, synth_shape("deepseek2", layers=4, dense_layers=1, quant="Q4_0")),
    # Qwen3-30B-A3B's widths, all 48 layers, and Qwen3-235B's 8-layer slice at a 4k context (tune's).
    "a3b": (QN, synth_shape("qwen3moe", layers=48, hidden=2048, heads=32, expert_ffn=768, context=4096)),
    "q235b": (Q235, synth_shape("qwen3moe", layers=8, context=4096)),
    "q235-4": (Q235, synth_shape("qwen3moe", layers=4, context=4096)),  # the CUDA images' runs (P1)
}
# Issue 45's families at their real widths, each kind of layer the family has (a dense one, window and
# full attention, delta nets, DeepSeek-V4's ratios), 16 experts and the synthetic vocabulary: small
# files whose compute buffer is the layers' stage.
FAMILIES: dict[str, tuple[str, str, dict[str, object]]] = {
    "glm46-4": ("glm-4.6", "glm4moe", {"layers": 4, "dense_layers": 1}),
    "gptoss-4": ("gpt-oss-120b", "gpt-oss", {"layers": 4}),
    "minimax-4": ("minimax-m2", "minimax-m2", {"layers": 4}),
    "glm5-4": ("glm-5", "glm-dsa", {"layers": 4, "dense_layers": 1}),
    "q35-4": ("qwen3.5-397b-a17b", "qwen35moe", {"layers": 4}),
    "kimi-4": (
        "kimi-k2",
        "deepseek2",
        {"layers": 4, "dense_layers": 1, "heads": 64, "expert_groups": 0, "groups_used": 0},
    ),
    "dsv4-4": ("deepseek-v4-flash", "deepseek4", {"layers": 4}),
    "minimax-4-e256": ("minimax-m2", "minimax-m2", {"layers": 4, "experts": 256}),  # the real 256 experts
    "ling1t-4": ("ling-1t", "bailingmoe2", {"layers": 4, "dense_layers": 1}),
    "ling3-6": ("ling-3.0-flash", "bailingmoe3", {"layers": 6, "dense_layers": 1}),
    "k3-4": ("kimi-k3", "kimi-k3", {"layers": 4}),
    "m3-4": ("minimax-m3", "minimax-m3", {"layers": 4, "dense_layers": 1}),
    "dsv32-4": ("deepseek-v3.2", "deepseek32", {"layers": 4, "dense_layers": 1}),
}
for _name, (_preset, _arch, _changes) in FAMILIES.items():
    MODELS[_name] = (_preset, synth_shape(_arch, **{"experts": 16, "vocab": 0, **_changes}))  # type: ignore[arg-type]

# KTransformers' (kt.py): each preset's model at its real widths, few layers, 16 experts: Qwen3-235B's;
# R1's (MLA, one dense leading layer and one MoE layer); Qwen3-Next's (three gated delta nets, one attention).
KT_MODELS = {
    "q235-2": ("qwen3-235b-a22b", "qwen3moe", 2),
    "r1-2": ("deepseek-r1-671b", "deepseek2", 2),
    "qn-4": ("qwen3-next-80b-a3b", "qwen3next", 4),
}


def path_of(name: str) -> Path:
    return WORK / "models" / f"{name}.gguf"


def ensure_models(names: list[str], record: Path) -> None:
    """The named models written (once per machine), each with what a decoded token reads."""
    for name in names:
        path = path_of(name)
        if path.is_file():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        started = time.time()
        shape = MODELS[name][1]
        write_moe_gguf(path.with_suffix(".part"), shape).rename(path)
        ram, vram = token_read_bytes(shape)
        row = {"model": name, "bytes": path.stat().st_size, "seconds": round(time.time() - started, 1)}
        with record.open("a") as sink:
            sink.write(json.dumps(row | {"token_ram_bytes": ram, "token_vram_bytes": vram}) + "\n")


def quantizer_of(tree: Tree) -> Tree:
    """The tree whose llama-quantize writes a case's NAME~TYPE: its own if it is ik_llama.cpp's (the
    types ik adds), else ik_llama.cpp's."""
    return tree if tree.engine_name == "ik_llama.cpp" else Tree("ik_llama.cpp")


def quantized(name: str, quantizer: Tree) -> Path:
    """NAME~TYPE (every tensor TYPE) or NAME~exps=TYPE (the routed experts alone; the rest as written),
    made from NAME by ik_llama.cpp's llama-quantize once."""
    base, _, kind = name.partition("~")
    path = path_of(name)
    if path.is_file():
        return path
    while quantizer.state == "building":
        time.sleep(5)
    if kind.startswith("exps="):
        how = ["--custom-q", rf"ffn_.*_exps\.weight={kind[5:].lower()},.*=q4_0", "Q4_0"]
    else:
        how = ["--pure", kind]
    command = [str(quantizer.tool("llama-quantize")), "--allow-requantize", *how[:-1], str(path_of(base))]
    with (WORK / "logs" / f"quantize-{name}.log").open("w") as log:
        subprocess.run([*command, str(path), how[-1], "16"], stdout=log, stderr=subprocess.STDOUT, check=True)
    return path
