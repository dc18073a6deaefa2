"""What goes into a stack: the user's options merged with the model's preset, the VRAM plan, the
experts-on-CPU rule and this host's placement, into a StackSpec; then the image's facts read and
checked, into a StackPlan that an output format (the compose file) writes.

The command line builds a StackOptions and calls `plan_stack`; tests call it with recorded hosts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from builder.engines.base import Engine, StackSpec, keeps_whole_window
from builder.errors import SpecError, StackError
from builder.features import refuse
from builder.features.all import FEATURES
from builder.features.speculative import checked_speculative, draft_vram_bytes
from builder.features.vision import checked_projector, projector_bytes
from builder.host.placement import HUGEPAGE_KB, Placement, check_hugepages_reserved, place
from builder.host.probe import HostFacts
from builder.images.image_facts import ImageFacts, read_image_facts
from builder.images.matrix import default_image_spec, published
from builder.images.naming import image_tag, short_ref
from builder.images.recorded_contracts import check_pinned_architecture, recorded_contract
from builder.models.kt_weights import check_same_model
from builder.models.kv_cache import DEFAULT_UBATCH
from builder.models.opened import OpenedModel
from builder.models.planner import GIB
from builder.platform.targets import CPU_TARGETS
from builder.request import ContainerOptions, ServedOptions
from builder.spec import EXPERTS_ON_CPU_RULE, EngineOptions
from builder.stackfile.host_checks import check_config_dir, check_host_runs, check_port_free
from builder.stacks.derived import Derived, block_sparse, derived_preset
from builder.stacks.document import GPU_LAYOUT, cpu_only, project_name_for, start_period_for
from builder.stacks.options import StackOptions
from builder.stacks.pinned_memory import check_pinned
from builder.stacks.presets import check_model_architecture, merge_options
from builder.stacks.vram_levers import GpuDemand, vram_plan


@dataclass(frozen=True)
class StackPlan:
    """A stack ready to write: the spec, its image's facts (None: unchecked) and an optional CPU-only
    profile beside it."""

    stack: StackSpec
    facts: ImageFacts | None
    cpu_profile: tuple[StackSpec, ImageFacts | None] | None = None
    routed: tuple[StackSpec, ...] = ()  # several models behind the one server: each one's stack
    notes: tuple[str, ...] = ()  # what the user should know of this stack on this host (pinned memory)


@dataclass(frozen=True)
class Assembly:
    """A stack as the assembly steps decide it, each step returning a copy with its part settled."""

    options: StackOptions
    host: HostFacts
    model: OpenedModel
    engine_options: EngineOptions  # the user's, until the preset's are merged under them
    preset_rules: tuple[str, ...] = ()  # the preset's -ot rules, which a VRAM plan replaces
    derived: Derived | None = None  # the options moe-stack derived from the model where no preset is named
    draft: OpenedModel | None = None
    gpu_experts: int | None = None
    tensor_split: tuple[int, ...] = ()


def assemble_stack(options: StackOptions, host: HostFacts) -> StackSpec:
    """The StackSpec for `options` on `host` (the target host's facts unless `for_other_host`): the
    model opened once, then each of ASSEMBLY_STEPS in order, then the spec."""
    model = options.engine.open_model(options.model_path)
    assembly = Assembly(options, host, model, options.engine_options, gpu_experts=options.gpu_experts)
    for step in ASSEMBLY_STEPS:
        assembly = step(assembly)
    stack = _spec(assembly)
    if not options.for_other_host:
        options.engine.check_host(stack, host.cpu)
    return stack


def _preset_options(a: Assembly) -> Assembly:
    """The named preset's options (its architecture checked against the model's), else the ones derived
    from the model, each under those the user gave."""
    options, adapter, facts = a.options, a.options.engine, a.model.facts
    if options.preset is not None:
        check_model_architecture(options.preset, facts.arch, a.model.path, options.presets_file)
        merged, rules = merge_options(options.preset, adapter, options.engine_options, options.presets_file)
        return replace(a, engine_options=merged, preset_rules=rules)
    derived = derived_preset(facts, adapter, options.gpu != "none")
    if derived is None:
        return a  # a dense model: the user's options alone
    return replace(
        a,
        engine_options=options.engine_options.over(derived.options),
        preset_rules=derived.override_rules,
        derived=derived,
    )


def _without_gpu(a: Assembly) -> Assembly:
    """--gpu none: a preset's GPU layout left out (its GPU_LAYOUT options and -ot rules), the user's own
    options kept. A CPU stack of a GPU preset offloaded 99 layers to no GPU and kept its experts "on the
    CPU" by a rule."""
    if a.options.gpu != "none":
        return a
    if a.options.fit_vram_gb:
        raise SpecError(
            "--fit-vram-gb sizes what a GPU holds and --gpu none gives the stack none: give --gpu nvidia "
            "or cdi, or drop --fit-vram-gb"
        )
    given = a.options.engine_options
    unset = {name: None for name in GPU_LAYOUT if getattr(given, name) is None}
    return replace(a, engine_options=a.engine_options.model_copy(update=unset), preset_rules=())


