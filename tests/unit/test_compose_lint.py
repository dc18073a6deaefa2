"""Emitted stacks pass a compose security linter (compose-lint), every finding justified by the
reasons the stack records in `x-moe-stack.lint-exceptions`, and no reason without a finding."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from builder.engines.base import StackSpec
from builder.stacks.compose import compose_stack
from builder.stacks.document import cpu_only
from tests.specs import readable_file
from tests.tools import dependency_command

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "compose").glob("*.*.yaml"))


def _lint(compose_file: Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
    args = [
        dependency_command("compose-lint"),
        "check",
        "--format",
        "json",
        "--fail-on",
        "low",
        "--strict-config",
    ]
    return subprocess.run(
        [*args, *(["--config", str(config)] if config else []), str(compose_file)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _emitted(tmp_path: Path) -> list[Path]:
    model = readable_file(tmp_path / "m" / "x.gguf", b"GGUF")
    key = readable_file(tmp_path / "key", b"k\n")
    base = {"project_name": "p", "image_ref": "img:1", "model": model, "cpu_threads": 8}
    stacks = {
        "plain": StackSpec(engine="llama.cpp", **base),
        "numa-mlock-gpu-key": StackSpec(
            engine="ik_llama.cpp",
            numa_policy="interleave",
            mlock=True,
            gpu="nvidia",
            hugepages=True,
            api_key_file=key,
            **base,
        ),
        "hugetlbfs": StackSpec(engine="llama.cpp", hugetlbfs="2M", **base),
    }
    files = []
    for name, stack in stacks.items():
        path = tmp_path / f"{name}.yaml"
        profile = (cpu_only(stack, "img:cpu"), None) if stack.gpu != "none" else None
        path.write_text(compose_stack(stack, "test", cpu_profile=profile).to_yaml())
        files.append(path)
    return files


@pytest.mark.lint
@pytest.mark.parametrize("which", ["examples", "emitted"])
def test_every_finding_is_justified_by_the_stack(which: str, tmp_path: Path) -> None:
    for compose_file in EXAMPLES if which == "examples" else _emitted(tmp_path):
        document = yaml.safe_load(compose_file.read_text())
        reasons: dict[str, str] = document["x-moe-stack"]["lint-exceptions"]
        bare = _lint(compose_file)
        found = {finding["rule_id"] for finding in json.loads(bare.stdout)["findings"]}
        assert found == set(reasons), (
            f"{compose_file.name}: findings {sorted(found)}, reasons {sorted(reasons)}"
        )
        config = tmp_path / "compose-lint.yml"
        config.write_text(
            yaml.safe_dump(
                {
                    "rules": {
                        rule: {"exclude_services": {name: reason for name in document["services"]}}
                        for rule, reason in reasons.items()
                    }
                }
            )
        )
        justified = _lint(compose_file, config)
        assert justified.returncode == 0, justified.stdout + justified.stderr
