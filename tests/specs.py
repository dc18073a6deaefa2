"""What the tests share: each engine's default image spec, minimal fake engine source trees, and the
presets' engines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from builder.engines import get_engine
from builder.engines.base import ImageSpec, StackSpec
from builder.models.opened import OpenedModel
from builder.platform.targets import cpu_target
from builder.spec import GitSource
from builder.stacks.compose import compose_stack
from builder.stacks.presets import load_presets


def default_spec(engine: str, cpu: str = "avx2") -> ImageSpec:
    adapter = get_engine(engine)
    return ImageSpec(
        engine=adapter.name,
        source=GitSource(url=adapter.upstream_url, ref=adapter.default_ref),
        cpu=cpu_target(cpu),
    )


def mainline_tree(root: Path) -> Path:
    """The files that make a directory look like a llama.cpp tree (nothing that builds)."""
    for rel in ("ggml", "tools/server"):
        (root / rel).mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(llama)\n")
    return root


def ik_tree(root: Path) -> Path:
    """The same for ik_llama.cpp (its IQK kernels, its server under examples/)."""
    for rel in ("ggml/src/iqk", "examples/server"):
        (root / rel).mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(llama)\n")
    return root


def readable_file(path: Path, content: bytes) -> Path:
    """A file (and its directory) the engine's container user (uid 10001) can read, as stacks need."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    path.write_bytes(content)
    path.chmod(0o644)
    return path


def routed_stacks(directory: Path) -> tuple[StackSpec, StackSpec]:
    """Two one-file models in `directory` (readable by the engine's user), as the stacks a router serves."""
    directory.chmod(0o755)
    stacks = []
    for name in ("m", "n"):
        model = directory / f"{name}.gguf"
        model.write_bytes(b"GGUF")
        model.chmod(0o644)
        stacks.append(
            StackSpec(
                project_name="p",
                engine="llama.cpp",
                image_ref="img:1",
                cpu_threads=4,
                model=model,
                served_name=name,
            )
        )
    return stacks[0], stacks[1]


def compose_dict(stack: StackSpec, generated_by: str, *args: Any, **options: Any) -> dict[str, Any]:
    """`compose_stack`'s file as plain data, as written (`$` doubled): what the tests assert on."""
    return compose_stack(stack, generated_by, *args, **options).document()


def preset_engines(engines: tuple[str, ...] = ("llama.cpp", "ik_llama.cpp")) -> list[tuple[str, str]]:
    """Each preset by name with each of `engines` it has settings for (DeepSeek-V4: mainline's alone)."""
    return [
        (name, engine)
        for name, preset in sorted(load_presets().items())
        for engine in engines
        if engine in preset.engines
    ]


def opened(path: Path, engine: str = "llama.cpp") -> OpenedModel:
    """The model at `path` as the engine opens it (what the stack-making functions take)."""
    return get_engine(engine).open_model(path)


def demo_stack(tmp_path: Path, **update: object) -> StackSpec:
    """A one-model llama.cpp stack of project "demo" on a readable stand-in model file under tmp_path."""
    model = tmp_path / "models" / "m.gguf"
    model.parent.mkdir(exist_ok=True, mode=0o755)
    model.write_bytes(b"GGUF")
    model.chmod(0o644)
    values = {
        "project_name": "demo",
        "engine": "llama.cpp",
        "image_ref": "img:1",
        "model": model,
        "cpu_threads": 4,
    }
    return StackSpec(**(values | update))