def _speculative(a: Assembly) -> Assembly:
    """The draft model (or MTP stage) checked against the model, where the engine drafts at all (else
    it refuses the options by name)."""
    if not {"draft_model", "mtp"} <= a.options.engine.honours:
        return a
    engine_options, draft = checked_speculative(a.engine_options, a.model, a.options.engine)
    return replace(a, engine_options=engine_options, draft=draft)


def _projector(a: Assembly) -> Assembly:
    if "mmproj" not in a.options.engine.honours:
        return a
    return replace(a, engine_options=checked_projector(a.engine_options, a.model, a.options.engine))


def _sparse_attention(a: Assembly) -> Assembly:
    """MiniMax Sparse Attention runs only with flash attention and a cache per slot: otherwise mainline
    attends densely over the whole context, with a warning in its log alone (src/models/minimax-m3.cpp at
    0c1e57098), which the plan and a long context's speed don't expect."""
    if not block_sparse(a.model.facts):
        return a
    if a.engine_options.flash_attention == "off":
        raise SpecError(
            "this model's sparse attention runs only with flash attention (off, the engine attends densely "
            "over the whole context): drop --flash-attention off"
        )
    if {"--kv-unified", "-kvu"} & set(a.options.engine_args) and a.options.parallel > 1:
        raise SpecError(
            "this model's sparse attention needs a cache per slot (with --kv-unified and several slots the "
            "engine attends densely): drop --kv-unified"
        )
    return a


def _engine_fit(a: Assembly) -> Assembly:
    """--placement fit: the engine's --fit places layers and experts, so no -ngl and no preset rules."""
    options = a.options
    if options.placement != "fit":
        return a
    if options.fit_vram_gb or options.override_tensor or options.experts_on_cpu:
        raise SpecError(
            "--placement fit leaves -ngl and -ot to the engine's --fit: drop --fit-vram-gb, "
            "--override-tensor and --experts-on-cpu (moe-stack plan explains what it will do)"
        )
    no_layers = a.engine_options.model_copy(update={"gpu_layers": None})
    return replace(a, engine_options=no_layers, preset_rules=())


