"""StackSpec → Kubernetes manifests (`moe-stack compose --format kubernetes`): a Deployment and a
Service carrying the same command, image, placement and security as the compose file, for clusters
with NVIDIA's device plugin, the kubelet's static CPU manager and reserved hugepages.

Pure: the caller passes what the host or the user decides (model size, volume source, replicas).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import yaml

from builder import __version__
from builder.contract import API_KEY_SECRET, CONFIG_DIR, CONTAINER_PORT, HUGETLBFS_DIR, IMAGE_UID, MODEL_DIR
from builder.engines.base import StackSpec
from builder.errors import StackError
from builder.features import refuse
from builder.features.all import FEATURES
from builder.images.image_facts import ImageFacts
from builder.images.naming import parse_variant
from builder.models.planner import GIB
from builder.platform.targets import CPU_TARGETS
from builder.stackfile.service_parts import HEALTHCHECK
from builder.stacks.document import engine_command, entrypoint_environment, pinned_image
from builder.stacks.memory_use import NOTHING_KNOWN, MemoryUse

# Node Feature Discovery's labels for the CPU flags that tell moe-stack's targets apart (its cpuid names:
# the kernel's flag upper-cased without "_", FMA3 for fma; NFD leaves BMI1/BMI2/F16C/LZCNT unlabelled by
# default, and the other flags come with these).
NFD_PREFIX = "feature.node.kubernetes.io/cpu-cpuid."
_NFD_FLAGS = (
    "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl",
    "avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512ifma", "avx512_bitalg",
    "avx512_vpopcntdq", "avx512_fp16", "avx512_vp2intersect", "amx_tile", "amx_int8", "amx_bf16",
)  # fmt: skip
NFD_CPUID = {flag: "FMA3" if flag == "fma" else flag.replace("_", "").upper() for flag in _NFD_FLAGS}
KUBELET_NOTES = """\
# Kubelet settings this placement relies on (each node that may run it):
#   cpuManagerPolicy: static          integer CPU requests = limits (Guaranteed QoS) pin physical cores
#   topologyManagerPolicy: restricted (or single-numa-node, where one NUMA node holds the model)
#   reservedSystemCPUs / kubeReserved so the engine's cores are not shared; SMT siblings: the
#   cpuManagerPolicyOptions full-pcpus-only=true keeps a core's two threads together
#   hugepages reserved at boot (hugepagesz=1G hugepages=N) where the stack stages its model on them
# NVIDIA's device plugin (or GPU operator) provides nvidia.com/gpu; Node Feature Discovery the
# feature.node.kubernetes.io/cpu-cpuid.* labels the nodeSelector names.
"""


@dataclass(frozen=True)
class KubeOptions:
    replicas: int = 1
    memory: MemoryUse = NOTHING_KNOWN  # what the stack takes of the node's memory (memory_use)
    model_pvc: str | None = None  # a PersistentVolumeClaim holding the model; default: the node's path
    gpu_product: str | None = None  # nvidia.com/gpu.product (GPU feature discovery), e.g. NVIDIA-H200
    gpus: int = 1  # nvidia.com/gpu per pod


def _gibibytes(n_bytes: int) -> str:
    return f"{(n_bytes + GIB - 1) // GIB}Gi"


def manifests(stack: StackSpec, facts: ImageFacts | None, options: KubeOptions) -> list[dict[str, object]]:
    """The Deployment and Service for `stack` (its command checked against the image's contract)."""
    refuse(FEATURES, stack, "kubernetes")
    if stack.mlock:
        raise StackError(
            "--mlock needs an unlimited memlock limit, which a pod spec can't set: drop it for "
            "Kubernetes (or raise the limit in the container runtime's defaults)"
        )
    if options.replicas < 1:
        raise StackError(f"--replicas {options.replicas}: a Deployment runs at least 1")
    command = engine_command(stack, facts)
    name = resource_name(stack.project_name)
    labels = {
        "app.kubernetes.io/name": "moe-stack",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "engine",
        "app.kubernetes.io/managed-by": "moe-stack",
    }
    deployment: dict[str, object] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {
                "moe-stack/generator": f"moe-stack {__version__}",
                "moe-stack/served-name": stack.served_name or "",
            },
        },
        "spec": {
            "replicas": options.replicas,
            # A new pod needs the model's RAM again: never two on one node during a rollout.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "template": {"metadata": {"labels": labels}, "spec": _pod(stack, facts, command, options)},
        },
    }
    service: dict[str, object] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"app.kubernetes.io/instance": name},
            "ports": [
                {"name": "http", "port": CONTAINER_PORT, "targetPort": CONTAINER_PORT, "protocol": "TCP"}
            ],
        },
    }
    return [deployment, service]


