"""What every engine adapter provides, and what it is asked. The adapter (Engine): where its source comes
from, which images of it exist, the values its Dockerfile template places, the flags its server's --help
must show, and the server arguments for a stack; it is the one place that knows an engine: a new engine
is an adapter module, its template folder and a matrix row. What it is asked: what to build (ImageSpec)
and what to run (StackSpec), each holding its adapter (EngineField), validated from the engine's name where
one is read (an option, a stack file, an image label) and written as the name. The two name each other,
so they live together.

Every spec forbids unknown fields; cross-field rules live in validators whose messages name the field and
the fix, so the CLI can show them as one line."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationInfo,
    field_validator,
    model_validator,
)

from builder.contract import API_KEY_PATH, CONTAINER_PORT
from builder.engines.compute_buffers import BufferFits
from builder.errors import SpecError, StackError
from builder.host.probe import CpuInfo
from builder.models.formats import GGUF, ModelFormat
from builder.models.kv_cache import DEFAULT_UBATCH, CacheLayout, kv_cache_bytes
from builder.models.opened import OpenedModel
from builder.platform.local_cuda import LOCAL_CUDA
from builder.platform.pins import pinned_ref
from builder.platform.targets import CPU_TARGETS
from builder.platform.toolchain import Toolchain, toolchain
from builder.request import ENGINE_OPTIONS, ContainerOptions, EnginePlacement, ServedOptions
from builder.spec import (
    DEFAULT_BASES,
    NO_CUDA,
    BaseImages,
    CpuTarget,
    CudaTarget,
    EngineOptions,
    EngineSource,
    GitSource,
    LocalSource,
    NeutralOptions,
    NumaPolicy,
    PypiSource,
    Strict,
    option,
)

if TYPE_CHECKING:
    from builder.models.facts import ModelFacts

CUDA_STUB_DIR = "/tmp/cuda-stub"
# A CUDA build's server needs libcuda.so.1, which only the driver provides: for its --help at build
# time, point the loader at the toolkit's stub.
CUDA_STUB_SETUP = (
    f"mkdir -p {CUDA_STUB_DIR}",
    f"ln -sf /usr/local/cuda/lib64/stubs/libcuda.so {CUDA_STUB_DIR}/libcuda.so.1",
)

# The flag a server reads the stack's API key file with (llama.cpp's, ik_llama.cpp's).
KEY_FILE_FLAG = "--api-key-file"

# Build stage a local engine tree replaces (through a named build context).
SOURCE_CONTEXT = "engine-src"

# The APIs coding agents and chat clients speak to a server, each by the route that serves it: OpenAI's
# chat completions and Responses, Anthropic's Messages and its token count.
ClientApi = Literal["openai-chat", "openai-responses", "anthropic-messages", "anthropic-count-tokens"]
API_ROUTES: dict[ClientApi, str] = {
    "openai-chat": "/v1/chat/completions",
    "openai-responses": "/v1/responses",
    "anthropic-messages": "/v1/messages",
    "anthropic-count-tokens": "/v1/messages/count_tokens",
}


@dataclass(frozen=True)
class PromptStore:
    """How an engine keeps a stack's prompts across restarts (`compose --keep-prompts`): files on the
    stack's volume under the prompts key, restored into a server started under the same key."""

    # Its files at most, as a multiple of the stack's KV cache.
    disk_share: float
    # Page-locked host memory it keeps for them beside the weights, as a multiple of the KV cache.
    host_share: float = 0.0
    # A file per server slot, saved and restored by the image's helper (MOE_STACK_SLOTS); else the server
    # writes its files as it serves and the helper prunes them to the bound (MOE_STACK_PROMPTS_MAX_MIB).
    per_slot: bool = False

    def sizes(self, kv_bytes: int) -> tuple[int, int]:
        """(disk, host memory) it takes for a stack whose KV cache is `kv_bytes`."""
        return int(self.disk_share * kv_bytes), int(self.host_share * kv_bytes)


