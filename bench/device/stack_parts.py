"""The parts of an emitted stack a runtime needs, for bench/device/cuda_image.sh (no Docker there):

    stack_parts.py STACK.yaml WORKDIR    write WORKDIR/stack-command.txt (the engine service's command,
                                         one argument a line), stack-env.txt (its environment) and
                                         model-name (the file under /models it serves)
    stack_parts.py --write-model PATH    write the synthetic model those stacks are emitted for

The model: Qwen3-235B-A22B's layer shapes (hidden 4096, 64 query and 4 KV heads of 128, 128 experts of
which 8 are used, expert FFN 1536), 4 layers, Q4_0, random weights (seed 0, so every host writes the
same bytes): what a token reads per layer is the real model's, the layer count is not.
"""

from __future__ import annotations

import sys
from pathlib import Path

from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import write_moe_gguf
from builder.stackfile.stack_file import StackFile

SHAPE = synth_shape("qwen3moe", layers=4, context=4096)  # Qwen3-235B-A22B's widths, 4 layers
MODEL_NAME = "qwen3-235b-a22b-shapes-4l-q4_0.gguf"


def split_stack(stack_file: Path, work: Path) -> None:
    service = StackFile.read(stack_file).service("engine")  # its values as meant: no compose here
    command = service.args
    if any("\n" in arg for arg in command):
        raise SystemExit("an argument holds a newline; this runner passes one argument a line")
    (work / "stack-command.txt").write_text("".join(arg + "\n" for arg in command))
    env = service.env
    (work / "stack-env.txt").write_text("".join(f"{key}={value}\n" for key, value in env.items()))
    model = command[command.index("--model") + 1]
    (work / "model-name").write_text(Path(model).name)
    print(f"stack: {len(command)} arguments, {len(env)} environment variables, model {model}")


if __name__ == "__main__":
    if sys.argv[1] == "--write-model":
        path = write_moe_gguf(Path(sys.argv[2]), SHAPE)
        print(f"wrote {path}: {path.stat().st_size} bytes")
    else:
        split_stack(Path(sys.argv[1]), Path(sys.argv[2]))
