"""The package layout's import rules, read from the source (every `import` statement, function-level
and TYPE_CHECKING ones included):

    cli                     may import anything below it
    stacks, distribute      making a stack (its steps, presets, outputs) and moving one (publish, bundle,
                            load); neither imports the other: a loaded bundle's stack is rebuilt from
                            the stack file's parts and the features'
    running, tuning         running an emitted stack (up, smoke, bench, its tools) and tuning it: they
                            read the stack file, never the making (tuning runs, running never tunes)
    features                a module per stack feature: its checks, bytes and part of the service
    stackfile               the typed stack file, its record and service parts (the file is made of
                            them), host checks
    images                  naming, rendering, building: over the adapters
    engines                 the engine adapters
    platform                CPU targets, toolchains, CUDA wheels, flag contracts, pins: under the adapters
    host, models            leaves: they import only the core
    core                    builder, errors, files, fd_files, spec, request, contract, safe_tar,
                            docker_client, container_start, untrusted_text

and only the modules that build, run or publish talk to Docker; every container they start is started
through builder.container_start (which starts it once more when the runtime lost its init).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "builder"
CORE = {
    "builder",
    "builder.errors",
    "builder.files",
    "builder.fd_files",
    "builder.spec",
    "builder.request",
    "builder.contract",
    "builder.safe_tar",
    "builder.docker_client",
    "builder.container_start",
    "builder.untrusted_text",
}
LAYER = {
    "core": 0,
    "host": 1,
    "models": 1,
    "platform": 2,
    "engines": 3,
    "images": 4,
    "stackfile": 5,
    "features": 6,
    "running": 6,
    "tuning": 7,
    "stacks": 8,
    "distribute": 8,
    "cli": 9,
}
DOCKER = {"builder.docker_client", "python_on_whales"}
# Those that build, run or publish, and three of the CLI's modules.
TALK_TO_DOCKER = {
    "builder.images.build",
    "builder.images.build_plan",  # one buildx call, its log streamed
    "builder.images.baseimage",
    "builder.images.cuda_base",
    "builder.images.image_facts",
    "builder.running.run",
    "builder.running.load_progress",  # reads the engine's log while `up` waits
    "builder.running.smoke",
    "builder.distribute.publish",
    "builder.images.prometheus",
    "builder.images.chat_page",  # the page's build runs in a container
    "builder.running.tool_run",
    "builder.running.kt_convert",
    "builder.distribute.bundle",
    "builder.cli.main",  # names the Docker client's own failure in one line
    "builder.cli.host",  # doctor asks whether Docker answers
    "builder.cli.models",  # kt-convert runs kt-kernel's converter in its image
}


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from builder.x import y`
    return {name for name in found if name.split(".")[0] in ("builder", "python_on_whales")}


GRAPH = {_module(path): _imports(path) for path in ROOT.rglob("*.py")}
MODULES = set(GRAPH)


def _targets(module: str) -> set[str]:
    """The builder modules `module` imports (a name imported from a module counts as that module)."""
    return {name for name in GRAPH[module] if name in MODULES and name != module}


def _group(module: str) -> str:
    if module in CORE or module == "builder.__main__":
        return "core"
    return module.split(".")[1]


def _closure(module: str) -> set[str]:
    seen, todo = set(), [module]
    while todo:
        for name in GRAPH.get(todo.pop(), set()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def test_every_module_is_in_a_layer() -> None:
    assert len(MODULES) > 50
    assert {_group(m) for m in MODULES} <= set(LAYER), sorted(m for m in MODULES if _group(m) not in LAYER)


def test_imports_point_down_or_across_their_own_layer() -> None:
    wrong = []
    for module in MODULES - {"builder.__main__"}:
        for target in _targets(module):
            mine, theirs = _group(module), _group(target)
            if LAYER[theirs] > LAYER[mine]:
                wrong.append(f"{module} -> {target}")
            elif LAYER[mine] == 1 and theirs not in ("core", mine):  # leaves
                wrong.append(f"{module} -> {target} (host and models import only the core)")
            elif {mine, theirs} == {"stacks", "distribute"}:
                wrong.append(f"{module} -> {target} (stacks and distribute are apart)")
            elif {mine, theirs} == {"features", "running"}:
                wrong.append(f"{module} -> {target} (running reads the file, not the features)")
    assert not wrong, "\n".join(sorted(wrong))


def test_only_building_running_and_publishing_talk_to_docker() -> None:
    talking = {m for m in MODULES if GRAPH[m] & DOCKER} - {"builder.docker_client"}
    assert talking == TALK_TO_DOCKER
    for module in (
        "builder.spec",
        "builder.images.naming",
        "builder.images.render",
        "builder.engines",
        "builder.running.tool_bench",
        *(m for m in MODULES if m.startswith("builder.engines.")),
    ):
        assert not _closure(module) & DOCKER, f"{module} reaches the Docker client"


@pytest.mark.parametrize(
    ("module", "target"),
    [
        ("builder.host.probe", "builder.images.render"),
        ("builder.engines.base", "builder.images.naming"),
        ("builder.platform.targets", "builder.engines.base"),
        ("builder.distribute.loaded_stack", "builder.stacks.document"),
        ("builder.running.smoke", "builder.features.keep_prompts"),
    ],
)
def test_the_rule_catches_a_wrong_import(module: str, target: str) -> None:
    """The check itself can fail: a leaf importing upwards, an adapter importing images/, the floor
    importing an adapter, a bundle's rebuild reaching into the making, running reaching a feature are
    reported."""
    GRAPH[module].add(target)
    try:
        try:
            test_imports_point_down_or_across_their_own_layer()
        except AssertionError as error:
            assert f"{module} -> {target}" in str(error)
        else:
            raise AssertionError(f"{module} importing {target} was not reported")
    finally:
        GRAPH[module].discard(target)


# What reads a model file's own format: an adapter's ModelFormat (builder.models.formats) is the way
# above the engines; the CLI's `doctor` names GGUF itself (its --model is "a GGUF").
FORMAT_READERS = {
    "builder.models.gguf_facts.read_facts",
    "builder.models.gguf_facts.split_parts",
    "builder.models.gguf_facts.model_bytes",
    "builder.models.model_files.check_gguf",
}


def test_above_the_engines_a_model_is_read_through_its_adapters_format() -> None:
    """stacks/ and distribute/ ask the engine's adapter (Engine.model_format) for a model's facts, files,
    size and name; none imports a GGUF reader or spells the suffix."""
    wrong = []
    for module in MODULES:
        if _group(module) not in ("stacks", "distribute"):
            continue
        wrong += [f"{module} imports {name}" for name in GRAPH[module] & FORMAT_READERS]
        path = ROOT.parent / module.replace(".", "/")
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
        wrong += [f"{module} spells .gguf"] if '.gguf"' in source or ".gguf'" in source else []
    assert not wrong, "\n".join(sorted(wrong))


def test_the_format_rule_catches_a_direct_reader() -> None:
    GRAPH["builder.stacks.assemble"].add("builder.models.gguf_facts.read_facts")
    try:
        with pytest.raises(AssertionError, match="builder.stacks.assemble imports builder.models.gguf_facts"):
            test_above_the_engines_a_model_is_read_through_its_adapters_format()
    finally:
        GRAPH["builder.stacks.assemble"].discard("builder.models.gguf_facts.read_facts")


STARTS = {
    ("container", "run"),
    ("compose", "up"),
    ("compose", "run"),
    ("client", "run"),
    ("docker_client", "run"),
}


def _start_sites(tree: ast.AST) -> list[ast.AST]:
    """Where a module starts a container or a process in one: a client's `container.run`, `compose.up`,
    `compose.run` or a container's `execute` (python-on-whales), or a `docker run` command line."""
    sites: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if (owner_name, node.func.attr) in STARTS or node.func.attr == "execute":
                sites.append(node)
        elif isinstance(node, ast.List) and _leading_words(node) == ["docker", "run"]:
            sites.append(node)
    return sites