def _fitted_vram(a: Assembly) -> Assembly:
    """--fit-vram-gb: the VRAM plan's rules and tensor split replace the preset's all-experts-on-CPU rule
    (the plan at the stack's context, cache and micro-batch, a draft model and a vision projector counted)."""
    options, adapter = a.options, a.options.engine
    if not options.fit_vram_gb:
        return a
    if options.gpus and len(options.gpus) != len(options.fit_vram_gb):
        raise SpecError(
            f"--gpus names {len(options.gpus)} GPUs and --fit-vram-gb sizes {len(options.fit_vram_gb)}: "
            "give one size per GPU, in the same order"
        )
    if len(options.fit_vram_gb) > 1 and not adapter.takes_override_rules:
        raise SpecError(f"{adapter.name} keeps its GPU experts on one GPU: give --fit-vram-gb one size")
    given = a.engine_options
    demand = GpuDemand(
        engine=adapter,
        facts=adapter.loaded_model(a.model, given.mtp),
        ctx=given.ctx_size,
        ubatch=given.ubatch_size or DEFAULT_UBATCH,
        cache_type=given.cache_type or "f16",
        layout=adapter.cache_layout(given.mla, keeps_whole_window(options.keep_prompts, options.engine_args)),
        sequences=options.parallel,
    )
    fitted = vram_plan(
        demand,
        [int(gb * GIB) for gb in options.fit_vram_gb],
        a.host.mem_total_bytes,
        margin=int(options.vram_margin_gb * GIB),
        beside=draft_vram_bytes(a.draft, adapter, demand.ctx, demand.ubatch) + projector_bytes(given),
        cache_type_v=given.cache_type_v,
    )
    gpu_experts = a.gpu_experts
    if gpu_experts is None and not adapter.takes_override_rules:
        gpu_experts = fitted.gpu_experts_per_layer
    return replace(
        a, preset_rules=fitted.override_rules, tensor_split=fitted.tensor_split, gpu_experts=gpu_experts
    )


def _gpus_on_host(a: Assembly) -> Assembly:
    options, gpus = a.options, a.host.gpus
    if options.gpus and gpus and not options.for_other_host:
        missing = sorted(set(options.gpus) - set(range(len(gpus))))
        if missing:
            raise SpecError(
                f"--gpus names GPU {', '.join(map(str, missing))}, and this host has "
                f"{len(gpus)} (0-{len(gpus) - 1}); see `moe-stack doctor`"
            )
    return a


# The server's and the container's options, as the user gave them unless a step decided them.
_GIVEN_TO_SPEC = {name for group in (ServedOptions, ContainerOptions) for name in group.model_fields}


def _spec(a: Assembly) -> StackSpec:
    """The spec the steps decided: the stack's -ot rules, its host placement and default image, and what
    the user gave as is."""
    options, host, adapter, model = a.options, a.host, a.options.engine, a.model
    rules = list(options.override_tensor)
    if adapter.takes_override_rules:  # else it keeps routed experts on the CPU itself
        rules += [*a.preset_rules, *([EXPERTS_ON_CPU_RULE] if options.experts_on_cpu else [])]
    where = _placement(options, host, model)
    driver = host.gpus[0].driver if host.gpus and not options.for_other_host else None
    flags = None if options.for_other_host else host.cpu.flags
    image = options.image or image_tag(default_image_spec(adapter, options.gpu != "none", driver, flags))
    nodes = len(where.numa_nodes) or (1 if options.for_other_host else max(1, len(host.nodes)))
    decided = {
        "project_name": options.project or project_name_for(model.path),
        "engine": adapter,
        "image_ref": image,
        "model": model,
        "cpu_threads": where.threads,
        "override_tensors": tuple(dict.fromkeys(rules)),
        "served_name": options.served_name or options.preset or served_name_for(model.stem),
        "numa_policy": where.numa,
        "bind_nodes": where.numa_nodes,
        "numa_node_count": nodes,
        "cpuset": where.cpuset,
        "config_dir": _checked_config_dir(options.config_dir, adapter, model),
        "gpu_experts": a.gpu_experts,
        "gpu_ids": options.gpus,
        "tensor_split": a.tensor_split,
        "engine_fit": options.placement == "fit",
        "vram_margin_mib": round(options.vram_margin_gb * 1024),
        "sliding_window": options.keep_prompts and model.facts.sliding_window > 0,
        "grouped_routing": adapter.asks_for_groups(model.facts.arch, model.facts.expert_groups),
        "derived": a.derived.said(options.engine_options) if a.derived is not None else None,
        "extra_args": options.engine_args,
        "start_period_s": options.start_period or start_period_for(model.size),
    }
    given = options.model_dump(include=_GIVEN_TO_SPEC)
    return StackSpec.model_validate(given | decided).with_options(a.engine_options)


