"""The option groups a stack request is made of, each field declared once (type, default, limits, spellings,
help) and inherited by every class that holds it: the command line (stacks/options.StackCommandLine), the
options of one model (StackOptions) and the spec (engines/base.StackSpec). The engine's neutral options
are the first group (spec.NeutralOptions); what an engine reads of a stack (ENGINE_OPTIONS) is derived
from the groups, never listed by hand."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, ConfigDict, Field, field_validator
from pydantic.fields import FieldInfo

from builder.spec import NeutralOptions, Strict, option


def argument(default: Any, *, help: str) -> Any:
    """A positional command-line argument's one declaration."""
    return Field(default=default, description=help, json_schema_extra={"argument": True})


def numbers(text: str) -> tuple[int, ...]:
    """`0,1` as the numbers (ValueError, naming the text, if they are not)."""
    try:
        return tuple(int(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise ValueError(f"{text!r} must be numbers separated by commas, e.g. 0,1") from None


def sizes(text: str) -> tuple[float, ...]:
    """`24,24` as sizes in GiB (ValueError, naming the text, if they are not)."""
    try:
        values = tuple(float(part) for part in text.split(",")) if text else ()
    except ValueError:
        raise ValueError(f"{text!r} must be numbers separated by commas, e.g. 24 or 24,24") from None
    if any(not 0 < value < 1e6 for value in values):
        raise ValueError(f"{text!r}: each value must be a positive size in GiB")
    return values


def _text_as(parse: Callable[[str], tuple[Any, ...]]) -> BeforeValidator:
    """A tuple the command line gives as text (`0,1`), parsed; none given is empty."""
    return BeforeValidator(lambda value: parse(value) if isinstance(value, str) else value or ())


# Lists the command line gives as comma-separated text, and those it gives by repeating an option.
Numbers = Annotated[tuple[int, ...], _text_as(numbers)]
Sizes = Annotated[tuple[float, ...], _text_as(sizes)]
Repeated = Annotated[tuple[str, ...], BeforeValidator(lambda value: value or ())]


class _Group(Strict):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServedOptions(_Group):
    """The server's own options beside the neutral ones: as given from the command line to the spec, and
    each read by the engines that declare it (Engine.honours); any other engine refuses it."""

    parallel: int = option(1, "--parallel", help="server slots (concurrent requests)", ge=1, le=256)
    chat_template: str | None = option(
        None,
        "--chat-template",
        help="built-in chat template name (e.g. gemma) or a Jinja template, for GGUFs without one",
    )
    # The model's name in the API (/v1/models, a request's "model"): the same whatever the engine.
    served_name: str | None = option(
        None,
        "--served-name",
        help="the model's name in the API (default: the preset's name, else the model's file name without "
        "its split suffix)",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/+-]{0,127}$",
    )
    jinja: bool = option(
        True,
        "--jinja/--no-jinja",
        help="the model's Jinja chat template (tool calls, thinking); on where the image has it",
    )
    metrics: bool = option(
        True,
        "--metrics/--no-metrics",
        help="the engine's Prometheus endpoint /metrics; on where the image has it",
    )
    # KTransformers reads the model's config and tokenizer from its Hugging Face directory; Python in
    # that directory (a config's auto_map) runs only when the user asks for it.
    config_dir: Path | None = option(
        None,
        "--config-dir",
        help="KTransformers: the model's Hugging Face directory (config.json, tokenizer), mounted read-only",
    )
    trust_remote_code: bool = option(
        False,
        "--trust-remote-code",
        help="KTransformers: let the server run Python from --config-dir (a config's auto_map); off by "
        "default, as no preset's model needs it",
    )
    gpu_experts: int | None = option(
        None,
        "--gpu-experts",
        help="KTransformers: experts per layer kept on the GPU (default: from --fit-vram-gb, else none)",
        ge=0,
    )
    mlock: bool = option(False, "--mlock", help="lock the model in RAM (adds IPC_LOCK and unlimited memlock)")
    hugepages: bool = option(
        False, "--hugepages", help="weights from the host's reserved hugepages (ik_llama.cpp -thp)"
    )
    # Or, for any engine that mmaps its weights: the model copied onto a hugetlbfs volume of this page
    # size by the entrypoint, so the mapping is backed by the reserved pool.
    hugetlbfs: Literal["off", "2M", "1G"] = option(
        "off",
        "--hugetlbfs",
        help="copy the model onto a hugetlbfs volume of 2M or 1G pages at start (any engine; the pool must "
        "hold it)",
    )
    api_key_file: Path | None = option(
        None, "--api-key-file", help="file with the API key(s), passed as a compose secret"
    )
    keep_prompts: bool = option(
        False,
        "--keep-prompts",
        help="keep the server's prompt cache across restarts on a named volume: the llama.cpp engines' slots "
        "saved when the container stops and restored when it is healthy; KTransformers' (SGLang's) page "
        "files written as it serves and read back for a prompt seen before",
    )


class ContainerOptions(_Group):
    """The stack's own container options: as given from the command line to the spec; no engine reads
    them."""

    port: int = option(8080, "--port", help="host port", ge=1, le=65535)
    bind: str = option(
        "127.0.0.1", "--bind", help="host address to publish on (0.0.0.0 exposes it to the network)"
    )
    gpu: Literal["none", "nvidia", "cdi"] = option(
        "none", "--gpu", help="none, nvidia (device reservation) or cdi"
    )
    # /dev/shm: Docker's 64 MB default is too small for CUDA IPC and the Python engines' workers.
    shm_size: str = option("1g", "--shm-size", help="size of /dev/shm, e.g. 1g")
    # A Prometheus service beside the engine, scraping it, its UI on this port.
    monitoring: bool = option(
        False,
        "--monitoring",
        help="add a Prometheus service scraping the engine (its image: `moe-stack base --prometheus`)",
    )
    monitoring_port: int = option(
        9090, "--monitoring-port", help="host port of Prometheus' UI, with --monitoring", ge=1, le=65535
    )

    @field_validator("bind")
    @classmethod
    def _address(cls, bind: str) -> str:
        try:
            ipaddress.ip_address(bind)
        except ValueError:
            raise ValueError(
                f"{bind!r} is not an IP address: publish on 127.0.0.1 (default), 0.0.0.0 or one of "
                "this host's addresses"
            ) from None
        return bind

    @field_validator("shm_size")
    @classmethod
    def _size(cls, size: str) -> str:
        if not re.fullmatch(r"[1-9][0-9]*[kmg]?", size):
            raise ValueError(f"{size!r} is not a size: give one like 1g, 512m or 65536k")
        return size


def decided(default: Any = ..., *, said: str, ge: float | None = None) -> Any:
    """A field the stack decides and the engine reads: `said` is what the user gives to change it (named
    when an engine refuses it)."""
    return Field(default=default, ge=ge, json_schema_extra={"said": said})


class EnginePlacement(_Group):
    """What the stack decides from the request and the host, and the engine reads (the spec's alone)."""

    cpu_threads: int = decided(said="--threads", ge=1)
    override_tensors: tuple[str, ...] = decided((), said="--override-tensor/--experts-on-cpu")
    # Several GPUs: each one's share of the layers (llama.cpp's -ts), as the plan sized them.
    tensor_split: tuple[int, ...] = decided((), said="a multi-GPU plan (--fit-vram-gb per GPU)")
    # The engine places layers and experts itself (--fit): no -ngl or -ot rules are written.
    engine_fit: bool = decided(False, said="--placement fit")
    extra_args: tuple[str, ...] = decided((), said="extra engine arguments (after --)")

    @field_validator("override_tensors")
    @classmethod
    def _rules(cls, rules: tuple[str, ...]) -> tuple[str, ...]:
        for rule in rules:
            pattern, sep, buftype = rule.rpartition("=")
            if not sep or not pattern or not buftype:
                raise ValueError(
                    f"override rule {rule!r} must look like REGEX=BUFFER_TYPE, e.g. 'ffn_.*_exps=CPU'"
                )
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"override rule {rule!r}: bad regex ({err})") from None
        return rules


def _spelled(field: FieldInfo) -> str:
    """How the user gives an engine-read field: what it declares it is said as, else its flag (a switch on
    or off by default as the spelling that changes it, one that is the engine's choice as both)."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "said" in extra:
        return str(extra["said"])
    both = str(extra["flags"][0])  # type: ignore[index]  # every group field is an option() or decided()
    on, _, off = both.partition("/")
    return {True: off, False: on}.get(field.default, both) if off else both


# The stack options an engine reads, each as the user gives it: every adapter declares the ones it
# honours (Engine.honours) and refuses any other set to other than its default, never dropping it.
ENGINE_OPTIONS: dict[str, str] = {
    name: _spelled(field)
    for group in (NeutralOptions, ServedOptions, EnginePlacement)
    for name, field in group.model_fields.items()
}