def resource_name(project: str) -> str:
    """A DNS-1123 label from a compose project name (which may hold '_')."""
    return re.sub(r"[^a-z0-9-]+", "-", project.lower()).strip("-")[:63].rstrip("-") or "moe-stack"


def _pod(
    stack: StackSpec, facts: ImageFacts | None, command: list[str], options: KubeOptions
) -> dict[str, object]:
    volumes, mounts = _volumes(stack, options)
    pod: dict[str, object] = {
        "securityContext": {
            "runAsUser": IMAGE_UID,
            "runAsGroup": IMAGE_UID,
            "runAsNonRoot": True,
            "fsGroup": IMAGE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "automountServiceAccountToken": False,
        "containers": [_container(stack, facts, command, mounts, options)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 30,
    }
    selector = {
        f"{NFD_PREFIX}{NFD_CPUID[flag]}": "true" for flag in _image_flags(stack, facts) if flag in NFD_CPUID
    }
    if options.gpu_product and stack.gpu != "none":
        selector["nvidia.com/gpu.product"] = options.gpu_product
    if selector:
        pod["nodeSelector"] = selector
    return pod


def _container(
    stack: StackSpec,
    facts: ImageFacts | None,
    command: list[str],
    mounts: list[dict[str, object]],
    options: KubeOptions,
) -> dict[str, object]:
    environment, caps = entrypoint_environment(stack)
    requests, limits = _resources(stack, options)
    health = {"exec": {"command": list(HEALTHCHECK[1:])}, "timeoutSeconds": 5}
    container: dict[str, object] = {
        "name": "engine",
        "image": pinned_image(stack, facts),
        "args": command,
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        # Guaranteed QoS: requests equal limits, whole CPUs (the static CPU manager pins them).
        "resources": {"requests": requests, "limits": limits},
        "volumeMounts": mounts,
        "startupProbe": {
            **health,
            "periodSeconds": 10,
            "failureThreshold": max(3, stack.start_period_s // 10 + 1),
        },
        "readinessProbe": {**health, "periodSeconds": 10, "failureThreshold": 3},
        "livenessProbe": {**health, "periodSeconds": 30, "failureThreshold": 3},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"], **({"add": caps} if caps else {})},
        },
    }
    if environment:
        container["env"] = [{"name": key, "value": str(value)} for key, value in environment.items()]
    return container


def _resources(stack: StackSpec, options: KubeOptions) -> tuple[dict[str, str], dict[str, str]]:
    """The engine's requests and limits: its threads' CPUs, the memory and hugepages the plan counts, and
    its GPUs (a limit only)."""
    requests = {"cpu": str(stack.cpu_threads), "memory": _gibibytes(options.memory.memory_bytes)}
    if stack.hugetlbfs != "off" or stack.hugepages:
        requests[f"hugepages-{_hugepage_size(stack)}"] = _gibibytes(options.memory.hugepage_bytes)
    limits = dict(requests)
    if stack.gpu != "none":
        limits["nvidia.com/gpu"] = str(options.gpus)
    return requests, limits


def _volumes(
    stack: StackSpec, options: KubeOptions
) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """The pod's volumes and the engine's mounts of them, in the same order."""
    models = (
        {"persistentVolumeClaim": {"claimName": options.model_pvc, "readOnly": True}}
        if options.model_pvc
        else {"hostPath": {"path": str(stack.model.path.parent), "type": "Directory"}}
    )
    shm = {"medium": "Memory", "sizeLimit": _quantity(stack.shm_size)}
    pairs: list[tuple[dict[str, object], dict[str, object]]] = [
        ({"name": "models", **models}, {"name": "models", "mountPath": MODEL_DIR, "readOnly": True}),
        ({"name": "tmp", "emptyDir": {}}, {"name": "tmp", "mountPath": "/tmp"}),
        ({"name": "shm", "emptyDir": shm}, {"name": "shm", "mountPath": "/dev/shm"}),
    ]
    if stack.config_dir is not None:
        config = {"path": str(stack.config_dir), "type": "Directory"}
        pairs.append(
            (
                {"name": "model-config", "hostPath": config},
                {"name": "model-config", "mountPath": CONFIG_DIR, "readOnly": True},
            )
        )
    if stack.hugetlbfs != "off":
        pairs.append(
            (
                {"name": "hugepages", "emptyDir": {"medium": f"HugePages-{_hugepage_size(stack)}"}},
                {"name": "hugepages", "mountPath": HUGETLBFS_DIR},
            )
        )
    if stack.api_key_file is not None:
        # The key is never in the manifest: a Secret the user creates (see the file's header).
        secret = {"secretName": f"{resource_name(stack.project_name)}-api-key", "defaultMode": 0o440}
        mount = {"name": "api-key", "mountPath": f"/run/secrets/{API_KEY_SECRET}", "subPath": "key"}
        pairs.append(({"name": "api-key", "secret": secret}, {**mount, "readOnly": True}))
    return [volume for volume, _ in pairs], [mount for _, mount in pairs]


def _hugepage_size(stack: StackSpec) -> str:
    return "1Gi" if stack.hugetlbfs == "1G" else "2Mi"


def _image_flags(stack: StackSpec, facts: ImageFacts | None) -> tuple[str, ...]:
    """The CPU flags the image needs: from its labels when known, else from its tag's CPU target."""
    if facts is not None:
        return facts.required_cpu_flags
    variant = parse_variant(stack.image_ref.split("@")[0].rpartition(":")[2])
    return CPU_TARGETS[variant.cpu].required_flags if variant is not None else ()


def _quantity(size: str) -> str:
    """A compose size (1g, 512m, 65536k; StackSpec checked its form) as a Kubernetes quantity."""
    units = {"k": "Ki", "m": "Mi", "g": "Gi"}
    return f"{size[:-1]}{units[size[-1]]}" if size[-1] in units else size


def to_kubernetes_yaml(
    documents: list[dict[str, object]], generated_by: str, api_key_secret: str | None
) -> str:
    """The manifests as one multi-document YAML file, the kubelet notes and the Secret to create first."""
    # One comment line whatever the command held: a newline in it would end the comment and start documents.
    printable = "".join(char if char.isprintable() else repr(char)[1:-1] for char in generated_by)
    header = f"# Generated by moe-stack {__version__}: {printable}\n" + KUBELET_NOTES
    if api_key_secret:
        header += (
            f"# Create the API key's Secret first (the key is never in this file):\n"
            f"#   kubectl create secret generic {api_key_secret} --from-file=key=API_KEY_FILE\n"
        )
    return header + "---\n".join(
        yaml.dump(document, Dumper=_Plain, sort_keys=False, width=120) for document in documents
    )


class _Plain(yaml.SafeDumper):
    """No YAML anchors: each manifest reads on its own (kubectl and reviewers alike)."""

    def ignore_aliases(self, data: object) -> bool:
        return True
