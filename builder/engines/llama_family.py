"""The llama.cpp family (mainline and ik_llama.cpp): one cmake-built `llama-server` binary."""

from __future__ import annotations

import re
import shlex
from abc import abstractmethod
from pathlib import Path

from builder.contract import (
    CHAT_PAGE_CONTEXT,
    ENGINE_BIN_DIR,
    MODEL_DIR,
    PROMPTS_DIR,
    TOOLS_LABEL,
)
from builder.engines.base import (
    CUDA_STUB_DIR,
    CUDA_STUB_SETUP,
    LISTEN,
    Engine,
    ImageSpec,
    PromptStore,
    StackSpec,
)
from builder.engines.reasoning import TEMPLATE_KWARGS, reasoning_args
from builder.engines.tune_space import (
    LOAD_MODE,
    Dimension,
    draft_max_dimension,
    has_switch,
    load_mode_dimension,
    setting_numa,
    setting_ubatch,
    setting_value,
    speculates,
    switch_dimension,
    thread_counts,
    ubatch_sizes,
    value_of,
)
from builder.errors import StackError
from builder.platform.clone import clone_commands
from builder.platform.flags import (
    check_choice,
    flag_args,
    has_choices,
    has_flag,
    required_flag,
    takes_value,
)
from builder.platform.targets import GGML_X86_FEATURES
from builder.platform.toolchain import Toolchain
from builder.spec import CpuTarget, CudaTarget

# What gguf-py (the engine tree's Python GGUF reader/writer) imports, as the distribution packages them.
# The build context's compile cache files (dockerfiles/llama-cpp-family): ccache's settings, installed at
# CCACHE_CONFIG and named by CCACHE_CONFIGPATH (so ccache reads no ccache.conf from the cache directory),
# and the script that copies only ccache's objects into and out of the cache mount (images/ccache_carry.py).
SLOT_SAVE_FLAG = "--slot-save-path"  # both servers' slot files: POST /slots/ID?action=save|restore
CCACHE_CONFIG_FILE = "ccache.conf"
CCACHE_CONFIG = "/etc/moe-stack-ccache.conf"
CCACHE_OBJECTS_SCRIPT = "ccache-objects.sh"
GGUF_PY_PACKAGES = ("python3", "python3-numpy", "python3-yaml", "python3-tqdm", "python3-requests")


# The loader's lines (both engines; seen on the H200 in bench/results): `offloaded 9/9 layers to GPU`,
# mainline's `CUDA0 model buffer size =  1565.18 MiB`, ik's `CUDA0 buffer size =   161.89 MiB` (the
# weights; not the KV or compute buffers). A restarted engine logs them again: the last ones count.
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_GPU_BUFFER = re.compile(r"\b(CUDA\d+) (?:model )?buffer size =\s*([\d.]+) MiB")
# common's argument parsing, at every verbosity, when a GPU build finds no GPU (and a CPU build always).
_NO_GPU = "no usable GPU found"


