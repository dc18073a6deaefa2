"""`moe-stack bench`: the engine's own prefill and decode figures for a running stack."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.models.model_files import DEMO_CHAT_TEMPLATE
from tests.cli import run_cli
from tests.integration.conftest import StackFactory, build_engine_image

pytestmark = pytest.mark.integration


def test_bench_reports_prefill_and_decode(
    base_image: str, gemma_model: Path, start_stack: StackFactory
) -> None:
    stack = start_stack(
        build_engine_image("llama.cpp", "avx2", base_image), gemma_model, chat_template=DEMO_CHAT_TEMPLATE
    )
    result = run_cli("bench", str(stack.compose_file), "--prompt-words", "64", "-n", "16", "-r", "2")
    assert result.returncode == 0, result.stderr
    rows = {
        m[0]: (int(m[1]), float(m[2]))
        for m in re.findall(r"^\s*(prefill|decode)\s+(\d+)\s+([\d.]+)", result.stdout, re.MULTILINE)
    }
    assert set(rows) == {"prefill", "decode"}, result.stdout
    assert rows["prefill"][0] >= 64 and rows["decode"][0] == 16
    assert rows["prefill"][1] > 0 and rows["decode"][1] > 0
    # Its decode against the read rate measured inside the engine's container (the image's tool).
    bound = re.search(
        r"^decode ([\d.]+) t/s = ([\d.]+) of the bandwidth bound "
        r"\(([\d.]+) GB/s .*÷ ([\d.]+) MB read per token\)",
        result.stdout,
        re.MULTILINE,
    )
    assert bound is not None, result.stdout
    decode, ratio, read_gbps, megabytes = (float(value) for value in bound.groups())
    assert abs(decode - rows["decode"][1]) < 0.1 and read_gbps > 0 and megabytes > 0
    assert ratio == pytest.approx(decode / (read_gbps * 1e3 / megabytes), abs=0.01)
