"""compose's one step: its command line, planned on this host, written as a compose file or as Kubernetes
manifests."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from builder.errors import SpecError
from builder.files import write_file_atomically
from builder.host.probe import probe
from builder.spec import EngineOptions
from builder.stacks.assemble import StackPlan, check_ports, plan_models
from builder.stacks.compose import compose_stack, write_stack
from builder.stacks.kubernetes import KubeOptions, manifests, resource_name, to_kubernetes_yaml
from builder.stacks.memory_use import memory_use
from builder.stacks.options import StackCommandLine


@dataclass(frozen=True)
class Emitted:
    """What compose wrote: the file, its format, and what the user should know of the stack here."""

    path: Path
    kubernetes: bool
    notes: tuple[str, ...] = ()


def emit_stack(command: StackCommandLine, engine_options: EngineOptions, generated_by: str) -> Emitted:
    """The stack of `command` written where it says (`generated_by`: the command line, in the file)."""
    if command.output_format not in ("compose", "kubernetes"):
        raise SpecError(f"--format {command.output_format!r}: choose compose or kubernetes")
    options = command.stack_options(engine_options)
    plan = plan_models(options, probe())
    if command.output_format == "kubernetes":
        # its ports are the cluster's: none checked here
        cluster = KubeOptions(
            replicas=command.replicas, model_pvc=command.model_pvc, gpu_product=command.gpu_product
        )
        out_file = command.out_file or Path("moe-stack.k8s.yaml")
        return Emitted(_write_kubernetes(plan, cluster, out_file, generated_by), kubernetes=True)
    document = compose_stack(
        plan.stack,
        generated_by=generated_by,
        facts=plan.facts,
        cpu_profile=plan.cpu_profile,
        routed=plan.routed,
    )
    check_ports(plan, options[0])
    path = write_stack(document, command.out_file or Path("compose.yaml"))
    return Emitted(path, kubernetes=False, notes=plan.notes)


def _write_kubernetes(plan: StackPlan, cluster: KubeOptions, out_file: Path, generated_by: str) -> Path:
    """The plan as a Deployment and a Service (one model, no CPU profile); `cluster` holds compose's
    --replicas, --model-pvc and --gpu-product, the stack its memory and GPUs."""
    if plan.routed or plan.cpu_profile is not None:
        raise SpecError(
            "--format kubernetes emits one model's Deployment: drop --cpu-image and extra --model"
        )
    stack = plan.stack
    options = replace(cluster, memory=memory_use(stack), gpus=len(stack.gpu_ids) or 1)
    secret = f"{resource_name(stack.project_name)}-api-key" if stack.api_key_file is not None else None
    return write_file_atomically(
        out_file, to_kubernetes_yaml(manifests(stack, plan.facts, options), generated_by, secret)
    )
