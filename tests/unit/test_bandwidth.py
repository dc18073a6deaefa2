"""moe-stack-bandwidth (dockerfiles/common/moe-stack-bandwidth.c), built here with gcc and run: its
figures within twofold of an independent plain read loop's (tests/unit/data/read_reference.c), it refuses bad
arguments in one line, and the readers parse what it prints."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from builder.running.bandwidth import ReadBandwidth, parse_bandwidth
from builder.running.tool_bench import NativeRunner
from builder.tuning.tune_stack import read_bandwidth

ROOT = Path(__file__).resolve().parents[2]
TOOL_SOURCE = ROOT / "dockerfiles/common/moe-stack-bandwidth.c"
REFERENCE_SOURCE = Path(__file__).parent / "data/read_reference.c"
MIB = 1024  # beyond the caches a CI runner or this host has (256 MiB still hit a VM host's L3 here)
PAIRS = 6  # turns of the tool and the reference: their ratios' median stands against one busy pair

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


def _build(source: Path, out: Path, *flags: str) -> Path:
    subprocess.run(
        ["gcc", "-O3", "-fopenmp", "-Wall", "-Wextra", "-Werror", *flags, "-o", str(out), str(source)],
        check=True,
    )
    return out


@pytest.fixture(scope="module")
def tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(TOOL_SOURCE, tmp_path_factory.mktemp("bw") / "moe-stack-bandwidth", "-march=native")


def _run(*argv: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=env, check=False)


@needs_gcc
def test_paired_rounds_put_the_tool_within_twofold_of_a_reference_loop(tool: Path, tmp_path: Path) -> None:
    """The tool and a reference loop take turns, PAIRS times, each its best of 5 rounds; the median of the
    pairs' ratios lies in 0.55-1.8, which a byte count off twofold (or a read of half the array) fails.
    The reference is one OpenMP reduction the compiler vectorises at full width, its threads bound by the
    OpenMP runtime, not by the tool's code. What this bound can't tell on a shared 2-core VM: the old tool
    (0.62-0.72 of the rate on the device) from the new one, or a thread that never ran (one core nearly
    fills this VM's memory bandwidth). On the idle H200 host the two agree within 1 %
    (bench/results/decode-bound-2026-12-03): that is the tool's proof."""
    reference = _build(REFERENCE_SOURCE, tmp_path / "ref", "-march=native", "-mprefer-vector-width=512")
    env = {**os.environ, "OMP_PROC_BIND": "close", "OMP_PLACES": "cores"}
    ratios = []
    for _ in range(PAIRS):
        printed = _run(tool, str(MIB), "--rounds", "5").stdout
        figures = parse_bandwidth(printed)
        assert figures is not None, printed
        assert figures.low is not None and figures.median is not None
        assert figures.low <= figures.median <= figures.best
        found = re.search(r"reference read GB/s ([\d.]+)", _run(reference, str(MIB), "5", env=env).stdout)
        assert found is not None
        ratios.append(figures.best / float(found[1]))
    spread = f"pairs' ratios {sorted(round(r, 2) for r in ratios)}"
    assert 0.55 <= statistics.median(ratios) <= 1.8, spread


@needs_gcc
def test_the_tool_says_what_it_ran_on(tool: Path) -> None:
    printed = _run(tool, "64", "--rounds", "3", "--pages", "4k").stdout
    allowed = len(os.sched_getaffinity(0))
    assert f"threads {allowed}\n" in printed and "pages 4k\n" in printed and "rounds 3\n" in printed
    one = _run(tool, "64", "--rounds", "1", env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    assert "threads 1\n" in one


@needs_gcc
@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["10"], "the array size is 64 to 1048576 MiB, not 10"),
        (["64", "--rounds", "0"], "the rounds are 1 to 1000, not 0"),
        (["64", "--pages", "8k"], "the pages are default, 4k, thp, 2m or 1g, not 8k"),
        (["64", "--rounds"], "unknown or incomplete option --rounds"),
    ],
)
def test_bad_arguments_in_one_line(tool: Path, argv: list[str], says: str) -> None:
    done = _run(tool, *argv)
    assert done.returncode == 64 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and says in done.stderr


def test_the_readers_parse_the_tool_and_its_predecessor() -> None:
    printed = "threads 16\ncpus 0-15\npages default\nread GB/s 213.5\nread median GB/s 206.5\n"
    figures = parse_bandwidth(printed + "read min GB/s 183.0\n")
    assert figures == ReadBandwidth(best=213.5, median=206.5, low=183.0)
    assert figures.describe() == "213.5 GB/s (median 206.5, min 183.0)"
    old = "threads 16\nread GB/s 90.6\ntriad GB/s 85.7\n(check 3)\n"
    assert parse_bandwidth(old) == ReadBandwidth(best=90.6)
    assert parse_bandwidth("moe-stack-bandwidth: can't map 2048 MiB on 2m pages\n") is None


@needs_gcc
def test_tune_runs_the_probe_once_more_after_a_failure_and_then_says_why_it_has_none(
    tool: Path, tmp_path: Path
) -> None:
    # The first run fails as a container's start can on a busy host; the second is the real tool.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "moe-stack-bandwidth"
    wrapper.write_text(
        f'#!/bin/sh\n[ -e "{tmp_path}/ran" ] || {{ touch "{tmp_path}/ran"; echo "error: busy" >&2; exit 1; }}'
        "\n"
        f'exec "{tool}" "$@"\n'
    )
    wrapper.chmod(0o755)
    said: list[str] = []
    found = read_bandwidth(NativeRunner(bin_dir, tmp_path), {}, said.append)
    assert found is not None and found.best > 0
    assert "error: busy" in said[0] and said[0].endswith("; once more")
    assert said[1].startswith("memory read rate")
    wrapper.write_text("#!/bin/sh\necho 'read at an unknown rate'\n")
    said.clear()
    assert read_bandwidth(NativeRunner(bin_dir, tmp_path), {}, said.append) is None
    assert len(said) == 2 and "unknown rate" in said[1] and said[1].endswith("so no bound ratio")
    # A native build without the tool (the device's, 2026-12-06: a traceback): no figure, said.
    wrapper.unlink()
    said.clear()
    empty_path = {"PATH": str(tmp_path / "nothing")}
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(os, "environ", {**os.environ, **empty_path})
        assert read_bandwidth(NativeRunner(bin_dir, tmp_path), {}, said.append) is None
    assert len(said) == 2 and f"moe-stack-bandwidth can't run from {bin_dir}" in said[0], said