# Every engine's server listens on the container's every address, at the port the stack publishes.
LISTEN = {"--host": "0.0.0.0", "--port": str(CONTAINER_PORT)}


class Engine(ABC):
    """An inference engine moe-stack builds into an image and runs in a stack."""

    name: str  # spec name, e.g. "llama.cpp"
    slug: str  # image repository name, e.g. "llama-cpp"
    upstream_url: str
    template: str  # its Dockerfile template, relative to dockerfiles/
    server_label: str  # what the image serves, for its description
    source_hint: str  # what else --source accepts for it, for error messages
    sdist_subdir: str = ""  # the engine tree inside an sdist that vendors it
    model_format: ModelFormat = GGUF  # the files it loads (every engine here reads GGUF)
    prompt_cache_default_mib: int = 0  # host RAM its server keeps for a prompt cache, unless told
    # Whether llama.cpp-style -ot rules place its tensors (KTransformers places experts itself).
    takes_override_rules: bool = True
    # Whether it binds its own threads' memory to NUMA nodes (kt-kernel's thread pools, through hwloc):
    # that needs SYS_NICE in a container, whatever the stack's numactl policy.
    binds_numa_memory: bool = False
    serves_on_cpu: bool = True  # a CPU-only stack exists (KTransformers' server needs the GPU)
    # Whether its build compiles through ccache, with the template's stages that carry the cache in and
    # out (images/ccache_carry.py: `build --ccache-dir`).
    carries_ccache: bool = False
    # Whether it reads the model's config and tokenizer from a Hugging Face directory (--config-dir).
    needs_config_dir: bool = False
    # Whether that directory must hold the checkpoint's weights too (SGLang loads the non-expert ones).
    config_dir_weights: bool = False
    # Whether its server reads the API key file named in the environment (API_KEY_FILE_ENV) rather
    # than from a flag (llama.cpp's --api-key-file).
    key_file_from_env: bool = False
    # Whether it picks its CPU code path at run time, so the `portable` target exists for it.
    runtime_dispatch: bool = False
    cuda_only: bool = False  # no CPU-only image (it compiles CUDA kernels)
    installs_wheels: bool = False  # installed from PyPI wheels or a wheelhouse, not built from a tree
    # The tree's directory of the chat page its server embeds, built by images/chat_page.py (None: none).
    chat_page_dir: str | None = None
    # Whether its source is one git tree, which a source mirror holds (`git archive` of its ref alone:
    # no submodules, no wheels; images/mirror.py).
    mirrored: bool = False
    # A PyPI sdist vendoring the engine (hosts without GitHub build from it), and the ref its image gets.
    sdist: str | None = None
    sdist_ref: str | None = None
    # The flag that turns its /metrics on, and the one without which it answers no tool calls (None:
    # it has none); what the stack file records it serves.
    metrics_flag: str | None = None
    tool_calls_flag: str | None = None
    # The GGUF architectures it loads, where its image has no label that says (None: the label's).
    gguf_architectures: frozenset[str] | None = None
    # Architectures its pinned tree names whose GGUFs its loader refuses all the same: why, as the user
    # reads it after "can't load <arch> models like <file>: ".
    refused_architectures: Mapping[str, str] = MappingProxyType({})
    # The architectures whose expert groups it routes within only on its own switch (ik_llama.cpp's -ger
    # for Ling's bailingmoe2): a stack of such a model with groups turns it on (StackSpec.grouped_routing).
    groups_on_request: frozenset[str] = frozenset()
    # The stack options it reads (request.ENGINE_OPTIONS); any other one a stack sets is refused.
    honours: frozenset[str] = frozenset()
    # Every flag the adapter writes, with its other spellings (`-c, --ctx-size`) and flags that set the
    # same thing (--api-key, --api-key-file): an extra argument in any of them would set what a
    # moe-stack option sets (test_flags checks the adapter writes no other flag).
    flag_spellings: tuple[frozenset[str], ...] = ()
    # Flags it writes whose repeats add to one another rather than replace (the llama.cpp engines'
    # --chat-template-kwargs, merged key by key): a user's extra one adds its own keys, so it is not
    # refused as a repeat of the stack's.
    merged_flags: frozenset[str] = frozenset()
    # Why it reads no such option, where there is more to say than "drop it" (option name, reason).
    unread_reasons: tuple[tuple[str, str], ...] = ()
    # Whether its server ends a reply's thinking after a token budget (--reasoning-budget N > 0), whatever
    # the chat template does; without one a budget of 0 is only the template's switch.
    thinking_token_budget: bool = False
    # Flags whose next argument is a model file or directory: the entrypoint checks it is readable
    # (and stages a file on hugetlbfs), so a missing mount is one clear line, not a slow failure.
    model_flags: tuple[str, ...] = ()
    # Whether one server of it can switch between several models (llama.cpp's router mode).
    routes_models: bool = False
    # The build targets its tools image adds beside the server (none: it has no tools image).
    tool_targets: tuple[str, ...] = ()
    # Build minutes on a 2-core machine, for CI's job timeout (images/matrix.py): its CPU-only compile,
    # and its CUDA compile as a multiple of mainline's (MAINLINE_CUDA_MINUTES there). Mainline's figures
    # (bench/results/local-2026-11-30.md, P5: a cold CPU compile in 213 s), which a llama.cpp fork
    # takes unless it measures its own.
    compile_minutes_cpu: float = 4.0
    # Its CUDA buffers as its logs measured them, for the VRAM a plan keeps free (engines/compute_buffers.py;
    # none measured: a flat estimate).
    buffer_fits: BufferFits = BufferFits()
    cuda_compile_factor: float = 1.0
    # How it keeps prompts across restarts (None: it can't); a store is what makes it honour keep_prompts.
    prompt_store: PromptStore | None = None

    def key_args(self) -> list[str]:
        """What its server's command says to check the stack's API key (the secret at API_KEY_PATH): the key
        file flag, or nothing for a server whose launcher reads the file named in its environment."""
        return [] if self.key_file_from_env else [KEY_FILE_FLAG, API_KEY_PATH]

    def __init_subclass__(cls, **kwargs: object) -> None:
        """Buffer fits are measured for one engine: a subclass (a fork) that declares none of its own
        plans with the flat estimate, not with the fits of the engine it derives from. An engine with a
        prompt store honours --keep-prompts."""
        super().__init_subclass__(**kwargs)
        if "buffer_fits" not in cls.__dict__:
            cls.buffer_fits = BufferFits()
        if cls.prompt_store is not None:
            cls.honours = cls.honours | {"keep_prompts"}

    # The client APIs its server answers at the pinned ref (`smoke` checks each with the official
    # client, and says in one line which of API_ROUTES it lacks).
    apis: tuple[ClientApi, ...] = ("openai-chat",)

    def __str__(self) -> str:
        """Its name: what a message, a label or a file says of it."""
        return self.name

    # -- source -------------------------------------------------------------------------------
    @property
    def default_ref(self) -> str:
        """The ref built without --ref: dockerfiles/pins.yaml's (the refs workflow moves it)."""
        return pinned_ref(self.name)

    def default_source(self, ref: str | None) -> EngineSource:
        return GitSource(url=self.upstream_url, ref=ref or self.default_ref)

    @abstractmethod
    def is_source_tree(self, path: Path) -> bool:
        """Whether `path` is the root of this engine's source tree."""

    def source_url(self, spec: ImageSpec) -> str:
        """Where the image's engine comes from: the git URL it clones, else the upstream project."""
        return spec.source.url if isinstance(spec.source, GitSource) else self.upstream_url

    def holds_wheels(self, path: Path) -> bool:
        """Whether `path` is a wheelhouse this engine installs from (only KTransformers has one)."""
        return False

    def source_context(self, holds: str) -> str:
        """The build stage a local source replaces: the engine tree, or the wheelhouse."""
        return SOURCE_CONTEXT

    def check_local_source(self, spec: ImageSpec, tree: Path | None) -> None:
        """SpecError, before Docker runs, when the local tree or wheelhouse can't build `spec`."""

    # -- which images exist ---------------------------------------------------------------------
    def check_image(self, spec: ImageSpec) -> None:
        """SpecError when this engine has no such image (a CPU target, CUDA choice or source it lacks)."""
        if spec.base.cuda != "nvidia" and spec.cuda.version is None:
            raise SpecError(
                f"--cuda-base {spec.base.cuda} is the CUDA toolkit's base: it goes with --cuda "
                + " or ".join(LOCAL_CUDA[spec.base.cuda])
            )
        if spec.cpu.runtime_dispatch and not self.runtime_dispatch:
            named = ", ".join(name for name, target in CPU_TARGETS.items() if not target.runtime_dispatch)
            raise SpecError(
                f"CPU target {spec.cpu.name} needs runtime CPU dispatch, which {self.name} lacks; build it "
                f"for a named CPU ({named})"
            )
        if self.cuda_only and spec.cuda.version is None:
            raise SpecError(
                f"{self.name} builds CUDA kernels and has no CPU-only image: give a CUDA version "
                "(--cuda 12.8)"
            )
        if isinstance(spec.source, PypiSource) and not self.installs_wheels:
            raise SpecError(
                f"{self.name} is not installed from PyPI wheels: build it from its git ref or a source "
                "tree (--source)"
            )
        if (
            isinstance(spec.source, LocalSource)
            and spec.source.holds == "wheels"
            and not self.installs_wheels
        ):
            raise SpecError(
                f"{self.name} is built from source, not from wheels: give --source an engine tree"
            )
        if spec.tools and not self.tool_targets:
            raise SpecError(
                f"{self.name} has no tools image (no llama-bench or quantize tools to add): drop --tools"
            )

    # -- build --------------------------------------------------------------------------------
    def toolchain(self, spec: ImageSpec) -> Toolchain:
        return toolchain(spec.cpu, spec.cuda, spec.base)

    @abstractmethod
    def template_values(self, spec: ImageSpec, tools: Toolchain) -> dict[str, object]:
        """The values its Dockerfile template places, beyond those every template gets."""

    def configure_args(self, spec: ImageSpec, tools: Toolchain) -> list[str]:
        """The cmake configure arguments, for engines built with cmake."""
        raise SpecError(
            f"{self.name} is installed with pip, not configured with cmake: see its Dockerfile "
            "(`moe-stack render`)"
        )

    def context_files(self, root: Path, spec: ImageSpec) -> dict[str, str]:
        """Files of `spec`'s build context beyond the common entrypoint and healthcheck, by name."""
        return {}

    @abstractmethod
    def server_path(self, spec: ImageSpec) -> str | None:
        """The program the image's entrypoint runs (None: the image has no server)."""

    @abstractmethod
    def required_flags(self, cuda: CudaTarget) -> frozenset[str]:
        """Flags the built server's --help must list; without them the build failed in a way the
        exit status doesn't show (a crash, a missing library)."""

    # -- run ----------------------------------------------------------------------------------
    def router_command(
        self, stack: StackSpec, models: tuple[StackSpec, ...], flags: dict[str, str] | None
    ) -> tuple[list[str], str]:
        """The server's arguments and the preset file's text for several models behind one port."""
        raise StackError(
            f"{self.name} serves one model per server: emit one stack per model (each on its own port), "
            "or use an engine whose server routes between models (mainline llama.cpp's router)"
        )

    def open_model(self, path: Path) -> OpenedModel:
        """The model file this engine loads, checked by its format and opened (its facts read once, when
        first asked for); ModelError when it is not one."""
        return OpenedModel.open(path, self.model_format)

    def check_layout(self, model: OpenedModel) -> None:
        """StackError when this engine can't load `model`'s tensor layout (of an architecture it names)."""
        arch = model.facts.arch
        if arch in self.refused_architectures:
            raise StackError(
                f"{self.name} can't load {arch} models like {model.name}: {self.refused_architectures[arch]}"
            )

    def check_host(self, stack: StackSpec, cpu: CpuInfo) -> None:
        """StackError when `stack`'s options can't run on a CPU like `cpu` (checked where it runs)."""

    def cuda_origin(self, spec: ImageSpec) -> str:
        """Where a CUDA image gets its CUDA (its `io.moe-stack.cuda-base` label): the base it builds on."""
        return spec.base.cuda

    def check_image_target(self, stack: StackSpec, cpu_target: CpuTarget) -> None:
        """StackError when `stack`'s options can't run in an image built for `cpu_target`."""

    def gpu_use(self, log: str) -> tuple[bool | None, str]:
        """What the engine's log says of the GPU: True and what it placed there, False and why it runs on
        the CPU (a GPU stack that fell back), or None where the log says neither."""
        return None, f"{self.name}'s log is not read for what it places on a GPU"

    def asks_for_groups(self, arch: str, expert_groups: int) -> bool:
        """Whether a stack of this model turns on the engine's grouped routing (StackSpec.grouped_routing):
        its experts are routed within groups the engine applies only when asked."""
        return expert_groups > 1 and arch in self.groups_on_request

    def loaded_facts(self, facts: ModelFacts, mtp: bool | None) -> ModelFacts:
        """The model as this engine loads it (`mtp`: multi-token-prediction drafting asked for): all of it."""
        return facts

    def loaded_model(self, model: OpenedModel, mtp: bool | None) -> ModelFacts:
        """`loaded_facts` of the model's facts."""
        return self.loaded_facts(model.facts, mtp)

    def cache_layout(self, mla: int | None, swa_full: bool = False) -> CacheLayout:
        """What the KV cache holds with this `mla` setting (a DeepSeek model's compressed latent, or each
        head's K and V) and `swa_full` (sliding-window layers at the full context); an engine whose cache
        is not read counts every layer at the full context and any indexer keys: an upper bound."""
        return CacheLayout(latent=bool(mla))

    def pins_cpu_weights(self, mmap: bool | None, gpu: bool) -> bool:
        """Whether the weights left on the CPU sit in pinned (page-locked) host memory rather than the
        file's page cache: pinned memory can't be swapped, reclaimed or shared between processes."""
        return False

    def server_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """The server's arguments for a stack (the image's entrypoint supplies the program): its own,
        then the stack's extra arguments. Every option the stack sets must be one this engine honours.

        `flags` is the image's flag contract; None means unknown, and the adapter then writes this
        engine's current syntax. Options this engine can't honour raise StackError.
        """
        unread = [
            name
            for name in ENGINE_OPTIONS
            if name not in self.honours and getattr(stack, name) != type(stack).model_fields[name].default
        ]
        if unread:
            reasons = dict(self.unread_reasons)
            why = "".join(
                f"; {reason}" for reason in dict.fromkeys(reasons[n] for n in unread if n in reasons)
            )
            raise StackError(
                f"{self.name} does not read {', '.join(ENGINE_OPTIONS[name] for name in unread)}: drop "
                f"{'it' if len(unread) == 1 else 'them'}{why}"
            )
        return self.arguments(stack, flags) + list(stack.extra_args)

    @abstractmethod
    def arguments(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """The arguments the adapter writes for `stack`'s options (server_args adds the extra ones)."""


# Every engine's adapter by name: the package (builder/engines/__init__.py) fills it as it loads them.
ADAPTERS: dict[str, Engine] = {}


def _adapter(value: object) -> object:
    """A name read at an edge (an option, a file, a label) as its adapter; an adapter as itself. An
    unknown name is a ValueError, which pydantic reports against the field that held it."""
    if not isinstance(value, str):
        return value
    if value not in ADAPTERS:
        raise ValueError(f"unknown engine {value!r}: choose one of {', '.join(ADAPTERS)}")
    return ADAPTERS[value]


# A model field holding an engine's adapter: validated from its name, written as its name (the specs
# below and a stack's options hold one).
EngineField = Annotated[Engine, BeforeValidator(_adapter), PlainSerializer(lambda e: e.name, return_type=str)]


# A stack that keeps its prompts and unloads when idle saves its slots after this share of the idle
# unload without a request (a quarter: the save then always comes before the server's own timer runs out,
# which the save restarts), and takes an idle unload of at least this many seconds (the helper looks
# once a second).
QUIET_SHARE = 4
MIN_IDLE_WITH_PROMPTS = 4


class ImageSpec(Strict):
    """One image: engine × source × CUDA target × CPU target, on given base images."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    engine: EngineField
    source: EngineSource
    cpu: CpuTarget
    cuda: CudaTarget = NO_CUDA
    base: BaseImages = DEFAULT_BASES  # None fields: the toolchain's defaults
    registry: str = "ghcr.io"
    namespace: str = "moe-stack"
    # The tools image: the server image plus the engine's benchmark, quantize and GGUF tools, built
    # from the same build stage (same -march, same ISA guard) and published as `<slug>-tools`.
    tools: bool = False

    @property
    def ref(self) -> str:
        return self.source.ref


class EngineChoice(Strict):
    """The engine a request names, declared once: compose's command line, the options of one model and
    the spec hold it (the command line gives its name, the spec writes it)."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    engine: EngineField = option("llama.cpp", "--engine", "-e", help="the engine", validate_default=True)


class StackSpec(EngineChoice, NeutralOptions, ServedOptions, ContainerOptions, EnginePlacement):
    """A compose stack serving one GGUF model from one image: the request's groups as given (the neutral
    options, the server's and the container's, declared once in spec.py and request.py), what the stack
    decided for the engine (EnginePlacement), and the rest decided here."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    project_name: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")
    image_ref: str
    model: OpenedModel  # a path given here is taken as the engine's format names it, unread
    # Host placement: numactl policy applied by the image's entrypoint, the CPUs the container may
    # use (physical cores of the chosen NUMA nodes, cpuset syntax), GPU passthrough.
    numa_policy: NumaPolicy = "none"
    bind_nodes: tuple[int, ...] = ()  # for membind/cpunodebind
    # NUMA nodes the stack's CPUs span: KTransformers runs one CPU thread pool per node.
    numa_node_count: int = Field(default=1, ge=1)
    cpuset: str | None = Field(default=None, pattern=r"^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$")
    gpu_ids: tuple[int, ...] = ()  # the GPUs the container gets, by device index (empty: all)
    # VRAM the placement leaves free on each GPU: the plan's (--fit-vram-gb) or the engine's own fit.
    vram_margin_mib: int = Field(default=1024, ge=0)
    # The model's attention keeps a sliding window in some layers (its GGUF's attention.sliding_window):
    # read where it matters, for --keep-prompts.
    sliding_window: bool = False
    # The model routes its experts within groups that this engine applies only when asked
    # (Engine.groups_on_request): the stack asks, so the model routes as it was trained.
    grouped_routing: bool = False
    # No preset named: what the options were derived from and what they set (x-moe-stack.derived).
    derived: str | None = None
    start_period_s: int = Field(default=120, ge=5)

    @property
    def prompts_saved_after_s(self) -> int | None:
        """A stack that keeps its prompts and unloads when idle: the seconds without a request after which
        the image's helper saves the slots, before the server sleeps and frees them (None: saved when the
        container stops only)."""
        if not self.keep_prompts or self.idle_unload is None:
            return None
        return max(1, self.idle_unload // QUIET_SHARE)

    @property
    def server_sleep_s(self) -> int | None:
        """The server's own idle timer (`--sleep-idle-seconds`): the save restarts it, so it runs for what
        is left of the idle unload after the save, and the server still sleeps `idle_unload` after the last
        request."""
        if self.idle_unload is None:
            return None
        return self.idle_unload - (self.prompts_saved_after_s or 0)

    @property
    def swa_full(self) -> bool:
        """Whether a sliding-window model's cache keeps every layer at the full context on mainline."""
        return keeps_whole_window(self.keep_prompts, self.extra_args)

    def kv_bytes(self) -> int:
        """The KV cache (and recurrent state) the stack's engine keeps for its model as it loads it, at the
        stack's context, cache types, slots and micro-batch."""
        return kv_cache_bytes(
            self.engine.loaded_model(self.model, self.mtp),
            self.ctx_size,
            self.cache_type or "f16",
            self.engine.cache_layout(self.mla, self.swa_full),
            self.parallel,
            self.cache_type_v,
            self.ubatch_size or DEFAULT_UBATCH,
        )

    def with_options(self, options: EngineOptions) -> StackSpec:
        """This stack with `options` as its engine options (validated again as a whole)."""
        return StackSpec.model_validate(self.model_dump() | options.model_dump())

    @model_validator(mode="after")
    def _consistent(self) -> StackSpec:
        if self.mmap is False and self.hugetlbfs != "off":
            raise ValueError(
                "--no-mmap reads the model into the engine's memory, so a hugetlbfs copy (which backs the "
                "mmap) would go unused: drop --hugetlbfs, or give --mmap"
            )
        if self.numa_policy in ("membind", "cpunodebind") and not self.bind_nodes:
            raise ValueError(
                f"numa policy {self.numa_policy} needs the nodes to bind to, e.g. --numa-nodes 0"
            )
        if (self.gpu_ids or self.tensor_split or self.engine_fit) and self.gpu == "none":
            raise ValueError(
                "--gpus, a multi-GPU plan and --placement fit need a GPU: give --gpu nvidia or cdi"
            )
        if self.tensor_split and self.gpu_ids and len(self.tensor_split) != len(self.gpu_ids):
            raise ValueError(
                f"the plan is for {len(self.tensor_split)} GPUs and --gpus names {len(self.gpu_ids)}: "
                "give one --fit-vram-gb size per GPU"
            )
        if self.engine_fit and (self.override_tensors or self.gpu_layers is not None):
            raise ValueError(
                "--placement fit leaves -ngl and -ot to the engine: drop --override-tensor, "
                "--experts-on-cpu, --fit-vram-gb and --gpu-layers"
            )
        if (
            self.batch_size is not None
            and self.ubatch_size is not None
            and self.ubatch_size > self.batch_size
        ):
            raise ValueError(
                f"ubatch_size {self.ubatch_size} is larger than batch_size {self.batch_size}: a physical "
                "batch is part of a logical one; raise --batch-size or lower --ubatch-size"
            )
        if self.keep_prompts and self.idle_unload is not None and self.idle_unload < MIN_IDLE_WITH_PROMPTS:
            raise ValueError(
                f"--idle-unload {self.idle_unload}s leaves no time to save the prompt cache before the "
                f"server sleeps: give at least {MIN_IDLE_WITH_PROMPTS}s, or drop --keep-prompts"
            )
        if self.hugepages and self.hugetlbfs != "off":
            raise ValueError(
                "--hugepages (the engine maps hugepages itself) and --hugetlbfs (the model is copied "
                "onto a hugetlbfs volume) are two ways to the same pool: pick one"
            )
        return self

    @field_validator("model", mode="before")
    @classmethod
    def _opened(cls, model: object, info: ValidationInfo) -> object:
        engine = info.data.get("engine")
        if isinstance(model, str | Path) and isinstance(engine, Engine):
            return OpenedModel(Path(model), engine.model_format)
        return model


def keeps_whole_window(keep_prompts: bool, extra_args: tuple[str, ...]) -> bool:
    """Whether mainline caches sliding-window layers at the full context (--swa-full): a kept prompt cache
    needs it to restore such a model's slots (the adapter then gives it), or the user gave it."""
    return keep_prompts or "--swa-full" in extra_args
