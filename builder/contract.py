"""The contract between an image and the stacks that run it: the paths, port, user and label names
both sides use. The templates get these as values; nothing else spells them."""

from __future__ import annotations

IMAGE_UID = 10001  # the image's non-root user and group (a fixed id, so mounts and policies can name it)
CONTAINER_PORT = 8080  # the engine listens here inside the container; a stack maps a host port onto it
# The named build context that carries a built chat page into an engine image (images/chat_page.py).
CHAT_PAGE_CONTEXT = "chat-page"
MODEL_DIR = "/models"  # the model's directory (or its files), read-only
CONFIG_DIR = "/model-config"  # KTransformers: the model's Hugging Face directory, beside the weights
HUGETLBFS_DIR = "/hugepages"  # where the entrypoint stages a model onto a hugetlbfs volume
# The persistent prompt cache (`compose --keep-prompts`): the server's saved slots, on the stack's named
# volume (Docker copies this directory's owner, the image's user, into a new volume).
PROMPTS_DIR = "/var/lib/moe-stack/prompts"
API_KEY_SECRET = "moe-stack-api-key"
API_KEY_PATH = f"/run/secrets/{API_KEY_SECRET}"
ENGINE_DIR = "/opt/engine"  # the engine's programs (bin/) and libraries
ENGINE_BIN_DIR = f"{ENGINE_DIR}/bin"
# The server's --help (and parser literals), written in the build's contract stage, exported before
# the image is built, and kept in the image under /etc/moe-stack.
CONTRACT_DIR = "/contract"
HELP_FILE = "server-help.txt"
PARSER_FLAGS_FILE = "parser-flags.txt"
ARCHITECTURES_FILE = "architectures.txt"  # the GGUF architectures the engine's tree names (llama-arch.cpp)
LABEL_PREFIX = "io.moe-stack"
ARCHITECTURES_LABEL = f"{LABEL_PREFIX}.architectures"  # … as the image's label, space-separated
TOOLS_LABEL = f"{LABEL_PREFIX}.tools"  # a tools image's programs beside the server, space-separated
# Several models behind one server: the preset (each model's flags) arrives in ROUTER_PRESET_ENV, and
# the entrypoint writes it here (the root file system is read-only; /tmp is the stack's tmpfs).
ROUTER_PRESET_ENV = "MOE_STACK_ROUTER_PRESET"
ROUTER_PRESET = "/tmp/moe-stack-models.ini"
# The monitoring service (`compose --monitoring`): Prometheus from Debian's package, made locally.
PROMETHEUS_PORT = 9090
PROMETHEUS_DATA = "/var/lib/moe-stack-prometheus"  # the stack's named volume (Docker copies its owner in)
PROMETHEUS_CONFIG_ENV = "MOE_STACK_PROMETHEUS_CONFIG"  # the scrape configuration, written to /tmp at start


# The environment the image's scripts read (dockerfiles/common/moe-stack-entrypoint and the others):
# what a stack sets...
NUMA_ENV = "MOE_STACK_NUMA"  # the numactl policy: interleave[:NODES] | membind:NODES | cpunodebind:NODES
HUGETLBFS_ENV = "MOE_STACK_HUGETLBFS"  # where the entrypoint stages the model (a hugetlbfs mount)
API_KEY_FILE_ENV = "MOE_STACK_API_KEY_FILE"  # the key's file, for a server that takes no key file flag
# The prompt cache's name for this model and engine build: the entrypoint restores the slots saved
# under it once the server is healthy and saves them when the container is stopped.
PROMPTS_ENV = "MOE_STACK_PROMPTS"
SLOTS_ENV = "MOE_STACK_SLOTS"  # how many slots the server has (--parallel): each is saved and restored
# A stack that also unloads when idle: the seconds without a request after which the slots are saved,
# before the server sleeps and frees them (StackSpec.prompts_saved_after_s).
PROMPTS_QUIET_ENV = "MOE_STACK_PROMPTS_QUIET_S"
# An engine that writes its prompts' files as it serves (KTransformers): the MiB they are pruned to.
PROMPTS_MAX_ENV = "MOE_STACK_PROMPTS_MAX_MIB"
# SGLang's GIL switch interval under KTransformers' moe-stack-prompts (its own default: 0.5 ms); a stack
# may set another (the image's moe-stack-switch-interval.pth applies it in every interpreter).
SWITCH_INTERVAL_ENV = "MOE_STACK_SWITCH_INTERVAL_S"
# ... and what the image sets itself (its Dockerfile's ENV).
SERVER_MODULE_ENV = "MOE_STACK_SERVER_MODULE"  # a Python engine's server module (KTransformers)
IMAGE_ENV = (
    "MOE_STACK_ENGINE_BIN",
    "MOE_STACK_MODEL_FLAGS",
    "MOE_STACK_TOOLS_DIR",
    "MOE_STACK_ROUTER_PRESET_FILE",
    "MOE_STACK_PROMPTS_DIR",  # the prompt cache's mount point (PROMPTS_DIR), for moe-stack-prompts
    SERVER_MODULE_ENV,
    "MOE_STACK_HEALTH_PATH",
    "MOE_STACK_SKIP_ISA_GUARD",
    "MOE_STACK_PROMETHEUS_CONFIG_FILE",
    "MOE_STACK_PROMETHEUS_DATA",
    "MOE_STACK_PROMETHEUS_PORT",
)


# Images moe-stack makes on the host (`moe-stack base`: the Debian, CUDA and Prometheus bases) are
# named under this unqualified namespace, which Docker would resolve to Docker Hub, where it is not
# ours: they are never pulled (pull_policy: never, and a build checks they exist first).
LOCAL_ONLY = "moe-stack/"


def local_only(image: str) -> bool:
    return image.startswith(LOCAL_ONLY)


def prometheus_image(suite: str) -> str:
    return f"{LOCAL_ONLY}prometheus:{suite}"


# A loaded bundle's images, named under the bundle's digest (`moe-stack load`): never a name the builder
# resolves (a base it starts FROM, the Prometheus image every monitored stack runs) nor another bundle's.
LOADED_IMAGES = "moe-stack-loaded/"
