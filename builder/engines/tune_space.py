"""What `moe-stack tune` may vary for a llama.cpp-family stack: each dimension a named set of
candidate values and how a value is written into the server's arguments (or the container's
environment, for the NUMA policy). The engine adapters choose the dimensions; the search
(tuning/tune.py) never needs to know a flag."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from builder.contract import NUMA_ENV
from builder.engines.llama_bench import server_settings

# A setting: the server's arguments and the container environment's overrides.
Args = list[str]
Env = dict[str, str]


@dataclass(frozen=True)
class Dimension:
    name: str  # what the table calls it: "threads", "ubatch", "rtr"
    values: tuple[str, ...]  # candidates, the stack's own first
    apply: Callable[[Args, Env, str], tuple[Args, Env]]
    affects: str = "both"  # "prefill", "decode" or "both": a decode-only search skips prefill dimensions


def value_of(args: Args, spellings: tuple[str, ...]) -> str | None:
    """The value the last of `spellings` in `args` has (None: not given)."""
    found = None
    for flag, value in server_settings(args):
        if flag in spellings:
            found = value
    return found


def has_switch(args: Args, spellings: tuple[str, ...]) -> bool:
    return any(flag in spellings for flag, _ in server_settings(args))


def without(args: Args, spellings: tuple[str, ...]) -> Args:
    """`args` less every `spellings` flag (and its value)."""
    kept: Args = []
    for flag, value in server_settings(args):
        if flag not in spellings:
            kept += [flag] if value is None else [flag, value]
    return kept


def setting_value(spellings: tuple[str, ...]) -> Callable[[Args, Env, str], tuple[Args, Env]]:
    """Write `spellings[0] VALUE` in place of any earlier spelling ("default": leave it out)."""

    def apply(args: Args, env: Env, value: str) -> tuple[Args, Env]:
        rest = without(args, spellings)
        return (rest if value == "default" else [*rest, spellings[0], value]), env

    return apply


def setting_switch(
    on: tuple[str, ...], off: tuple[str, ...] = ()
) -> Callable[[Args, Env, str], tuple[Args, Env]]:
    """ "on": the switch `on[0]`; "off": `off[0]` where the engine has an off-switch, else neither."""

    def apply(args: Args, env: Env, value: str) -> tuple[Args, Env]:
        rest = without(args, on + off)
        if value == "on":
            return [*rest, on[0]], env
        return ([*rest, off[0]] if off else rest), env

    return apply


def switch_dimension(
    name: str, args: Args, on: tuple[str, ...], off: tuple[str, ...] = (), default: str = "off"
) -> Dimension:
    """An on/off switch (`on` spellings, and `off` ones where the engine has an off-switch), the stack's
    state first; `default`: its state when `args` give neither."""
    current = "on" if has_switch(args, on) else "off" if off and has_switch(args, off) else default
    return Dimension(name, (current, "off" if current == "on" else "on"), setting_switch(on, off))


LOAD_MODE = ("--load-mode", "-lm")


def load_mode_dimension(name: str, args: Args) -> Dimension:
    """Mainline's `--load-mode` as an on/off switch for mapping: "on" reads the weights into the engine's
    memory (`none`), "off" leaves the engine's default (mapped); the stack's state first."""
    current = "on" if value_of(args, LOAD_MODE) in ("none", "mlock") else "off"

    def apply(args: Args, env: Env, value: str) -> tuple[Args, Env]:
        rest = without(args, LOAD_MODE)
        return ([*rest, LOAD_MODE[0], "none"] if value == "on" else rest), env

    return Dimension(name, (current, "off" if current == "on" else "on"), apply)


def setting_ubatch(args: Args, env: Env, value: str) -> tuple[Args, Env]:
    """-ub VALUE, and -b at least as large (llama.cpp caps the physical batch at the logical one)."""
    batch = value_of(args, ("-b", "--batch-size"))
    rest = without(args, ("-ub", "--ubatch-size", "-b", "--batch-size"))
    logical = max(int(value), int(batch)) if batch and batch.isdigit() else max(int(value), 2048)
    return [*rest, "--batch-size", str(logical), "--ubatch-size", value], env


def setting_numa(args: Args, env: Env, value: str) -> tuple[Args, Env]:
    """The container's NUMA policy (MOE_STACK_NUMA, applied by the image's entrypoint with numactl)."""
    return args, {**env, NUMA_ENV: value}


def thread_counts(threads: int) -> tuple[str, ...]:
    """The stack's threads (its physical cores), one and two fewer (the GPU feeder thread may want a
    core), and half (SMT siblings or a busy host)."""
    counts = [threads, threads - 1, threads - 2, threads // 2]
    return tuple(str(n) for n in dict.fromkeys(n for n in counts if n >= 1))


DRAFT_MODEL = ("-md", "--model-draft", "--spec-draft-model")
DRAFT_MAX = ("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max")
MTP = ("-mtp", "--multi-token-prediction")


def speculates(args: Args) -> bool:
    """Whether a server running `args` drafts tokens: a draft model, the model's MTP layer (ik's -mtp),
    or a --spec-type (mainline's draft-simple, draft-mtp...)."""
    return has_switch(args, DRAFT_MODEL + MTP) or value_of(args, ("--spec-type",)) not in (None, "none")


def draft_max_dimension(args: Args, flag: str) -> Dimension:
    """How many tokens a draft proposes per step (`flag`, the engine's spelling; both engines default to
    16). For a hybrid MoE stack each verified batch routes to more experts than one token does, read
    from RAM, so a shorter draft can decode faster; only a served trial shows it (llama-bench has no
    speculative decoding)."""
    current = value_of(args, DRAFT_MAX) or "default"
    spellings = (flag, *(spelling for spelling in DRAFT_MAX if spelling != flag))
    values = tuple(dict.fromkeys([current, "2", "4", "8", "16"]))
    return Dimension("draft-max", values, setting_value(spellings), affects="decode")


def stage_length_dimension(stage: str) -> Dimension:
    """The draft length inside a speculative stage (ik_llama.cpp's `--spec-type draft:n_max=4`, its only
    spelling of it since its speculative rework), the stage's other keys kept."""
    kind, _, keys = stage.partition(":")
    settings = dict(key.split("=", 1) for key in keys.split(",") if "=" in key)
    current = settings.pop("n_max", "default")

    def apply(args: Args, env: Env, value: str) -> tuple[Args, Env]:
        kept = {**settings, **({} if value == "default" else {"n_max": value})}
        written = ",".join(f"{key}={setting}" for key, setting in kept.items())
        return [
            *without(args, ("--spec-type",)),
            "--spec-type",
            f"{kind}:{written}" if written else kind,
        ], env

    return Dimension(
        "draft-max", tuple(dict.fromkeys([current, "2", "4", "8", "16"])), apply, affects="decode"
    )


def ubatch_sizes(current: str | None, gpu: bool) -> tuple[str, ...]:
    """512 … 4096, and 8192 on a GPU stack, the stack's own first. Prefill on the device: -ub 512 → 2048 →
    4096 took a 235B slice from 1871 to 4928 to 5313 t/s; with R1's 256 experts, whose every micro-batch
    copies each layer's experts to the GPU, an 8192-token prompt went 6285 → 8897 → 11056 t/s at 2048 →
    4096 → 8192 (bench/results/decode-bound-2026-12-03/prefill-search)."""
    sizes = ["512", "1024", "2048", "4096", *(["8192"] if gpu else [])]
    first = current if current is not None else "512"
    return tuple(dict.fromkeys([first, *sizes]))