def _layers_on_gpu(a: Assembly) -> Assembly:
    """A GPU stack holds every layer's attention, shared weights and KV cache on the GPU (the hybrid
    layout; the -ot rules say where routed experts go) unless the user or preset names a layer count.
    ik_llama.cpp offloads no layer by default: a GPU stack without -ngl ran on the CPU (6 tok/s where the
    hybrid layout gave 37 on the H200, ENGINE-FACTS.md). Mainline's --fit places layers itself."""
    if (
        a.options.gpu == "none"
        or a.options.placement == "fit"
        or "gpu_layers" not in a.options.engine.honours
        or a.engine_options.gpu_layers is not None
    ):
        return a
    every_layer = a.model.facts.layers + 1  # the output layer counts as one more
    return replace(a, engine_options=a.engine_options.model_copy(update={"gpu_layers": every_layer}))


def _checked_config_dir(config_dir: Path | None, adapter: Engine, model: OpenedModel) -> Path | None:
    """The model's Hugging Face directory, checked to hold what the engine reads and to be `model`'s."""
    if config_dir is None:
        return None
    checked = check_config_dir(config_dir, adapter.config_dir_weights)
    check_same_model(checked, model.facts, model.path)
    return checked


def served_name_for(stem: str) -> str:
    """The model's name in the API when none is given: its file's stem (the format's, without suffix and
    split numbering), in the characters an API name takes."""
    return re.sub(r"[^A-Za-z0-9._:/+-]", "-", stem).lstrip("._:/+-")[:128] or "model"


def plan_stack(options: StackOptions, host: HostFacts) -> StackPlan:
    """The stack for `options` with its image's facts checked (and the CPU-only profile's, if asked
    for): what `moe-stack compose` writes."""
    stack = assemble_stack(options, host)
    if options.cpu_image is not None and stack.gpu == "none":
        raise SpecError(
            "--cpu-image adds a CPU-only profile beside a GPU service: give --gpu nvidia or cdi too"
        )
    facts = _checked_facts(stack.image_ref, options, host)
    if facts is not None:
        check_architecture(facts, stack.model)
    elif options.image is None:  # the pinned ref's image, not read here: its recorded tree says
        check_pinned_architecture(stack.engine, stack.model.facts.arch)
    # After the architecture: a model the engine can't load at all is refused for that, not for its layout
    # (DeepSeek-V3.2's MTP block on ik_llama.cpp, whose pin has no deepseek32).
    check_engine_loads(stack.engine, stack.model)
    if facts is not None and facts.cpu_target in CPU_TARGETS:
        stack.engine.check_image_target(stack, CPU_TARGETS[facts.cpu_target])
    cpu_profile = None
    if options.cpu_image is not None:
        cpu_profile = (cpu_only(stack, options.cpu_image), _checked_facts(options.cpu_image, options, host))
    notes = [] if options.for_other_host else [check_pinned(stack, host.mem_total_bytes)]
    if options.image is None:
        notes.append(unbuilt_default(stack))
    return StackPlan(stack=stack, facts=facts, cpu_profile=cpu_profile, notes=tuple(n for n in notes if n))


def plan_models(models: Sequence[StackOptions], host: HostFacts) -> StackPlan:
    """One model: `plan_stack`. Several: one server that switches between them (the engine's router),
    each model with its own preset and flags, one port, each served under its own name."""
    if len(models) == 1:
        return plan_stack(models[0], host)
    first = models[0]
    if first.cpu_image is not None:
        raise SpecError("a stack of several models has one service: drop --cpu-image")
    if not first.engine.routes_models:
        raise SpecError(
            f"{first.engine.name} serves one model per server: emit one stack per model, or use an engine "
            "whose server routes between models (mainline llama.cpp)"
        )
    routed = tuple(assemble_stack(options, host) for options in models)
    for model in routed:
        refuse(FEATURES, model, "router")
    base = routed[0]
    facts = _checked_facts(base.image_ref, first, host)
    if facts is not None:
        for model in routed:
            check_architecture(facts, model.model)
    return StackPlan(stack=base, facts=facts, routed=routed)


