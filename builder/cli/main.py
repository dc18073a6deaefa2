"""`moe-stack` command line: the app, its verbs by noun (images, matrix, models, plan, host, stack,
measure, distribute), and the one place an error becomes one line."""

from __future__ import annotations

import sys
from collections.abc import Callable

import typer
from pydantic import ValidationError
from python_on_whales.exceptions import DockerException
from typer.exceptions import TyperException

from builder import __version__
from builder.cli import distribute, host, images, matrix, measure, models, plan, stack
from builder.cli.common import first_paragraph, out
from builder.docker_client import describe
from builder.errors import INTERRUPTED_MESSAGE, BuildFailed, Interrupted, MoeStackError, SpecError
from builder.request import ENGINE_OPTIONS

app = typer.Typer(
    name="moe-stack",
    help="Build engine images and compose stacks for hybrid CPU+GPU MoE inference.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

_INTERRUPTED = 130  # 128 + SIGINT


def main(argv: list[str] | None = None) -> None:
    """Entry point that turns every expected failure into one line: exit status 1 for a problem the
    user can fix, 2 for a misused command line, 130 for Ctrl-C."""
    try:
        status = app(argv, standalone_mode=False)
    except Interrupted as error:
        _fail(error, _INTERRUPTED)
    except MoeStackError as error:
        _fail(error)
    except ValidationError as error:
        _fail(SpecError(_validation_line(error)))
    except DockerException as error:  # a docker call no module anticipated: still one line
        _fail(MoeStackError(f"docker failed: {describe(error)}"))
    except typer.Abort:
        status = _INTERRUPTED
    except TyperException as error:  # the command line itself: unknown option, bad value...
        _usage_error(error)
    if status == _INTERRUPTED:  # typer turns Ctrl-C into this status
        _fail(Interrupted(INTERRUPTED_MESSAGE), _INTERRUPTED)
    sys.exit(status if isinstance(status, int) else 0)


def _fail(error: MoeStackError, status: int = 1) -> None:
    if isinstance(error, BuildFailed) and error.tail:
        sys.stderr.write(error.tail + "\n")
    sys.stderr.write(f"moe-stack: error: {_one_line(str(error))}\n")
    sys.exit(status)


def _one_line(text: str) -> str:
    """`text` with every unprintable character escaped: what the user typed can't break the line."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _usage_error(error: TyperException) -> None:
    context = getattr(error, "ctx", None)
    message = error.format_message() if hasattr(error, "format_message") else str(error)
    if not message:  # `moe-stack` alone: the help was printed
        sys.exit(2)
    where = f"`{context.command_path} --help`" if context is not None else "`moe-stack --help`"
    sys.stderr.write(f"moe-stack: error: {_one_line(message)}; see {where}\n")
    sys.exit(getattr(error, "exit_code", 2))


def _validation_line(error: ValidationError) -> str:
    """The first problem, named by the option the user gave (`--ctx-size`, not `ctx_size`)."""
    first = error.errors()[0]
    field = next((str(part) for part in reversed(first["loc"]) if isinstance(part, str)), "")
    where = ENGINE_OPTIONS.get(field, f"--{field.replace('_', '-')}") if field else ""
    message = first["msg"].removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def version() -> None:
    """Print moe-stack's version."""
    out.print(__version__)


# The verbs in the order `moe-stack --help` lists them.
VERBS: tuple[tuple[str, Callable[..., None]], ...] = (
    ("render", images.render),
    ("build", images.build),
    ("cmake-args", images.cmake_args),
    ("sources", images.sources),
    ("base", images.base),
    ("fetch-model", models.fetch_model),
    ("synth-moe", models.synth_moe),
    ("kt-convert", models.kt_convert),
    ("presets", models.list_presets),
    ("plan", plan.plan_memory),
    ("doctor", host.doctor),
    ("matrix", matrix.matrix),
    ("refs", matrix.refs),
    ("compose", stack.compose),
    ("up", stack.up),
    ("bench", measure.bench),
    ("tune", measure.tune),
    ("smoke", measure.smoke),
    ("down", stack.down),
    ("demo", stack.demo),
    ("publish", distribute.publish),
    ("pull", distribute.pull),
    ("bundle", distribute.bundle),
    ("load", distribute.load),
    ("version", version),
)
for _name, _verb in VERBS:
    # the top-level help lists each verb's first paragraph as one line
    app.command(_name, short_help=first_paragraph(_verb.__doc__))(_verb)
