"""`moe-stack compose | up | down | demo`: stacks, from emission to a running engine; each verb is a thin
layer over stacks/assemble.py, compose.py, run.py or demo.py."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.text import Text

from builder.cli.common import out
from builder.cli.options import declared, given_options, group_values, takes_options
from builder.cli.progress import build_display
from builder.engines import Engine, adapters
from builder.errors import SpecError
from builder.images.baseimage import ensure_base
from builder.images.build import build_image
from builder.images.naming import image_spec
from builder.images.source import resolve_local
from builder.running.run import down as stack_down
from builder.running.run import up as stack_up
from builder.spec import BaseImages, NeutralOptions
from builder.stackfile.host_checks import check_port_free
from builder.stacks.demo import DEMO_PROMPT, complete, start_demo
from builder.stacks.emit import emit_stack
from builder.stacks.options import StackCommandLine


@takes_options(StackCommandLine, NeutralOptions)
def compose(**given: Any) -> None:
    """Emit a compose file that serves MODEL with ENGINE's image."""
    command = StackCommandLine.model_validate(group_values(StackCommandLine, given))
    emitted = emit_stack(command, given_options(given), " ".join(["moe-stack", *sys.argv[1:]]))
    path = emitted.path
    if emitted.kubernetes:
        out.print(f"wrote {path}: `kubectl apply -f {path}` runs it (a Deployment and a Service)")
        return
    for note in emitted.notes:
        out.print(Text(f"note: {note}", style="yellow"), soft_wrap=True)
    out.print(
        f"wrote {path}: `docker compose -f {path} up --wait` starts it on http://{command.bind}:{command.port}"
    )


@takes_options()
def up(
    compose_file: Annotated[Path, typer.Argument(help="compose file from `moe-stack compose`")] = Path(
        "compose.yaml"
    ),
    timeout: Annotated[int, typer.Option("--timeout", help="seconds to wait for healthy")] = 600,
    profile: str | None = declared(),
) -> None:
    """Start a stack and wait until the engine is healthy."""
    stack_up(compose_file, timeout, profile, progress=_loading)
    out.print(f"healthy: {compose_file}")


def _loading(line: str) -> None:
    """A load progress line, on stdout: stderr holds a failure's one line alone."""
    out.print(line, highlight=False, markup=False, soft_wrap=True)


def down(
    compose_file: Annotated[Path, typer.Argument(help="compose file of the stack")] = Path("compose.yaml"),
) -> None:
    """Stop and remove a stack's containers, network and volumes (the file stays)."""
    stack_down(compose_file)
    out.print(f"stopped and removed the stack of {compose_file} (the file stays)")


@takes_options()
def demo(
    engine: Engine = declared(),
    source: Annotated[
        str | None,
        typer.Option(
            "--source", help="engine tree/tarball (default: the PyPI sdist vendoring the pinned engine)"
        ),
    ] = None,
    port: int = declared(help="host port (bound to 127.0.0.1)"),
    project: str | None = declared(help="compose project (default: moe-stack-demo-<engine>); a second demo"),
) -> None:
    """Build the CPU image, fetch the demo model, bring the stack up and have it complete a sentence."""
    adapter = engine
    if not adapter.serves_on_cpu or adapter.sdist is None or adapter.sdist_ref is None:
        able = [e.name for e in adapters() if e.serves_on_cpu and e.sdist]
        raise SpecError(
            f"the demo builds its engine from a PyPI sdist and serves on the CPU, which {adapter.name} "
            f"can't: use --engine {' or '.join(able)}"
        )
    check_port_free("127.0.0.1", port)
    sys.stderr.write(
        f"[1/3] building the {adapter.name} avx2 CPU image (first time: 5-20 min; cached after)\n"
    )
    base_image = ensure_base()
    tree = resolve_local(adapter, source or f"pypi:{adapter.sdist}")
    spec = image_spec(
        adapter,
        tree=tree,
        ref=adapter.sdist_ref if source is None else "local",
        base=BaseImages(build=base_image, runtime=base_image),
    )
    with build_display("auto") as show:
        image = build_image(spec, tree, show=show)
    sys.stderr.write(f"[2/3] starting the stack for {image} with the demo model\n")
    started = time.monotonic()
    generated_by = " ".join(["moe-stack", *sys.argv[1:]])
    compose_file = start_demo(adapter, image, port, generated_by, project)
    sys.stderr.write(f"[3/3] healthy after {time.monotonic() - started:.1f} s; asking for a completion\n")
    answer = complete(port)
    speed = f", {answer.decode_tokens_per_s:.1f} tok/s decode" if answer.decode_tokens_per_s else ""
    out.print(
        Text.from_markup(
            f"\n{escape(DEMO_PROMPT)}[bold]{escape(answer.text.rstrip())}[/bold]\n"
            f"({answer.completion_tokens} tokens{speed})\n"
        ),
        highlight=False,
    )
    out.print(
        f"The stack keeps running on http://127.0.0.1:{port} (OpenAI API under /v1).\n"
        f"Stop it with: moe-stack down {compose_file}",
        highlight=False,
        soft_wrap=True,
    )