def unbuilt_default(stack: StackSpec) -> str | None:
    """A note when the image a stack got by default is no published one: nothing moe-stack ran has built
    it (say, a GPU stack of ik_llama.cpp on an AVX2-only host), so the user builds it first."""
    if stack.image_ref in {image_tag(entry.spec) for entry in published()}:
        return None
    return (
        f"{stack.image_ref} is moe-stack's default for this host, and no test or recorded run has built it: "
        f"`moe-stack build --engine {stack.engine} ...` it first (or give --image one you built)"
    )


def check_ports(plan: StackPlan, options: StackOptions) -> None:
    """The stack's host ports are free, where it will publish them: on this host (not for another host's
    compose file, nor a Kubernetes manifest, whose ports are the cluster's). Checked last, once the
    output is made: what is wrong with the stack itself is said first."""
    if options.for_other_host or not options.ports_here:
        return
    for port in (plan.stack.port, *([plan.stack.monitoring_port] if plan.stack.monitoring else [])):
        check_port_free(plan.stack.bind, port)


def _placement(options: StackOptions, host: HostFacts, model: OpenedModel) -> Placement:
    if options.for_other_host:  # this host's topology says nothing about the target's
        return Placement(
            numa="none" if options.numa == "auto" else options.numa,
            numa_nodes=options.numa_nodes,
            cpuset=None,
            threads=options.threads or host.cpu.physical_cores,
        )
    where = place(host, options.numa, options.numa_nodes, options.threads)
    if options.hugepages:
        check_hugepages_reserved(host)
    if options.hugetlbfs != "off":
        check_hugepages_reserved(host, HUGEPAGE_KB[options.hugetlbfs], model.size)
    return where


def check_engine_loads(adapter: Engine, model: OpenedModel) -> None:
    """StackError when the engine can't load `model`'s tensor layout, or when an engine that names the
    architectures it loads (no image label does) can't load `model`'s."""
    adapter.check_layout(model)
    if adapter.gguf_architectures is None:
        return
    arch = model.facts.arch
    if arch not in adapter.gguf_architectures:
        raise StackError(
            f"{adapter.name} can't load {arch} models like {model.name} (it loads "
            f"{', '.join(sorted(adapter.gguf_architectures))}): "
            "use --engine ktransformers or a llama.cpp engine"
        )


def check_architecture(facts: ImageFacts, model: OpenedModel) -> None:
    """StackError when the image's engine can't load `model`'s architecture (its tree names no such one),
    saying whether the pinned version's image can."""
    arch = model.facts.arch
    if not facts.architectures or arch in facts.architectures:
        return
    pinned = recorded_contract(facts.engine)
    which = (
        f"the image of {facts.engine} {short_ref(pinned.ref)} does "
        f"(`moe-stack build --engine {facts.engine}`)"
        if pinned is not None and arch in pinned.architectures
        else "build a newer ref of it"
    )
    raise StackError(
        f"{facts.who} can't load {arch} models like {model.name} (its llama-arch.cpp names no {arch}); "
        f"{which}"
    )


def _checked_facts(image: str, options: StackOptions, host: HostFacts) -> ImageFacts | None:
    """The image's flag contract and CPU needs (None when skipped); refuses an image this CPU can't run."""
    if options.skip_image_checks:
        return None
    facts = read_image_facts(image)
    if not options.for_other_host:
        check_host_runs(facts, host.cpu)
    return facts


# The order matters: the preset's options first, what checks them next, then the placement that reads them.
ASSEMBLY_STEPS: tuple[Callable[[Assembly], Assembly], ...] = (
    _preset_options,
    _without_gpu,
    _speculative,
    _projector,
    _sparse_attention,
    _engine_fit,
    _layers_on_gpu,
    _fitted_vram,
    _gpus_on_host,
)