def _leading_words(node: ast.List) -> list[object]:
    return [getattr(element, "value", None) for element in node.elts[:2]]


def _started_through(tree: ast.AST) -> tuple[set[str], list[ast.Lambda]]:
    """The functions whose calls start_container makes (the names its first argument reaches, and the names
    those functions' bodies call, transitively), and the lambdas passed to it."""
    functions = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    lambdas: list[ast.Lambda] = []
    todo: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "start_container" and node.args:
            first = node.args[0]
            lambdas += [first] if isinstance(first, ast.Lambda) else []
            todo.append(first)
    reached: set[str] = set()
    while todo:
        for node in ast.walk(todo.pop()):
            name = (
                node.id
                if isinstance(node, ast.Name)
                else node.attr
                if isinstance(node, ast.Attribute)
                else None
            )
            if name in functions and name not in reached:
                reached.add(name)
                todo.append(functions[name])
    return reached, lambdas


def _unwrapped_starts(paths: list[Path]) -> tuple[list[str], int]:
    """The container starts in `paths` made outside a function start_container runs, and their count."""
    unwrapped, counted = [], 0
    for path in paths:
        tree = ast.parse(path.read_text())
        reached, lambdas = _started_through(tree)
        enclosing = {
            id(inner): outer.name
            for outer in ast.walk(tree)
            if isinstance(outer, (ast.FunctionDef, ast.AsyncFunctionDef))
            for inner in ast.walk(outer)
        }
        inside_lambda = {id(inner) for lam in lambdas for inner in ast.walk(lam)}
        for site in _start_sites(tree):
            counted += 1
            if id(site) not in inside_lambda and enclosing.get(id(site)) not in reached:
                unwrapped.append(f"{path.relative_to(ROOT.parent)}:{site.lineno}")  # type: ignore[attr-defined]
    return unwrapped, counted


def test_every_container_start_goes_through_the_one_start_path() -> None:
    """A container start on a busy host can fail before anything runs (runc's lost init): each one is made
    inside a function start_container runs, so it is started once more and said, not reported as the
    program's failure."""
    unwrapped, counted = _unwrapped_starts(
        [path for path in sorted(ROOT.rglob("*.py")) if path.name != "container_start.py"]
    )
    assert counted >= 7, counted  # up, a tool's run, an image's run, two execs, kt-convert, the sandbox
    assert not unwrapped, "started without builder.container_start: " + ", ".join(unwrapped)


def test_the_suites_own_container_starts_go_through_it_too() -> None:
    """The suite's execs and image runs (tests/integration/starts.py) survive the same hiccup: stop 66's CI
    failed on a test's `docker exec` the runtime lost, not on anything moe-stack did. So do the benchmarks'
    (bench/*.py: a soak's look at the prompts volume)."""
    files = [*(ROOT.parent / "tests" / "integration").glob("*.py"), *(ROOT.parent / "bench").glob("*.py")]
    unwrapped, counted = _unwrapped_starts(sorted(files))
    assert counted >= 3, counted  # an exec, an image's run, a `docker run` line
    assert not unwrapped, "started without builder.container_start: " + ", ".join(unwrapped)
