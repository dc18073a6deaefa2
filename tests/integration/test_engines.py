"""Both engines, end to end: a real image from real sources, serving real models over HTTP."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
import yaml
from python_on_whales import DockerClient

from builder.errors import StackError
from builder.files import cache_dir
from builder.images.prometheus import make_prometheus
from builder.models.gguf_facts import read_facts
from builder.models.model_files import DEMO_CHAT_TEMPLATE
from builder.platform.toolchain import CPU_BASE_SUITE
from builder.running.api import EngineApi
from builder.running.client_checks import ANTHROPIC_TOOL, REPLY_SCHEMA, TOOL, clients_for
from builder.running.run import down, up
from builder.running.smoke import api_checks
from builder.spec import EXPERTS_ON_CPU_RULE
from builder.stackfile.host_checks import free_local_port
from builder.stacks.demo import DEMO_PROMPT, chat, complete
from tests.cli import run_cli
from tests.integration.conftest import BuiltImage, StackFactory, build_engine_image, emit_stack
from tests.integration.starts import docker_run, run_image, run_in

pytestmark = pytest.mark.integration

# Gemma's turns with tools rendered and a call written as bare JSON, as templates of JSON-calling models
# do: the engines' autoparser reads the call's shape from it. Gemma 3 270M is a base model (its GGUF
# carries no template): after one earlier call in the conversation it calls the tool.
TOOL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message.role == 'tool' %}<start_of_turn>user\nResult: {{ message.content }}<end_of_turn>\n"
    "{% elif message.role == 'assistant' %}<start_of_turn>model\n"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    '{"name": "{{ call.function.name }}", "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}"
    "{% endfor %}{% elif message.content %}{{ message.content | trim }}{% endif %}<end_of_turn>\n"
    "{% else %}<start_of_turn>user\n"
    "{% if loop.last and tools %}Functions: {% for tool in tools %}{{ tool.function.name }} {% endfor %}"
    "(answer with a JSON call)\n{% endif %}{{ message.content | trim }}<end_of_turn>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.load(response)


def test_image_metadata(docker_client: DockerClient, engine_image: BuiltImage) -> None:
    config = docker_client.image.inspect(engine_image.tag).config
    assert config.user == "10001:10001"
    assert config.entrypoint == ["/usr/local/bin/moe-stack-entrypoint"]
    assert config.healthcheck is not None and config.healthcheck.test[-1] == "/usr/local/bin/moe-stack-health"
    labels = config.labels
    assert labels["io.moe-stack.engine"] == engine_image.engine
    assert labels["io.moe-stack.engine-ref"] == engine_image.ref
    assert labels["io.moe-stack.cpu-target"] == "avx2"
    assert "avx2" in labels["io.moe-stack.required-cpu-flags"].split()
    assert labels["org.opencontainers.image.created"].endswith("Z")


def test_binary_reports_the_pinned_ref_as_non_root(
    docker_client: DockerClient, engine_image: BuiltImage
) -> None:
    identity = run_image(
        docker_client, engine_image.tag, ["-c", "id -u; id -g"], entrypoint="/bin/sh", remove=True
    )
    assert identity.split() == ["10001", "10001"]
    # --version prints to stderr: go through the real entrypoint with stderr folded into stdout
    version = run_image(
        docker_client,
        engine_image.tag,
        ["-c", "moe-stack-entrypoint --version 2>&1"],
        entrypoint="/bin/sh",
        remove=True,
    )
    assert engine_image.ref in version, version


def test_isa_guard_names_missing_flags(engine_image: BuiltImage, tmp_path: Path) -> None:
    flags = tmp_path / "required-cpu-flags"
    flags.write_text("avx2 moe_stack_no_such_flag\n")
    flags.chmod(0o644)
    result = docker_run(
        ["-v", f"{flags}:/etc/moe-stack/required-cpu-flags:ro", engine_image.tag, "--version"], timeout=120
    )
    assert result.returncode == 78
    assert result.stderr.strip() == (
        "moe-stack: this image needs CPU flags this host lacks: moe_stack_no_such_flag; use an image built "
        "for this CPU (moe-stack doctor names it)"
    )


def test_doctor_reads_the_decode_bound_in_an_engine_image(base_image: str, moe_model: Path) -> None:
    image = build_engine_image("llama.cpp", "avx2", base_image)  # the default tier's, already built
    result = run_cli("doctor", "--bandwidth", image.tag, "--model", str(moe_model), "--json")
    found = {f["topic"]: f for f in json.loads(result.stdout)}["bandwidth"]
    assert found["level"] == "OK", found
    said = re.fullmatch(
        r"memory read rate ([\d.]+) GB/s \(median ([\d.]+), min ([\d.]+)\), best of 5 rounds "
        rf"\(moe-stack-bandwidth in {re.escape(image.tag)}\); hybrid decode can't pass ([\d.]+) t/s "
        r"\(([\d.]+) MB read a token\), CPU-only decode can't pass ([\d.]+) t/s \(([\d.]+) MB read a token\)",
        found["message"],
    )
    assert said is not None, found["message"]
    best, median, low, hybrid_tps, hybrid_mb, cpu_tps, cpu_mb = map(float, said.groups())
    assert 0 < low <= median <= best
    # The ceilings: the read rate over what a token reads (the routed experts alone in hybrid)
    routed, every = (read_facts(moe_model).read_per_token(hybrid) for hybrid in (True, False))
    assert (hybrid_mb, cpu_mb) == (round(routed / 1e6, 1), round(every / 1e6, 1))
    assert hybrid_tps == pytest.approx(best * 1e9 / routed, rel=0.01)
    assert cpu_tps == pytest.approx(best * 1e9 / every, rel=0.01)
    missing = run_cli("doctor", "--bandwidth", "moe-stack-test/no-such-image:1", "--json")
    warned = {f["topic"]: f for f in json.loads(missing.stdout)}["bandwidth"]
    assert warned["level"] == "WARN", warned
    assert "no image moe-stack-test/no-such-image:1" in warned["message"], warned


def test_gemma_answers_a_chat(engine_image: BuiltImage, gemma_model: Path, start_stack: StackFactory) -> None:
    stack = start_stack(engine_image, gemma_model, chat_template=DEMO_CHAT_TEMPLATE)
    config = subprocess.run(
        ["docker", "compose", "-f", str(stack.compose_file), "config", "--quiet"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert config.returncode == 0, config.stderr
    answer = chat(
        stack.port, prompt="What colour is the sky on a clear day? Answer in one word.", max_tokens=16
    )
    assert answer.text.strip(), "empty answer"
    assert "<start_of_turn>" not in answer.text and "<|im_" not in answer.text, answer.text
    assert answer.completion_tokens > 0
    # The built-in template renders Gemma's turns (with Jinja on, the name itself was the template)
    rendered = _post(f"{stack.url}/apply-template", {"messages": [{"role": "user", "content": "hi"}]})
    assert "<start_of_turn>user\nhi<end_of_turn>" in str(rendered["prompt"]), rendered
    # Gemma 3 270M is a base model: a plain completion shows it really reads the prompt
    assert "France" in complete(stack.port, DEMO_PROMPT, max_tokens=8).text
    container = stack.client.compose.ps()[0]
    assert run_in(container, ["id", "-u"]).strip() == "10001"
    assert container.state.health.status == "healthy"


def test_agents_speak_to_it_through_the_official_clients(
    engine_image: BuiltImage, gemma_model: Path, start_stack: StackFactory
) -> None:
    """What coding agents speak, through their own clients: OpenAI's chat (whole, streamed, with tools)
    and Responses, Anthropic's Messages (whole, streamed, with tools) and its token count; Gemma with a
    Jinja template that renders tools. Then smoke's client checks on the same stack, the tool calls
    among them: a real model calls the tool through both clients, its arguments what the schema admits."""
    stack = start_stack(engine_image, gemma_model, chat_template=TOOL_TEMPLATE, served_name="gemma")
    clients = clients_for(EngineApi(stack.port), "gemma", tool_calls=True)
    ask = [{"role": "user", "content": "What colour is the sky on a clear day? Answer in one word."}]
    whole = clients.openai.chat.completions.create(model="gemma", messages=ask, max_tokens=16, temperature=0)
    text = whole.choices[0].message.content or ""
    assert text.strip() and "<start_of_turn>" not in text, whole
    assert (
        whole.choices[0].finish_reason in {"stop", "length"} and whole.usage and whole.usage.prompt_tokens > 0
    )
    pieces = clients.openai.chat.completions.create(
        model="gemma", messages=ask, max_tokens=16, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in pieces if c.choices) == text  # greedy: the same
    tools = clients.openai.chat.completions.create(
        model="gemma", messages=ask, max_tokens=16, temperature=0, tools=[TOOL]
    )
    assert tools.choices[0].finish_reason in {"stop", "length", "tool_calls"}, tools
    # Structured output: the reply is JSON the schema admits (both engines turn it into a grammar).
    shaped = clients.openai.chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "The weather in Paris for two days, as JSON."}],
        max_tokens=256,  # the longest reply the schema's grammar allows
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "forecast", "schema": REPLY_SCHEMA}},
    )
    jsonschema.validate(json.loads(shaped.choices[0].message.content or ""), REPLY_SCHEMA)
    response = clients.openai.responses.create(model="gemma", input=ask[0]["content"], max_output_tokens=16)
    assert response.output_text.strip() and response.usage and response.usage.output_tokens > 0, response
    message = clients.anthropic.messages.create(model="gemma", max_tokens=16, messages=ask)
    said = "".join(block.text for block in message.content if block.type == "text")
    assert said.strip() and message.stop_reason in {"end_turn", "max_tokens"}, message
    assert message.usage.output_tokens > 0
    with clients.anthropic.messages.stream(model="gemma", max_tokens=16, messages=ask) as stream:
        assert "".join(stream.text_stream).strip()
        assert stream.get_final_message().stop_reason in {"end_turn", "max_tokens"}
    with_tools = clients.anthropic.messages.create(
        model="gemma", max_tokens=16, messages=ask, tools=[ANTHROPIC_TOOL]
    )
    assert with_tools.content and with_tools.stop_reason in {"end_turn", "max_tokens", "tool_use"}, with_tools
    counted = clients.anthropic.messages.count_tokens(model="gemma", messages=ask)
    # The prompt counted whole: what the reply read fresh plus what it found in the prompt cache.
    cached = message.usage.cache_read_input_tokens or 0
    assert counted.input_tokens == message.usage.input_tokens + cached > 0, message.usage
    # smoke, as a user runs it on this stack: every API answers, the tools called (`tool_choice`
    # required and any, after one earlier call in the conversation)
    checks = {check.name: check for check in api_checks(stack.compose_file, EngineApi(stack.port))}
    assert set(checks) == {"served-name", "completion", "chat", "chat-stream", "tool-call",
                           "structured-output", "image", "responses", "messages", "messages-stream",
                           "messages-tool-use", "messages-image", "count-tokens", "metrics"}  # fmt: skip
    for image in ("image", "messages-image"):  # no projector in this stack
        assert checks[image].seen.startswith("not asked"), checks[image]
    assert all(check.passed for check in checks.values()), checks
    for name in ("tool-call", "messages-tool-use"):  # what each client parsed: get_weather({...})
        called = re.fullmatch(r"get_weather\((\{.*\})\)(, tool_use|, max_tokens)?", checks[name].seen)
        assert called, checks[name]
        jsonschema.validate(json.loads(called.group(1)), REPLY_SCHEMA)


def test_moe_serves_with_experts_on_cpu(
    engine_image: BuiltImage, moe_model: Path, start_stack: StackFactory
) -> None:
    stack = start_stack(engine_image, moe_model, override_tensors=(EXPERTS_ON_CPU_RULE,))
    reply = _post(
        f"{stack.url}/completion",
        {"prompt": "hello expert", "n_predict": 8, "ignore_eos": True, "temperature": 0},
    )
    assert reply["tokens_predicted"] == 8 and reply["content"], reply
    command = stack.client.compose.ps()[0].config.cmd
    assert ["--override-tensor", EXPERTS_ON_CPU_RULE] == command[command.index("--override-tensor") :][:2]


def test_served_name_tool_calls_and_metrics(
    engine_image: BuiltImage, moe_model: Path, start_stack: StackFactory
) -> None:
    """What clients rely on: one model name whatever the engine, a `tools` request accepted (ik_llama.cpp
    needs --jinja for it; the synthetic model has no template, so the engines' ChatML one serves),
    and the Prometheus endpoint."""
    stack = start_stack(engine_image, moe_model, served_name="tiny-moe")
    with urllib.request.urlopen(f"{stack.url}/v1/models", timeout=30) as response:
        assert [model["id"] for model in json.load(response)["data"]] == ["tiny-moe"]
    reply = _post(
        f"{stack.url}/v1/chat/completions",
        {
            "model": "tiny-moe",
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "tools": [TOOL],
            "max_tokens": 8,
            "temperature": 0,
        },
    )
    choices = reply["choices"]
    assert isinstance(choices, list) and choices[0]["message"]["role"] == "assistant", reply
    with urllib.request.urlopen(f"{stack.url}/metrics", timeout=30) as response:
        metrics = response.read().decode()
    assert "llamacpp:prompt_tokens_total" in metrics and "llamacpp:tokens_predicted_total" in metrics, (
        metrics[:500]
    )
    command = stack.client.compose.ps()[0].config.cmd
    assert (
        "--jinja" in command
        and "--metrics" in command
        and command[command.index("--alias") + 1] == "tiny-moe"
    )


def test_engine_rejects_an_unknown_buffer_type(
    engine_image: BuiltImage, moe_model: Path, tmp_path: Path
) -> None:
    """The -ot rule reaches the engine's parser: a bad buffer type stops the stack, and `moe-stack up`
    says so with the engine's log."""
    compose_file, _ = emit_stack(
        tmp_path, engine_image, moe_model, override_tensors=("ffn_.*_exps=NO_SUCH_BUFFER",)
    )
    try:
        with pytest.raises(StackError, match="did not become healthy.*(--override-tensor|NO_SUCH_BUFFER)"):
            up(compose_file, timeout_s=60)
    finally:
        down(compose_file)


def test_two_models_behind_one_router(
    base_image: str, gemma_model: Path, moe_model: Path, tmp_path: Path
) -> None:
    """`compose --model A --model B`: mainline's router on one port serves both under their names,
    one loaded at a time (--models-max 1), each with its own flags from the preset the stack passes."""
    image = build_engine_image("llama.cpp", "avx2", base_image)
    models = tmp_path / "models"
    models.mkdir(mode=0o755)
    second = models / "tiny-moe.gguf"
    shutil.copy(moe_model, second)
    second.chmod(0o644)
    port = free_local_port()
    compose_file = tmp_path / "compose.yaml"
    emitted = run_cli(
        "compose",
        "--model",
        str(gemma_model),
        "--model",
        str(second),
        "--image",
        image.tag,
        "--threads",
        "2",
        "--idle-unload",
        "3s",
        "--port",
        str(port),
        "--out",
        str(compose_file),
    )
    assert emitted.returncode == 0, emitted.stderr
    try:
        up(compose_file, timeout_s=180)
        url = f"http://127.0.0.1:{port}"
        for name, prompt in (
            ("gemma-3-270m-q4_k_m", DEMO_PROMPT),
            ("tiny-moe", "hello"),
            ("gemma-3-270m-q4_k_m", "x"),
        ):
            reply = _post(
                f"{url}/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 4, "temperature": 0}
            )
            assert reply["usage"]["completion_tokens"] > 0, reply
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
            listed = {
                model["id"]: model.get("status", {}).get("value") for model in json.load(response)["data"]
            }
        assert set(listed) == {"gemma-3-270m-q4_k_m", "tiny-moe"}
        assert sorted(listed.values()).count("loaded") == 1, listed  # the last one asked for, alone
        # --idle-unload reaches each model's server: the loaded one goes to sleep when left alone
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and "sleeping" not in listed.values():
            time.sleep(1)
            with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:
                listed = {m["id"]: m.get("status", {}).get("value") for m in json.load(response)["data"]}
        assert "sleeping" in listed.values(), listed
    finally:
        down(compose_file)


def test_an_idle_model_is_freed_and_loaded_again(
    base_image: str, moe_model: Path, start_stack: StackFactory
) -> None:
    """`--idle-unload`: mainline's server frees the model once idle that long (its /props says it
    sleeps, its log says so) and the next request loads it again."""
    stack = start_stack(build_engine_image("llama.cpp", "avx2", base_image), moe_model, idle_unload=2)

    def sleeping() -> bool:
        with urllib.request.urlopen(f"{stack.url}/props", timeout=30) as response:
            return bool(json.load(response)["is_sleeping"])

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not sleeping():
        time.sleep(1)
    assert sleeping(), "the server never went to sleep"
    reply = _post(f"{stack.url}/completion", {"prompt": "hello", "n_predict": 4, "ignore_eos": True})
    assert reply["tokens_predicted"] == 4, reply
    logs = str(stack.client.compose.logs())
    assert "entering sleeping state" in logs and "exiting sleeping state" in logs, logs[-2000:]
    command = stack.client.compose.ps()[0].config.cmd
    assert command[command.index("--sleep-idle-seconds") + 1] == "2"


def test_monitoring_scrapes_the_engine(base_image: str, moe_model: Path, start_stack: StackFactory) -> None:
    """`compose --monitoring`: Prometheus (Debian's package, `moe-stack base --prometheus`) beside the
    engine has its token counters a scrape after a completion."""
    make_prometheus(
        base_image,
        CPU_BASE_SUITE,
        cache_dir() / "contexts",
        show=lambda line: None,
        log_path=cache_dir() / "logs" / "prometheus-test.log",
    )
    monitoring_port = free_local_port()
    stack = start_stack(
        build_engine_image("llama.cpp", "avx2", base_image),
        moe_model,
        monitoring=True,
        monitoring_port=monitoring_port,
    )
    _post(f"{stack.url}/completion", {"prompt": "hello", "n_predict": 4, "ignore_eos": True})
    query = f"http://127.0.0.1:{monitoring_port}/api/v1/query?query=llamacpp:tokens_predicted_total"
    deadline, found = time.monotonic() + 60, []
    while time.monotonic() < deadline and not (found and float(found[0]["value"][1]) >= 4):
        time.sleep(2)  # a scrape every 10 s; the first may have been before the completion
        try:
            with urllib.request.urlopen(query, timeout=10) as response:
                found = json.load(response)["data"]["result"]
        except OSError:  # Prometheus answers 503 until its storage is open
            pass
    assert found and float(found[0]["value"][1]) >= 4, found
    assert found[0]["metric"]["instance"] == "engine:8080"


def test_a_missing_local_image_is_never_pulled(base_image: str, moe_model: Path, tmp_path: Path) -> None:
    """The monitoring image is made here (`moe-stack base --prometheus`); its name would resolve to Docker
    Hub, so a missing one is named with the command that makes it, and nothing is pulled or started."""
    compose_file, _ = emit_stack(
        tmp_path,
        build_engine_image("llama.cpp", "avx2", base_image),
        moe_model,
        monitoring=True,
        monitoring_port=free_local_port(),
    )
    text = compose_file.read_text()
    missing = f"moe-stack/prometheus:absent-{tmp_path.name[-12:].lower()}"
    assert f"image: moe-stack/prometheus:{CPU_BASE_SUITE}\n    pull_policy: never" in text
    compose_file.write_text(text.replace(f"moe-stack/prometheus:{CPU_BASE_SUITE}", missing))
    with pytest.raises(
        StackError, match=rf"{missing}, which is made on this host .*`moe-stack base --prometheus`"
    ):
        up(compose_file, timeout_s=30)
    assert not DockerClient(compose_files=[compose_file]).compose.ps()


def test_an_image_that_cannot_be_pulled_is_named(base_image: str, moe_model: Path, tmp_path: Path) -> None:
    """`up` of a stack whose image is neither here nor pullable said "did not become healthy … engine
    log: (empty)"; it names the image and what to run."""
    compose_file, _ = emit_stack(tmp_path, build_engine_image("llama.cpp", "avx2", base_image), moe_model)
    document = yaml.safe_load(compose_file.read_text())
    absent = "127.0.0.1:9/moe-stack-test/llama-cpp:absent"  # port 9 (discard): no registry answers
    document["services"]["engine"]["image"] = absent
    compose_file.write_text(yaml.safe_dump(document, sort_keys=False))
    try:
        with pytest.raises(
            StackError, match=rf"image {absent} is not here and compose could not pull it .*`moe-stack pull`"
        ):
            up(compose_file, timeout_s=60)
    finally:
        down(compose_file)