class LlamaFamilyEngine(Engine):
    """An inference engine built with cmake into a single `llama-server`-style binary."""

    template = "llama-cpp-family/Dockerfile.j2"
    carries_ccache = True
    mirrored = True
    server_label = "llama-server"
    server_target: str = "llama-server"
    jinja_by_default: bool = (
        False  # whether its server renders chat with the Jinja template unless told not to
    )
    load_mode_syntax: bool = False  # whether its current syntax is `--load-mode` (else --no-mmap / --mlock)
    # Whether its current syntax has mainline's --reasoning and --reasoning-effort (else the budget switches
    # thinking, and the template's kwargs carry the effort: engines/reasoning.py).
    reasoning_flags: bool = False
    # A user's extra --chat-template-kwargs adds its keys to the stack's (both engines merge them).
    merged_flags = frozenset({TEMPLATE_KWARGS})
    # Its host prompt cache when the stack doesn't size one (-cram's default at both pinned refs, MiB).
    prompt_cache_default_mib: int = 8192
    # The KV cache types its -ctk/-ctv take at the pinned ref (mainline's: its --help's "allowed values").
    cache_types: frozenset[str] = frozenset(
        {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"}
    )
    needs_build_info_shim: bool = False
    # Whether its CMake always compiles CUDA with -lineinfo, which a CUDA build takes out
    # (dockerfiles/llama-cpp-family/cuda-no-lineinfo.sh says why).
    drops_cuda_lineinfo: bool = False
    metrics_flag = "--metrics"
    tool_calls_flag = "--jinja"  # chat rendered with the model's own template, which tool calls need
    # --keep-prompts: each slot's file (--slot-save-path), at most the KV cache, saved and restored by the
    # image's moe-stack-prompts through the server's /slots actions.
    prompt_store = PromptStore(disk_share=1.0, per_slot=True)
    honours = frozenset({
        "ctx_size", "cpu_threads", "parallel", "override_tensors", "chat_template", "served_name", "jinja",
        "metrics", "gpu_layers", "tensor_split", "engine_fit", "cache_type", "cache_type_v", "cache_ram",
        "flash_attention", "temperature", "top_p", "top_k", "min_p", "batch_size", "ubatch_size", "mmap",
        "mlock", "hugetlbfs", "api_key_file", "extra_args", "draft_model", "mtp", "draft_max", "mmproj",
        "thinking", "reasoning_budget", "reasoning_effort", "reasoning_format"
    })  # fmt: skip
    # SGLang's parsers are KTransformers' own; these engines pick theirs from the chat template.
    unread_reasons = (
        (
            "reasoning_parser",
            "the llama.cpp engines parse by the chat template (--reasoning-format says where thoughts go)",
        ),
    )
    # Every flag the adapter writes, with its other spellings in the --help of both (tests/unit/data;
    # test_flags holds the two to it) and the flags that set the same thing under another name.
    flag_spellings = tuple(
        frozenset(names)
        for names in (
            ("-m", "--model"),
            ("--host",),
            ("--port",),
            ("-c", "--ctx-size"),
            ("-t", "--threads"),
            ("-np", "--parallel"),
            ("-ot", "--override-tensor"),
            ("-a", "--alias"),
            ("--metrics",),
            ("--jinja", "--no-jinja"),
            ("--chat-template", "--chat-template-file"),
            ("-ngl", "--gpu-layers", "--n-gpu-layers"),
            ("-ts", "--tensor-split"),
            ("-ctk", "--cache-type-k"),
            ("-ctv", "--cache-type-v"),
            ("-fa", "--flash-attn"),
            ("-fit", "--fit"),
            ("-fitt", "--fit-target", "--fit-margin"),
            ("--temp", "--temperature"),
            ("--top-p",),
            ("--top-k",),
            ("--min-p",),
            ("-b", "--batch-size"),
            ("-ub", "--ubatch-size"),
            ("-cram", "--cache-ram"),
            ("-lm", "--load-mode", "--no-mmap", "--mmap", "--mlock"),
            ("--api-key", "--api-key-file"),
            (SLOT_SAVE_FLAG,),
            ("-md", "--model-draft", "--spec-draft-model"),
            ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl"),
            ("--draft-max", "--draft", "--draft-n", "--spec-draft-n-max"),
            ("--spec-type",),
            ("-mm", "--mmproj"),
            ("--reasoning-budget",),
            ("--reasoning-format",),
            (TEMPLATE_KWARGS,),
        )
    )
    # The neutral sampling and batch options, and the flag each is written as.
    option_flags = (
        ("temperature", "--temp"),
        ("top_p", "--top-p"),
        ("top_k", "--top-k"),
        ("min_p", "--min-p"),
        ("batch_size", "--batch-size"),
        ("ubatch_size", "--ubatch-size"),
        ("cache_ram", "--cache-ram"),
    )
    model_flags = ("-m", "--model")
    # Sources of the server's argument parser, scanned for flag literals when --help is incomplete.
    parser_sources: tuple[str, ...] = ()
    # How its llama-bench joins several -ot rules of one run into one argument.
    bench_rule_separator: str = ";"
    # Its benchmark over the context's depth (PP and TG per window), if it has one.
    sweep_tool: str | None = None

    def gpu_use(self, log: str) -> tuple[bool | None, str]:
        if _NO_GPU in log:
            return False, f"its log says {_NO_GPU!r}"
        offloaded = _OFFLOADED.findall(log)
        buffers = {device: float(mib) for device, mib in _GPU_BUFFER.findall(log)}
        if offloaded or buffers:
            layers = int(offloaded[-1][0]) if offloaded else 0
            placed = [f"offloaded {offloaded[-1][0]}/{offloaded[-1][1]} layers"] if offloaded else []
            placed += [f"{device} weights {mib:.0f} MiB" for device, mib in buffers.items()]
            seen = ", ".join(placed)
            return bool(layers or any(buffers.values())), seen
        return None, "its log names no offload (mainline logs its buffers from -lv 4)"

    @property
    def source_hint(self) -> str:  # type: ignore[override]
        return f"pypi:{self.sdist}"

    # -- build --------------------------------------------------------------------------------
    def cmake_args(self, cpu: CpuTarget, cuda: CudaTarget, ref: str, compiler_args: list[str]) -> list[str]:
        """Configure arguments for a host-independent build of the server (and, with runtime
        dispatch, of every CPU variant it can load)."""
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            *compiler_args,
            # The build host is not the run host: never -march=native (in ik_llama.cpp it would
            # even be appended after, and so override, the targeted -march).
            "-DGGML_NATIVE=OFF",
        ]
        if cpu.runtime_dispatch:
            # Each CPU variant is a libggml-cpu-*.so next to the binary, found through $ORIGIN.
            args += [
                "-DGGML_BACKEND_DL=ON",
                "-DGGML_CPU_ALL_VARIANTS=ON",
                "-DBUILD_SHARED_LIBS=ON",
                "-DCMAKE_BUILD_WITH_INSTALL_RPATH=ON",
                "-DCMAKE_INSTALL_RPATH=$ORIGIN",
            ]
        else:
            features = set(cpu.ggml_features)
            args += [
                f"-DCMAKE_C_FLAGS=-march={cpu.march}",
                f"-DCMAKE_CXX_FLAGS=-march={cpu.march}",
                *(f"-D{flag}={'ON' if flag in features else 'OFF'}" for flag in GGML_X86_FEATURES),
                # One self-contained binary: the runtime stage copies a single file.
                "-DBUILD_SHARED_LIBS=OFF",
            ]
        if cuda.version is not None:
            # Machine code (SASS) for exactly these archs, no PTX: `pull` and doctor match an image to
            # a GPU by these archs, so PTX (JIT-compiled for a newer GPU at first start) is never
            # what runs; a bare "90" would embed both (CMAKE_CUDA_ARCHITECTURES).
            archs = ";".join(f"{a}-real" for a in cuda.archs)
            # libcuda.so.1 comes from the driver at run time; link against the toolkit's stub.
            args += [
                "-DGGML_CUDA=ON",
                f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
                "-DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined",
            ]
        args += [
            "-DLLAMA_CURL=OFF",
            "-DCMAKE_C_COMPILER_LAUNCHER=ccache",
            "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache",
        ]
        if cuda.version is not None:
            args.append("-DCMAKE_CUDA_COMPILER_LAUNCHER=ccache")
        return args + self.extra_cmake_args(ref)

    def help_command(self, cuda: CudaTarget) -> str:
        """Shell command printing the built server's --help (the flag contract's source)."""
        prefix = f"LD_LIBRARY_PATH={CUDA_STUB_DIR} " if cuda.version is not None else ""
        return f"{prefix}/build/bin/{self.server_target} --help"

    def parser_literals_command(self) -> str | None:
        """Shell command listing the flag literals of the argument parser (None: --help is complete)."""
        if not self.parser_sources:
            return None
        files = " ".join(f"/src/{path}" for path in self.parser_sources)
        return f"grep -ohE '\"--?[A-Za-z][A-Za-z0-9_.-]*\"' {files} | tr -d '\"' | sort -u"

    def architectures_command(self) -> str:
        """Shell command listing the GGUF architecture names the tree's llama-arch.cpp maps
        (`{ LLM_ARCH_X, "x" }`):
        which models the built server can load."""
        return (
            "grep -ohE '\\{ *LLM_ARCH_[A-Z0-9_]+, *\"[A-Za-z0-9._-]+\" *\\}' /src/src/llama-arch.cpp "
            "| grep -oE '\"[^\"]+\"' | tr -d '\"' | sort -u"
        )

    def help_setup(self, cuda: CudaTarget) -> list[str]:
        """Commands run before `help_command` (a CUDA build's libcuda stub)."""
        return list(CUDA_STUB_SETUP) if cuda.version is not None else []

    @abstractmethod
    def extra_cmake_args(self, ref: str) -> list[str]:
        """Engine-specific configure arguments."""

    def configure_args(self, spec: ImageSpec, tools: Toolchain) -> list[str]:
        """The cmake configure arguments for `spec`, compiler choice included."""
        return self.cmake_args(spec.cpu, spec.cuda, spec.ref, tools.compiler_args(spec.cuda))

    def template_values(self, spec: ImageSpec, tools: Toolchain) -> dict[str, object]:
        return {
            "clone_commands": clone_commands(self.source_url(spec), spec.ref),
            "cmake_args": [shlex.quote(arg) for arg in self.configure_args(spec, tools)],
            "help_command": self.help_command(spec.cuda),
            "help_setup": self.help_setup(spec.cuda),
            "parser_literals_command": self.parser_literals_command(),
            "architectures_command": self.architectures_command(),
            "server_target": self.server_target,
            "engine_bin": self.server_path(spec),
            "build_info_shim": self.needs_build_info_shim,
            "cuda_no_lineinfo": self.drops_cuda_lineinfo and spec.cuda.version is not None,
            "tool_targets": list(self.tool_targets),
            "chat_page_context": CHAT_PAGE_CONTEXT if self.chat_page_dir else None,
            "chat_page_dir": self.chat_page_dir,
            "gguf_py_packages": list(GGUF_PY_PACKAGES),
            "tools_label": TOOLS_LABEL,
            "ccache_config": CCACHE_CONFIG,
        }

    def context_files(self, root: Path, spec: ImageSpec) -> dict[str, str]:
        files = {
            name: (root / "common" / name).read_text()
            for name in ("moe-stack-hugecopy.c", "moe-stack-bandwidth.c", "moe-stack-prompts")
        }
        for name in (CCACHE_CONFIG_FILE, CCACHE_OBJECTS_SCRIPT):  # the compile cache's settings, its carrier
            files[name] = (root / "llama-cpp-family" / name).read_text()
        if self.needs_build_info_shim:
            files["build-info.sh"] = (root / "llama-cpp-family/build-info.sh").read_text()
        if self.drops_cuda_lineinfo and spec.cuda.version is not None:
            files["cuda-no-lineinfo.sh"] = (root / "llama-cpp-family/cuda-no-lineinfo.sh").read_text()
        return files

    def server_path(self, spec: ImageSpec) -> str:
        return f"{ENGINE_BIN_DIR}/{self.server_target}"

    def required_flags(self, cuda: CudaTarget) -> frozenset[str]:
        return frozenset({"--model", "--host", "--port"})

    # -- run ----------------------------------------------------------------------------------
    def arguments(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """`llama-server` arguments for a stack's options."""
        settings = {
            "--model": f"{MODEL_DIR}/{stack.model.name}",
            **LISTEN,
            "--ctx-size": str(stack.ctx_size),
            "--threads": str(stack.cpu_threads),
            "--parallel": str(stack.parallel),
        }
        args = flag_args(settings)
        for rule in stack.override_tensors:
            args += ["--override-tensor", rule]
        # On by default, so written where this build has them (an older build just goes without).
        if stack.served_name is not None and has_flag(flags, "--alias"):
            args += ["--alias", stack.served_name]
        if stack.metrics and has_flag(flags, "--metrics"):
            args.append("--metrics")
        if stack.chat_template and not is_jinja(stack.chat_template):
            # A built-in template's name is read by the non-Jinja path only: with Jinja on, the name
            # itself would be the template (every prompt rendered as the word "gemma").
            args += ["--chat-template", stack.chat_template]
            if (flags is None and self.jinja_by_default) or (flags is not None and "--no-jinja" in flags):
                args.append("--no-jinja")
        else:
            if stack.chat_template:  # a Jinja template's text: the Jinja path renders it
                args += ["--chat-template", stack.chat_template]
            if stack.jinja and has_flag(flags, "--jinja"):
                args.append("--jinja")
        if stack.engine_fit:
            args += self.fit_args(stack.vram_margin_mib, flags)
        if stack.gpu_layers is not None:
            args += ["--n-gpu-layers", str(stack.gpu_layers)]
        if stack.tensor_split:
            if not has_flag(flags, "--tensor-split"):
                raise StackError(f"this {self.name} build has no --tensor-split; plan for one GPU")
            args += ["--tensor-split", ",".join(map(str, stack.tensor_split))]
        args += self.cache_type_args(stack.cache_type, stack.cache_type_v, flags)
        check_v_cache_attention(stack.cache_type_v or stack.cache_type, stack.flash_attention)
        if stack.flash_attention is not None:
            args += self.flash_attention_args(stack.flash_attention, flags)
        args += self.own_args(stack, flags)
        args += self.speculative_args(stack, flags)
        args += self.projector_args(stack, flags)
        args += reasoning_args(self, stack, flags)
        for field, flag in self.option_flags:
            value = getattr(stack, field)
            if value is not None:
                spelled = required_flag(flags, flag, self.name, f"--{field.replace('_', '-')}")
                args += [spelled, f"{value:g}" if isinstance(value, float) else str(value)]
        args += self.load_args(stack.mmap, stack.mlock, flags)
        if stack.api_key_file is not None:
            args += self.key_args()
        if stack.keep_prompts:
            args += [required_flag(flags, SLOT_SAVE_FLAG, self.name, "--keep-prompts"), f"{PROMPTS_DIR}/"]
        return args

    def renders_jinja(self, stack: StackSpec) -> bool:
        """Whether the server renders chat with a Jinja template (a built-in template's name turns it off:
        `arguments`)."""
        return stack.jinja and not (stack.chat_template and not is_jinja(stack.chat_template))

    # -- tune ---------------------------------------------------------------------------------
    def tune_dimensions(self, args: list[str], numa_nodes: int, gpu: bool) -> list[Dimension]:
        """What `moe-stack tune` varies for a stack running `args`, in the order it searches them (a short
        budget drops the last): threads and -ub, the engine's own, then mmap and the NUMA policy."""
        threads = value_of(args, ("-t", "--threads"))
        dimensions = []
        if threads is not None and threads.isdigit():
            dimensions.append(
                Dimension("threads", thread_counts(int(threads)), setting_value(("--threads", "-t")))
            )
        dimensions.append(
            Dimension(
                "ubatch",
                ubatch_sizes(value_of(args, ("-ub", "--ubatch-size")), gpu),
                setting_ubatch,
                affects="prefill",
            )
        )
        dimensions += self.engine_dimensions(args, gpu)
        if speculates(args):
            dimensions.append(self.draft_length_dimension(args))
        dimensions.append(self.mmap_dimension(args))
        if numa_nodes > 1:
            dimensions.append(Dimension("numa", ("interleave", "none", "membind:0"), setting_numa))
        return dimensions

    def engine_dimensions(self, args: list[str], gpu: bool) -> list[Dimension]:
        """This engine's own settings to search (mainline: none beyond the common ones)."""
        return []

    def mmap_dimension(self, args: list[str]) -> Dimension:
        """Mapped weights or read into the engine's memory ("no-mmap" on), in the syntax the stack's
        command already uses, else this engine's current one."""
        if has_switch(args, ("--no-mmap",)) or not (self.load_mode_syntax or value_of(args, LOAD_MODE)):
            return switch_dimension("no-mmap", args, ("--no-mmap",))
        return load_mode_dimension("no-mmap", args)

    def load_args(self, mmap: bool | None, mlock: bool, flags: dict[str, str] | None) -> list[str]:
        """How the weights are loaded: mapped (the default) or read into the engine's memory, locked or not.
        Mainline folded `--no-mmap` and `--mlock` into one `-lm/--load-mode none|mlock|mmap+mlock`
        (common/arg.cpp at 0c1e57098; `--no-mmap` is an invalid argument there); older builds and
        ik_llama.cpp keep the two switches."""
        if mmap is not False and not mlock:
            return []
        load_mode = self.load_mode_syntax if flags is None else "--load-mode" in flags
        if load_mode:
            return ["--load-mode", ("mlock" if mmap is False else "mmap+mlock") if mlock else "none"]
        args = []
        for wanted, switch in ((mmap is False, "--no-mmap"), (mlock, "--mlock")):
            if wanted:
                if not has_flag(flags, switch):
                    raise StackError(
                        f"this {self.name} build has neither {switch} nor --load-mode; drop {switch}"
                    )
                args.append(switch)
        return args

    def flash_attention_args(self, mode: str, flags: dict[str, str] | None) -> list[str]:
        """`-fa on|off|auto` where the flag takes a value; older builds had a bare on-switch."""
        if flags is None or takes_value(flags, "-fa"):
            return ["-fa", mode]
        if "-fa" not in flags:
            raise StackError(
                f"this {self.name} build has no flash attention flag (-fa); drop --flash-attention"
            )
        if mode == "auto":
            raise StackError(
                f"this {self.name} build's -fa is an on-switch only; use --flash-attention on or off"
            )
        return ["-fa"] if mode == "on" else []

    def fit_args(self, margin_mib: int, flags: dict[str, str] | None) -> list[str]:
        """`--fit on --fit-target MiB`: the engine sizes -ngl and the expert placement to the devices'
        memory itself, leaving `margin_mib` free on each."""
        self.check_fit(flags)
        return ["--fit", "on", "--fit-target", str(margin_mib)]

    def check_fit(self, flags: dict[str, str] | None) -> None:
        if flags is not None and "--fit" not in flags:
            raise StackError(
                f"this {self.name} build has no --fit placement of its own; use --placement rules "
                "(moe-stack's plan: -ngl and -ot rules)"
            )

    def own_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """The arguments of the options only this engine of the family honours (mainline: none)."""
        return []

    def speculative_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """A draft model (`-md /models/NAME`, every layer on the GPU with a GPU) or the model's MTP layer,
        and the draft length, in this build's spellings."""
        args: list[str] = []
        if stack.draft_model is not None:
            draft = f"{MODEL_DIR}/{stack.draft_model.name}"
            args += [required_flag(flags, "--model-draft", self.name, "--draft-model"), draft]
            args += self.draft_type_args(flags)
            if stack.gpu != "none":
                args += [required_flag(flags, "--n-gpu-layers-draft", self.name, "--draft-model"), "99"]
        if stack.mtp:
            args += self.mtp_args(flags)
        if stack.draft_max is not None:
            args += [self.draft_max_flag(flags), str(stack.draft_max)]
        return args

    def projector_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """The vision projector beside the model (`--mmproj /models/NAME`); with a GPU both engines put it
        there (their --mmproj-offload default), which the plan counts."""
        if stack.mmproj is None:
            return []
        return [required_flag(flags, "--mmproj", self.name, "--mmproj"), f"{MODEL_DIR}/{stack.mmproj.name}"]

    def draft_type_args(self, flags: dict[str, str] | None) -> list[str]:
        """What names a plain draft model's kind, where the engine needs it (ik_llama.cpp: nothing)."""
        return []

    def draft_max_flag(self, flags: dict[str, str] | None) -> str:
        return required_flag(flags, "--draft-max", self.name, "--draft-max")

    def draft_length_dimension(self, args: list[str]) -> Dimension:
        """`tune`'s search over the draft length of a server drafting with `args`."""
        return draft_max_dimension(args, self.draft_max_flag(None))

    def mtp_args(self, flags: dict[str, str] | None) -> list[str]:
        """Drafting with the model's own MTP layer (refused where the engine has none for these models)."""
        raise StackError(f"this {self.name} build drafts with no MTP layer; drop --mtp")

    def cache_type_args(self, k: str | None, v: str | None, flags: dict[str, str] | None) -> list[str]:
        """-ctk/-ctv: K's type (V's too unless `v` differs); a type the image's engine lacks is refused:
        by the choices its --help lists (mainline's `allowed values`), else by the adapter's list."""
        v = v or k
        for flag, given in (("--cache-type-k", k), ("--cache-type-v", v)):
            if given is None:
                continue
            check_choice(flags, flag, given, f"this {self.name} build")
            if not has_choices(flags, flag) and given not in self.cache_types:
                takes = ", ".join(sorted(self.cache_types))
                raise StackError(f"{self.name} has no KV cache type {given}; it takes {takes}")
        return (["--cache-type-k", k] if k else []) + (["--cache-type-v", v] if v else [])


UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})


def check_v_cache_attention(v_type: str | None, flash_attention: str | None) -> None:
    """A quantized V cache needs flash attention: both engines stop at start without it (ik_llama.cpp's
    common.cpp throws "Quantized V cache cannot be used without flash attention", seen on the H200;
    mainline's llama-context.cpp turns `auto` on and fails on `off`)."""
    if flash_attention == "off" and v_type is not None and v_type not in UNQUANTIZED_CACHE_TYPES:
        raise StackError(
            f"--flash-attention off with a {v_type} V cache: the engine refuses to start without flash "
            "attention for a quantized V cache; use --flash-attention on, or --cache-type-v f16"
        )


def is_jinja(template: str) -> bool:
    """Whether a --chat-template value is a Jinja template's text rather than a built-in template's name
    (the engines' own test: a name has no Jinja tags)."""
    return "{%" in template or "{{" in template
