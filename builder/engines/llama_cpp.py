"""Mainline llama.cpp (ggml-org)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from builder.contract import ROUTER_PRESET
from builder.engines.base import LISTEN, StackSpec
from builder.engines.compute_buffers import MAINLINE_BUFFERS
from builder.engines.llama_family import LlamaFamilyEngine
from builder.errors import StackError
from builder.models.kv_cache import CacheLayout
from builder.platform.flags import flag_args, has_flag, looks_like_flag, required_flag, takes_value

if TYPE_CHECKING:
    from builder.models.facts import ModelFacts

# The architectures whose main context caches the NextN (MTP) layer whether it drafts with it or not: no
# layer filter for it (src/llama-model.cpp's memory creation at 0c1e57098; deepseek2's and GLM's have one).
NEXTN_CACHED = frozenset({"bailingmoe3"})


class LlamaCpp(LlamaFamilyEngine):
    name = "llama.cpp"
    slug = "llama-cpp"
    upstream_url = "https://github.com/ggml-org/llama.cpp.git"
    # The PyPI sdist the tests and the demo build: it vendors 0c1e57098 (its CHANGELOG: "update
    # llama.cpp to ggml-org/llama.cpp@0c1e57098"), the pinned ref when this was written (pins.yaml).
    sdist = "llama-cpp-python==0.3.36"
    sdist_subdir = "vendor/llama.cpp"
    sdist_ref = "0c1e57098"
    # It loads one of its libggml-cpu-* variants at run time: the `portable` target exists for it.
    runtime_dispatch = True
    buffer_fits = MAINLINE_BUFFERS
    routes_models = True  # `--models-preset INI`: a router starting one server per model on demand
    # `-fit, --fit [on|off]` (MoE-aware: experts go to the CPU first) at the pinned ref.
    honours = LlamaFamilyEngine.honours | {"idle_unload"}
    # tools/server/server.cpp at the pinned ref routes /v1/chat/completions, /v1/responses, /v1/messages
    # (post_anthropic_messages) and /v1/messages/count_tokens (post_anthropic_count_tokens).
    apis = ("openai-chat", "openai-responses", "anthropic-messages", "anthropic-count-tokens")
    flag_spellings = (
        *LlamaFamilyEngine.flag_spellings,
        frozenset({"--sleep-idle-seconds"}),
        frozenset({"-rea", "--reasoning"}),
        frozenset({"--reasoning-effort"}),
        frozenset({"--swa-full"}),
    )
    # --swa-full is a switch, the same however often given: a user's own (`-- --swa-full`) stays allowed
    # beside the one --keep-prompts writes for a sliding-window model (own_args).
    merged_flags = LlamaFamilyEngine.merged_flags | {"--swa-full"}
    # `--reasoning on|off|auto`, `--reasoning-effort LEVEL`, and a --reasoning-budget that ends thinking
    # after N tokens, at the pinned ref (engines/reasoning.py).
    reasoning_flags = True
    thinking_token_budget = True
    jinja_by_default = True  # `--jinja, --no-jinja ... (default: enabled)` at the pinned ref
    load_mode_syntax = True  # `-lm, --load-mode MODE` replaced --no-mmap and --mlock by the pinned ref
    chat_page_dir = "tools/ui"  # a Svelte app; its CMake embeds tools/ui/dist when it is there
    tool_targets = (
        "llama-bench", "llama-batched-bench", "llama-quantize", "llama-gguf-split", "llama-perplexity",
        "llama-imatrix"
    )  # fmt: skip
    # llama-bench's -ot: `;` joins one run's rules, `,` separates runs to compare (tools/llama-bench).
    bench_rule_separator = ";"

    def own_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """Idle unload: `--sleep-idle-seconds N` (the server frees the model, and loads it again on the
        next request; at the pinned ref, tools/server), less the quiet after which a kept prompt cache is
        saved (`StackSpec.server_sleep_s`). A kept prompt cache of a sliding-window model:
        `--swa-full`, without which a restored slot holds only the window of those layers and the server
        prefills the prompt again (measured: bench/results/prompt-restart-2026-12-03)."""
        args = []
        if stack.keep_prompts and stack.sliding_window and "--swa-full" not in stack.extra_args:
            args.append(required_flag(flags, "--swa-full", self.name, "--keep-prompts"))
        if stack.idle_unload is None:
            return args
        if not has_flag(flags, "--sleep-idle-seconds"):
            raise StackError(
                f"this {self.name} build has no --sleep-idle-seconds; drop --idle-unload, or build the "
                "pinned ref (`moe-stack build --engine llama.cpp`)"
            )
        return [*args, "--sleep-idle-seconds", str(stack.server_sleep_s)]

    def draft_type_args(self, flags: dict[str, str] | None) -> list[str]:
        """`--spec-type draft-simple`: with -md alone the pinned server only drafts if the file names an
        MTP, EAGLE-3 or DFlash kind (common/arg.cpp, common_speculative_types_from_gguf)."""
        return ["--spec-type", self._spec_type(flags, "draft-simple", "--draft-model")]

    def draft_max_flag(self, flags: dict[str, str] | None) -> str:
        """`--spec-draft-n-max`: its --help still lists `--draft-max`, which the pinned server rejects
        ("the argument has been removed"); older builds have only `--draft-max`."""
        if has_flag(flags, "--spec-draft-n-max"):
            return "--spec-draft-n-max"
        return super().draft_max_flag(flags)

    def mtp_args(self, flags: dict[str, str] | None) -> list[str]:
        """`--spec-type draft-mtp`: the model's own NextN layer drafts (DeepSeek-V3/R1 and Qwen3-Next at
        the pinned ref; loaded only when asked for)."""
        return ["--spec-type", self._spec_type(flags, "draft-mtp", "--mtp")]

    def _spec_type(self, flags: dict[str, str] | None, kind: str, option: str) -> str:
        if flags is not None and kind not in flags.get("--spec-type", "").split(","):
            raise StackError(
                f"this {self.name} build has no --spec-type {kind}; drop {option}, or build the pinned ref "
                "(`moe-stack build --engine llama.cpp`)"
            )
        return kind

    def loaded_facts(self, facts: ModelFacts, mtp: bool | None) -> ModelFacts:
        """Without MTP drafting it skips a file's NextN layers (their tensors are created TENSOR_SKIP unless
        the loader loads MTP: src/models/glm4-moe.cpp and the others at the pinned ref); the H200 logged
        GLM-4.6's and GLM-5's slices without them (bench/results/family-buffers-2026-12-04). Ling-3's
        bailingmoe3 filters no layer out of its cache: the skipped MTP layer's latent is cached all the same
        (its tiny file logged 2 cached layers of 1 MLA layer and the MTP block, with or without --mtp)."""
        if mtp:
            return facts
        loaded = facts.without_nextn()
        if facts.arch in NEXTN_CACHED:
            return replace(loaded, attention_layers=facts.cached_layers + facts.nextn_layers)
        return loaded

    def cache_layout(self, mla: int | None, swa_full: bool = False) -> CacheLayout:
        """Always the latent of a DeepSeek model in the form its converter writes (K 576, V a view of it: the
        CPU and CUDA logs show `V (q8_0): 0.00 MiB`; it has no -mla), an indexer's keys beside it
        (llama_kv_cache_dsa), and sliding-window layers to their window unless --swa-full."""
        return CacheLayout(latent=True, windowed=not swa_full)

    def pins_cpu_weights(self, mmap: bool | None, gpu: bool) -> bool:
        """With a GPU and `--load-mode none`, CPU weights are read into CUDA_Host (pinned) buffers; mapped,
        they stay page cache (CPU_Mapped), as its logs on the H200 show."""
        return gpu and mmap is False

    def is_source_tree(self, path: Path) -> bool:
        has_server = (path / "tools/server").is_dir() or (path / "examples/server").is_dir()
        return (
            (path / "CMakeLists.txt").is_file()
            and (path / "ggml").is_dir()
            and has_server
            and not (path / "ggml/src/iqk").is_dir()
        )

    def extra_cmake_args(self, ref: str) -> list[str]:
        return [
            # The chat page is the one built from the tree (the chat-page context), never a download.
            "-DLLAMA_USE_PREBUILT_UI=OFF",
            "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_TOOLS=ON",
            "-DLLAMA_BUILD_SERVER=ON",
            # Models are mounted, never downloaded by the server: no TLS stack in the image.
            "-DLLAMA_OPENSSL=OFF",
            # Build info from the pinned ref when the tree has no .git (sdists, tarballs).
            f"-DLLAMA_BUILD_COMMIT={ref}",
        ]

    def router_command(
        self, stack: StackSpec, models: tuple[StackSpec, ...], flags: dict[str, str] | None
    ) -> tuple[list[str], str]:
        """The router: one port, one model loaded at a time (each is most of the RAM), unloaded after
        `--sleep-idle-seconds` when asked; each model's own arguments as a section of its preset file,
        named by the model's served name (the router's model id)."""
        for flag in ("--models-preset", "--models-max"):
            if flags is not None and flag not in flags:
                raise StackError(
                    f"this {self.name} build has no router mode ({flag}); use one stack per model"
                )
        command = flag_args({"--models-preset": ROUTER_PRESET, "--models-max": "1", **LISTEN})
        if stack.api_key_file is not None:
            command += self.key_args()
        sections = ["version = 1", ""]
        for model in models:
            if model.served_name is None:
                raise StackError(f"the model {model.model.name} needs a served name to be routed to")
            lines = [f"[{model.served_name}]", *_ini_lines(self.server_args(model, flags), flags)]
            hostile = next((line for line in lines if any(ord(c) < 32 or ord(c) == 127 for c in line)), None)
            if hostile is not None:  # a newline would start another key or section of the preset
                raise StackError(
                    f"the router's preset can't hold {hostile!r}: a control character in a served name, "
                    "file name or flag value; remove it"
                )
            sections += [*lines, ""]
        return command, "\n".join(sections)


# The router decides these for every model it starts (its own address, port, key and the model's id).
_ROUTER_OWNS = frozenset({"--host", "--port", "--api-key-file", "--alias"})


def _ini_lines(args: list[str], flags: dict[str, str] | None) -> list[str]:
    """`--flag value` pairs as `flag = value` lines (a switch: `flag = true`; repeated -ot rules joined
    by commas, as -ot itself takes them)."""
    values: dict[str, list[str]] = {}
    at = 0
    while at < len(args):
        flag = args[at]
        takes = (
            takes_value(flags, flag)
            if flags is not None
            else at + 1 < len(args) and not looks_like_flag(args[at + 1])  # `--reasoning-budget -1`
        )
        value = args[at + 1] if takes else "true"
        at += 2 if takes else 1
        if flag not in _ROUTER_OWNS:
            values.setdefault(flag.lstrip("-"), []).append(value)
    return [f"{key} = {','.join(items)}" for key, items in values.items()]
