"""ImageSpec → build context (Dockerfile + the files it copies). Deterministic; never calls Docker."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2

from builder import __version__
from builder.contract import (
    ARCHITECTURES_FILE,
    CONTAINER_PORT,
    CONTRACT_DIR,
    ENGINE_DIR,
    HELP_FILE,
    IMAGE_UID,
    LABEL_PREFIX,
    PARSER_FLAGS_FILE,
    PROMPTS_DIR,
    ROUTER_PRESET,
)
from builder.engines.base import ImageSpec
from builder.files import replace_rendered_dir, templates_root
from builder.images.naming import cache_key, variant_tag


def template_environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_root())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["dq"] = json.dumps  # a double-quoted, escaped Dockerfile string
    return env


def image_labels(spec: ImageSpec) -> dict[str, str]:
    """Labels fixed at render time (the build adds `created`)."""
    engine = spec.engine
    return {
        "org.opencontainers.image.title": f"{engine.name} server ({variant_tag(spec)})",
        "org.opencontainers.image.description": (
            f"{engine.name} {engine.server_label} for {spec.cuda.label}, CPU target {spec.cpu.name}"
        ),
        "org.opencontainers.image.source": engine.source_url(spec),
        "org.opencontainers.image.revision": spec.ref,
        "org.opencontainers.image.version": variant_tag(spec),
        f"{LABEL_PREFIX}.builder-version": __version__,
        f"{LABEL_PREFIX}.engine": engine.name,
        f"{LABEL_PREFIX}.engine-ref": spec.ref,
        f"{LABEL_PREFIX}.cuda": spec.cuda.version or "none",
        f"{LABEL_PREFIX}.cuda-archs": ",".join(str(a) for a in spec.cuda.archs),
        # Where the image's CUDA comes from: NVIDIA's images, moe-stack's bases (PyPI wheels, Debian's
        # archive), or the engine's own Python wheels.
        f"{LABEL_PREFIX}.cuda-base": engine.cuda_origin(spec) if spec.cuda.version else "none",
        f"{LABEL_PREFIX}.cpu-target": spec.cpu.name,
        f"{LABEL_PREFIX}.march": spec.cpu.march or "none",
        f"{LABEL_PREFIX}.required-cpu-flags": " ".join(spec.cpu.required_flags),
    }


def image_manifest(spec: ImageSpec) -> dict[str, object]:
    """/etc/moe-stack/image.json: what the image is, for tools running inside or beside it."""
    engine = spec.engine
    return {
        "builder_version": __version__,
        "engine": engine.name,
        "engine_ref": spec.ref,
        "server": engine.server_path(spec),
        "port": CONTAINER_PORT,
        "cuda": spec.cuda.version,
        "cuda_archs": list(spec.cuda.archs),
        "cpu_target": spec.cpu.name,
        "march": spec.cpu.march,
        "required_cpu_flags": list(spec.cpu.required_flags),
    }


def configure_args(spec: ImageSpec) -> list[str]:
    """The cmake configure arguments of an image built with cmake, compiler choice included."""
    engine = spec.engine
    engine.check_image(spec)
    return engine.configure_args(spec, engine.toolchain(spec))


def render_files(spec: ImageSpec) -> dict[str, str]:
    """Every file of the build context, by name. Same spec → same bytes."""
    engine = spec.engine
    engine.check_image(spec)
    tools = engine.toolchain(spec)
    context = {
        "builder_version": __version__,
        "engine_name": engine.name,
        "ref": spec.ref,
        "cpu": spec.cpu,
        "cuda_label": spec.cuda.label,
        "build_image": tools.build_image,
        "runtime_image": tools.runtime_image,
        "build_packages": tools.build_packages,
        "runtime_packages": tools.runtime_packages,
        "uid": IMAGE_UID,
        "prompts_dir": PROMPTS_DIR,
        "engine_dir": ENGINE_DIR,
        "contract_dir": CONTRACT_DIR,
        "help_file": HELP_FILE,
        "parser_flags_file": PARSER_FLAGS_FILE,
        "architectures_file": ARCHITECTURES_FILE,
        "router_preset": ROUTER_PRESET,
        "model_flags": " ".join(engine.model_flags),
        "port": CONTAINER_PORT,
        "labels": image_labels(spec),
        "ccache_id": f"moe-stack-ccache-{cache_key(spec)}",
        **engine.template_values(spec, tools),
    }
    root = templates_root()
    return {
        "Dockerfile": template_environment().get_template(engine.template).render(context),
        "moe-stack-entrypoint": (root / "common/moe-stack-entrypoint").read_text(),
        "moe-stack-health": (root / "common/moe-stack-health").read_text(),
        "image.json": json.dumps(image_manifest(spec), indent=2, sort_keys=True) + "\n",
        "required-cpu-flags": " ".join(spec.cpu.required_flags) + "\n",
        **engine.context_files(root, spec),
    }


def render(spec: ImageSpec, out_dir: Path) -> Path:
    """Render `spec`'s build context into `out_dir`; returns the directory."""
    return replace_rendered_dir(render_files(spec), out_dir)
