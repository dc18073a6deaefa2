"""The checks of a stack that touch this host: files the engine's user must read, the model's mounts
(a Hugging Face cache's links), whether this CPU runs the image, whether the port is free."""

from __future__ import annotations

import errno
import socket
import stat
from pathlib import Path

from builder.contract import IMAGE_UID, MODEL_DIR
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.files import user_path
from builder.host.probe import CpuInfo, missing_flags
from builder.images.image_facts import ImageFacts
from builder.platform.targets import best_cpu_target
from builder.stackfile.service_parts import directory_mount, file_mount
from builder.stackfile.stack_file import Mount, StackFiles


def stack_files(stack: StackSpec, check: bool = True) -> StackFiles:
    """The model's mounts and the API key file as the stack mounts them, each checked readable by the
    engine's user; `check=False` (example stacks for another machine) takes the paths as given."""
    if not check:
        path = stack.model.path
        return StackFiles(model=path, mounts=(directory_mount(path),), api_key=stack.api_key_file)
    # The directory resolved, not the file: a Hugging Face cache's file is a link into blobs/ under a
    # hash, and the engine needs the file's own (split) name.
    model = stack.model.path.parent.resolve() / stack.model.name
    parts = list(stack.model.parts)
    mounts = model_mounts(model, parts)
    if model.is_dir():  # a directory of weights (kt-kernel's converted ones): it and each of its files
        for part in parts:
            check_readable_in_container(part)
    else:
        check_readable_in_container(model, parent_too=mounts[0].target == MODEL_DIR)
    # A draft model and a vision projector sit beside the model (files.check_beside_model): in its mount.
    for beside in (path for path in (stack.draft_model, stack.mmproj) if path is not None):
        named = beside.parent.resolve() / beside.name
        check_readable_in_container(named.resolve(), parent_too=False)
        if mounts[0].target != MODEL_DIR:  # the model's files mounted one by one: this one's too
            mounts = (*mounts, file_mount(named.resolve(), named.name))
    key = stack.api_key_file.resolve() if stack.api_key_file is not None else None
    if key is not None:
        check_api_key_file(key)
        check_readable_in_container(key, parent_too=False, private_fix=True)
    return StackFiles(
        model=model,
        mounts=mounts,
        api_key=key,
        model_bytes=stack.model.size,
        config_weights_bytes=checkpoint_bytes(stack.config_dir) if stack.config_dir is not None else 0,
        model_identity=stack.model.identity if stack.keep_prompts else None,
    )


def router_files(stack: StackSpec, models: tuple[StackSpec, ...]) -> StackFiles:
    """Every routed model's files, each mounted under its own name in /models (a clash of two names is
    refused), checked readable by the engine's user; the API key as for one model."""
    mounts: dict[str, Mount] = {}
    for model in models:
        for part in model.model.parts:
            source = part.resolve()
            check_readable_in_container(source, parent_too=False)
            target = f"{MODEL_DIR}/{part.name}"
            if target in mounts and mounts[target].source != str(source):
                raise StackError(
                    f"two models are named {part.name}; rename one (each is mounted as /models/NAME)"
                )
            mounts[target] = file_mount(source, part.name)
    single = stack_files(stack)
    return StackFiles(model=single.model, mounts=tuple(mounts.values()), api_key=single.api_key)


def model_mounts(model: Path, parts: list[Path]) -> tuple[Mount, ...]:
    """The mounts of `model` (its files: `parts`): its directory at /models, read-only; or, where its
    files are links out of that directory (Hugging Face's snapshots/<rev>/NAME -> ../../blobs/HASH), each
    file's target mounted under its own name, so the engine sees the names and nothing else of the cache."""
    if any(part.is_symlink() and part.resolve().parent != model.parent for part in parts):
        return tuple(file_mount(part.resolve(), part.name) for part in parts)
    return (directory_mount(model),)


def check_api_key_file(path: Path) -> None:
    """Refuse a key file without a key on its first line: the engines, the KTransformers image's launcher
    and `smoke` take that line as the key, and an empty key is none (the server answers anyone)."""
    try:
        with path.open("rb") as handle:
            first = handle.readline(64 * 1024)
    except OSError as err:
        raise StackError(
            f"--api-key-file {path}: {err.strerror}; give the file holding the API key"
        ) from None
    if not first.strip():
        raise StackError(
            f"--api-key-file {path} has no key on its first line (the file is empty or blank): the engine "
            "would check no key and answer anyone; write the key on its first line"
        )


