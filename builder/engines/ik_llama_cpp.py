"""ik_llama.cpp (ikawrakow): -ot expert offload, MLA, fused MoE, IQK kernels."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import MappingProxyType

from builder.engines.base import StackSpec
from builder.engines.compute_buffers import IK_BUFFERS
from builder.engines.llama_family import LlamaFamilyEngine
from builder.engines.tune_space import (
    Dimension,
    has_switch,
    setting_value,
    stage_length_dimension,
    switch_dimension,
    value_of,
)
from builder.errors import StackError
from builder.models.facts import ModelFacts
from builder.models.kv_cache import CacheLayout
from builder.models.opened import OpenedModel
from builder.platform.flags import required_flag, takes_stages

# The architectures whose NextN (MTP) tensors its loader knows, and skips unless -mtp
# (llama-load-tensors.cpp at 8337e4c: bailingmoe3's and qwen35moe's came with the bump from 007d640).
NEXTN_ARCHITECTURES = frozenset({"glm4moe", "glm-dsa", "bailingmoe2", "bailingmoe3", "qwen35moe"})


class IkLlamaCpp(LlamaFamilyEngine):
    name = "ik_llama.cpp"
    slug = "ik-llama-cpp"
    upstream_url = "https://github.com/ikawrakow/ik_llama.cpp.git"
    sdist = "ik-llama-cpp-python==0.1.5"
    sdist_subdir = "vendor/ik_llama.cpp"
    # The commit that sdist vendors (it doesn't say: found by content, dockerfiles/pins.yaml): the ref a
    # build from it carries. The pin is newer and comes from the source mirror (builder/images/mirror.py).
    sdist_ref = "55d3c05bf7b377deaa5dc84d255d9740a345a206"
    # Its sdists lack common/cmake/build-info-gen-cpp.cmake, and its mirror's tarball has no .git for the
    # script to read: the build writes build-info.cpp from the pinned ref itself.
    needs_build_info_shim = True
    # Its CMake adds -lineinfo to every CUDA compile: half its server's sm_90 device code (194 MB).
    drops_cuda_lineinfo = True
    # MiniMax-M3's GGUFs come from mainline's converter (ik's has no MiniMax-M3) with the sparse-attention
    # indexer, whose tensors its create_minimaxm3_tensors (8337e4c) makes none of: the tiny model's load
    # stopped at `wrong number of tensors; expected 54, got 46`.
    refused_architectures = MappingProxyType(
        {
            "minimax-m3": "its tree (8337e4c) runs MiniMax-M3's attention densely and loads none of the "
            "indexer tensors such a file has; serve it with mainline llama.cpp"
        }
    )
    # Its --help omits accepted flags (-ot, -thp, -cmoe...): the contract adds the parser's literals.
    parser_sources = ("common/common.cpp",)
    # Its own llama-sweep-bench (PP and TG speed over the whole context) beside mainline's tools.
    tool_targets = (
        "llama-bench", "llama-sweep-bench", "llama-batched-bench", "llama-quantize", "llama-gguf-split",
        "llama-perplexity", "llama-imatrix"
    )  # fmt: skip
    sweep_tool = "llama-sweep-bench"
    # Its CUDA compile took 69 min for one arch (cuda-images-2026-11-30, sharing the cores with the
    # test suite): 3.2x mainline's, taken for its CPU compile too.
    buffer_fits = IK_BUFFERS
    compile_minutes_cpu = 12.8
    cuda_compile_factor = 3.2
    # Its llama-bench's -ot: `,` joins one run's rules (parse_buft_overrides in examples/llama-bench).
    bench_rule_separator = ","
    honours = LlamaFamilyEngine.honours | {
        "fused_moe", "mla", "moe_offload_batch", "hugepages", "split_mode_graph"
    }  # fmt: skip
    # Ling's bailingmoe2 routes a token's experts within groups (mainline always does); ik_llama.cpp picks
    # a plain top-k of all experts unless -ger (src/llama-build-context.cpp at the pin; with 0 groups it
    # dies of SIGFPE, so a model without groups never gets it).
    groups_on_request = frozenset({"bailingmoe2"})
    # examples/server/server.cpp at the pinned ref routes /v1/chat/completions, /v1/responses
    # (handle_responses), /v1/messages (handle_anthropic_messages, converted to a chat request) and
    # /v1/messages/count_tokens (handle_anthropic_count_tokens).
    apis = ("openai-chat", "openai-responses", "anthropic-messages", "anthropic-count-tokens")
    flag_spellings = LlamaFamilyEngine.flag_spellings + tuple(
        frozenset(names)
        for names in (
            ("-mla", "--mla-use"),
            ("-fmoe", "--fused-moe", "-no-fmoe", "--no-fused-moe"),
            ("-cuda", "--cuda-params"),
            ("-thp", "--transparent-huge-pages"),
            ("-ger", "--grouped-expert-routing"),
            ("-sm", "--split-mode"),
            ("-smgs", "--split-mode-graph-scheduling"),
        )
    )

    def is_source_tree(self, path: Path) -> bool:
        return (
            (path / "CMakeLists.txt").is_file()
            and (path / "ggml/src/iqk").is_dir()
            and (path / "examples/server").is_dir()
        )

    # Its common.cpp's kv_cache_type_from_str at the pinned ref: mainline's and q6_0, q8_KV.
    cache_types = LlamaFamilyEngine.cache_types | {"q6_0", "q8_KV"}

    def extra_cmake_args(self, ref: str) -> list[str]:
        return [
            "-DLLAMA_BUILD_TESTS=OFF",
            # The server lives under examples/ here, so examples must be configured.
            "-DLLAMA_BUILD_EXAMPLES=ON",
            "-DLLAMA_BUILD_SERVER=ON",
        ]

    def fit_args(self, margin_mib: int, flags: dict[str, str] | None) -> list[str]:
        """Every layer on the GPU (it offloads none by default) and `--fit`, a switch here, which then moves
        routed experts to the CPU from the last layer until the model fits with `--fit-margin` MiB free
        (common.cpp at the pin, 55d3c05; it refused cleanly when nothing fit, on the H200 at 007d640)."""
        self.check_fit(flags)
        return ["--n-gpu-layers", "999", "--fit", "--fit-margin", str(margin_mib)]

    def cache_layout(self, mla: int | None, swa_full: bool = False) -> CacheLayout:
        """The latent with MLA 3 unless -mla says otherwise (common.h: `mla_attn = 3`; 27 MiB where f16 K/V
        would be 1.9 GiB, on the H200 at 55d3c05); the sparse-attention indexer's keys in f16 whatever the
        cache's type (-ictk's default at 8337e4c, which moe-stack leaves: the tiny GLM-5 logged `KV self
        indexer size = 3.00 MiB (f16)` beside a q8_0 latent; 55d3c05 built none); every sliding-window
        layer at the full context (its cache has no window: src/llama.cpp only masks)."""
        return CacheLayout(latent=mla is None or mla > 0, indexer_type="f16")

    def pins_cpu_weights(self, mmap: bool | None, gpu: bool) -> bool:
        """A CUDA build places tensors overridden to the CPU in CUDA_Host (pinned) buffers, mapped or not:
        its logs on the H200 show the routed experts there with mmap on (it has no --no-host)."""
        return gpu

    def engine_dimensions(self, args: list[str], gpu: bool) -> list[Dimension]:
        """With a GPU, first the batch from which CPU experts go to the GPU for prefill (measured 511 →
        5572 t/s at 2); then run-time repacking (-rtr: mmap off, the CPU weights repacked in place after
        loading for the CPU's kernels; the repacked types, e.g. Q4_0_R8 and IQ4_XS_R8, have no CUDA
        matmul, so prefill can no longer take those experts to the GPU: on an R1 slice decode went 45.8
        -> 54-66 t/s, bench/results/seed-models-2026-12-01b), fused MoE, and MLA's attention batch
        (-amb, DeepSeek)."""
        dimensions = []
        if gpu:
            current = value_of(args, ("-cuda", "--cuda-params")) or "default"
            dimensions.append(
                Dimension(
                    "offload",
                    tuple(
                        dict.fromkeys(
                            [current, "offload-batch-size=2", "offload-batch-size=8", "offload-batch-size=32"]
                        )
                    ),
                    setting_value(("-cuda", "--cuda-params")),
                    affects="prefill",
                )
            )
        dimensions.append(switch_dimension("rtr", args, ("-rtr", "--run-time-repack")))
        # On by default since PR #863; -fmoe stays accepted.
        dimensions.append(
            switch_dimension(
                "fmoe", args, ("-fmoe", "--fused-moe"), ("-no-fmoe", "--no-fused-moe"), default="on"
            )
        )
        if has_switch(args, ("-mla", "--mla-use")):
            amb = value_of(args, ("-amb", "--attention-max-batch")) or "default"
            dimensions.append(
                Dimension(
                    "amb",
                    tuple(dict.fromkeys([amb, "256", "512", "1024"])),
                    setting_value(("-amb", "--attention-max-batch")),
                )
            )
        return dimensions

    def check_layout(self, model: OpenedModel) -> None:
        """Beside the architectures it refuses, a DeepSeek or Qwen3-Next GGUF that carries its
        multi-token-prediction layer (mainline's converter keeps it unless --no-mtp) stops its loader: it
        knows NextN tensors for GLM-4.5, GLM-5, Ling and Qwen3.5 only, and
        at 007d640 a deepseek2 file with one exited 139 after `wrong number of tensors; expected 74, got
        70` (the four NextN tensors; tests/integration/test_speculative.py)."""
        super().check_layout(model)
        facts = model.facts
        if facts.nextn_layers and facts.arch not in NEXTN_ARCHITECTURES:
            raise StackError(
                f"{self.name} can't load {model.name}: its {facts.arch} multi-token-prediction layer "
                "(nextn_predict_layers) stops ik's loader; serve it with mainline llama.cpp, or convert "
                "the model with convert_hf_to_gguf.py --no-mtp"
            )

    def loaded_facts(self, facts: ModelFacts, mtp: bool | None) -> ModelFacts:
        """Its loader skips the NextN layers it knows (TENSOR_SKIP in llama-load-tensors.cpp at 55d3c05:
        glm4_moe's unless -mtp, which moe-stack never asks of it, glm_dsa's and bailingmoe2's always): the
        H200 logged GLM-4.6's and GLM-5's slices with 434 and 567 MiB of GPU weights, the layers' experts
        pinned but the NextN layer's (bench/results/family-buffers-2026-12-05; GLM-5's 567 keeps the NextN
        layer's attn_k_b and attn_v_b, 7.9 MiB at its widths, which this leaves out). Beside the weights, the
        MLA up-projection's form it builds (`ModelFacts.built_mla_bytes`: attn_kv_b for a file that has only
        mainline's split form, 1 GiB for R1's 61 layers), counted with them; at -mla 1 it builds less, and
        the plan counts it all the same."""
        loaded = facts.without_nextn()
        return replace(loaded, other_bytes=loaded.other_bytes + facts.built_mla_bytes, built_mla_bytes=0)

    def speculative_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """Since its speculative rework (8337e4c) a draft model drafts only in a `--spec-type draft` stage,
        which holds the draft length too (`draft:n_max=4`): a -md alone drafted nothing, and --draft-max
        exits ("legacy speculative option '--draft-max' is disabled"). A build whose --spec-type takes no
        stage (no `k=v` in its --help: 55d3c05's lists ngram kinds) drafts with -md and --draft-max."""
        if stack.draft_model is None or not takes_stages(flags):
            return super().speculative_args(stack, flags)
        stage = "draft" if stack.draft_max is None else f"draft:n_max={stack.draft_max}"
        model_alone = stack.model_copy(update={"draft_max": None})
        return [*super().speculative_args(model_alone, flags), "--spec-type", stage]

    def draft_length_dimension(self, args: list[str]) -> Dimension:
        """The stage's `n_max` where the draft is a --spec-type stage, else --draft-max."""
        stage = value_of(args, ("--spec-type",))
        if stage is None or not stage.startswith("draft"):
            return super().draft_length_dimension(args)
        return stage_length_dimension(stage)

    def mtp_args(self, flags: dict[str, str] | None) -> list[str]:
        """Not offered yet: 8337e4c drafts with the NextN layer of GLM-4.5, GLM-5, Qwen3.5 and DeepSeek-V4
        through `--spec-type mtp` (its -mtp exits as a legacy option), which no test here has served."""
        raise StackError(
            f"moe-stack doesn't draft with {self.name}'s MTP stage yet; drop --mtp, or use --draft-model, "
            "or mainline llama.cpp (--spec-type draft-mtp)"
        )

    def own_args(self, stack: StackSpec, flags: dict[str, str] | None) -> list[str]:
        """Fused MoE, MLA, the GPU offload batch, hugepages, grouped expert routing and the graph split:
        ik_llama.cpp's own."""
        args = []
        if stack.grouped_routing:
            args += self.grouped_routing_args(flags)
        if stack.fused_moe is not None:
            args += self.fused_moe_args(stack.fused_moe, flags)
        if stack.mla is not None:
            args += self.mla_args(stack.mla, flags)
        if stack.moe_offload_batch is not None:
            args += self.moe_offload_batch_args(stack.moe_offload_batch, flags)
        if stack.hugepages:
            args += self.hugepages_args(flags)
        if stack.split_mode_graph:
            args += self.split_mode_graph_args(len(stack.tensor_split), flags)
        return args

    def fused_moe_args(self, on: bool, flags: dict[str, str] | None) -> list[str]:
        """Before PR #863 fused MoE was off unless `-fmoe`; since, it is on unless `-no-fmoe`."""
        if flags is None:
            return [] if on else ["-no-fmoe"]
        if on:
            if "-fmoe" in flags:
                return ["-fmoe"]
            if "-no-fmoe" in flags:
                return []  # the default of this version
            raise StackError("this ik_llama.cpp build has no fused-MoE switch; drop --fused-moe")
        return ["-no-fmoe"] if "-no-fmoe" in flags else []

    def mla_args(self, mode: int, flags: dict[str, str] | None) -> list[str]:
        return [required_flag(flags, "-mla", self.name, "--mla", "-mla option"), str(mode)]

    def moe_offload_batch_args(self, batch: int, flags: dict[str, str] | None) -> list[str]:
        """`-cuda offload-batch-size=N`: measured on the device (bench/results/device-2026-11-30b), a
        Qwen3-235B-shaped slice's pp256 went from 511 to 5572 t/s at N=2 (mainline: 2234)."""
        cuda = required_flag(flags, "-cuda", self.name, "--moe-offload-batch", "-cuda parameters")
        return [cuda, f"offload-batch-size={batch}"]

    def grouped_routing_args(self, flags: dict[str, str] | None) -> list[str]:
        if flags is not None and "-ger" not in flags:
            raise StackError(
                "this ik_llama.cpp build has no -ger switch, and without it a Ling model's experts are not "
                "routed within their groups; build a newer ik_llama.cpp, or use mainline llama.cpp"
            )
        return ["-ger"]

    def hugepages_args(self, flags: dict[str, str] | None) -> list[str]:
        """-thp maps weights with MAP_HUGETLB from the host's reserved pool (falling back with a message)."""
        return [required_flag(flags, "-thp", self.name, "--hugepages", "-thp option")]

    def split_mode_graph_args(self, gpus: int, flags: dict[str, str] | None) -> list[str]:
        """`--split-mode graph` over a plan of `gpus` GPUs (0: no multi-GPU plan), with -smgs: src/llama.cpp
        at 8337e4c schedules the graph split only for a model without tensor overrides unless forced, and
        a plan's experts are -ot rules. Opt-in: it has not run on two GPUs here."""
        if gpus < 2:
            raise StackError(
                "--split-mode-graph splits the model over a multi-GPU plan's GPUs and this stack has no "
                "such plan: give --gpus and one --fit-vram-gb size per GPU, or drop --split-mode-graph"
            )
        if flags is not None and not {"--split-mode", "-smgs"} <= flags.keys():
            raise StackError(
                "this ik_llama.cpp build has no --split-mode graph scheduling (-smgs); build a newer "
                "ik_llama.cpp, or drop --split-mode-graph"
            )
        return ["--split-mode", "graph", "-smgs"]