def check_readable_in_container(
    model: Path, uid: int = IMAGE_UID, parent_too: bool = True, private_fix: bool = False
) -> None:
    """The engine runs as `uid` (and group `uid`), not as the file's owner: refuse a file it could not
    open (and the directory, where the directory is what gets mounted). `private_fix`: suggest the
    group-readable fix (for a secret, which must not be world-readable)."""
    model = model.resolve()
    read = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)
    read_search = (stat.S_IRUSR | stat.S_IXUSR, stat.S_IRGRP | stat.S_IXGRP, stat.S_IROTH | stat.S_IXOTH)
    checks = [(model, read, "o+r")]
    if parent_too:
        checks.insert(0, (model.parent, read_search, "o+rx"))
    for path, (owner, group, other), fix in checks:
        info = path.stat()
        need = owner if info.st_uid == uid else group if info.st_gid == uid else other
        if (info.st_mode & need) != need:
            how = (
                f"`chgrp {uid} {path} && chmod 0640 {path}` (readable by the engine's group, not by everyone)"
                if private_fix
                else f"`chmod {fix} {path}` (or chown it to {uid})"
            )
            raise StackError(
                f"{path} is not readable by the engine's user (uid {uid}) in the container; run {how}"
            )


def check_host_runs(facts: ImageFacts, cpu: CpuInfo) -> None:
    """Refuse an image whose CPU target needs flags this host lacks (it would die at the first
    AVX-512 instruction); name the flags and the target that fits."""
    lacking = missing_flags(facts.required_cpu_flags, cpu)
    if lacking:
        fits = best_cpu_target(cpu.flags)
        hint = f"use the {fits.name} image" if fits else "this CPU fits no target"
        raise StackError(
            f"image {facts.image} (CPU target {facts.cpu_target}) needs CPU flags this host lacks: "
            f"{' '.join(lacking)}; {hint}, or pass --for-other-host to emit it for another machine"
        )


# The weight files a Hugging Face checkpoint holds (SGLang's loader takes these).
CHECKPOINT_WEIGHTS = ("*.safetensors", "*.bin")


def checkpoint_bytes(config_dir: Path) -> int:
    """The size of a Hugging Face checkpoint's weight files (a snapshot's links followed)."""
    return sum(
        weights.stat().st_size for pattern in CHECKPOINT_WEIGHTS for weights in config_dir.glob(pattern)
    )


def check_config_dir(path: Path, weights: bool) -> Path:
    """KTransformers reads config.json and the tokenizer from the model's Hugging Face directory, and
    (`weights`: its SGLang server) the non-expert weights too."""
    path = user_path(path).resolve()
    if not (path / "config.json").is_file():
        needs = (
            "config.json, tokenizer files and the *.safetensors weights"
            if weights
            else "config.json and tokenizer files"
        )
        raise StackError(
            f"--config-dir {path} has no config.json: give the model's Hugging Face directory ({needs})"
        )
    check_readable_in_container(path / "config.json")
    if weights and not any(next(path.glob(pattern), None) for pattern in CHECKPOINT_WEIGHTS):
        raise StackError(
            f"--config-dir {path} has config.json but no weights (*.safetensors): KTransformers' SGLang "
            "server loads attention, embeddings and router from the model's Hugging Face checkpoint and "
            "kt-kernel only the experts from --model; fetch the checkpoint into it (moe-stack fetch-model "
            "--hf ORG/MODEL --checkpoint --dest DIR)"
        )
    return path


def free_local_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def check_port_free(bind: str, port: int) -> None:
    """Fail with the port's name when something already listens there."""
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((bind, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise StackError(
                    f"port {port} on {bind} is already in use; stop what holds it or pick another with --port"
                ) from None
            if err.errno == errno.EADDRNOTAVAIL:
                raise StackError(
                    f"--bind {bind} is not an address of this host; use 127.0.0.1 or an "
                    "address of one of its interfaces"
                ) from None
            raise
