"""The GPU machine's runs as data (bench/device/harness.py): each recorded llama.cpp-family run keeps the
case list that runs it again beside its results, every case in it would run (its measure, model, options
and tree's configure arguments known), and the list holds every case the run recorded."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HARNESS = ROOT / "bench/device/harness.py"
LISTS = sorted(ROOT.glob("bench/results/*/cases"))  # a run's list; NAME.cases beside it: its later calls'
# The scripts the harness replaced: a run recorded by one of them is reproducible only from its list.
REPLACED = re.compile(
    r"bench/device/(seed_models|full_size|tune|hybrid|decode_hybrid|decode_bound|cuda_image|ik_fatbin_sizes)\.sh"
    r"|bash bench/device/kt_gpu\.sh|bench/device/pinned_pages\.py"
)


def _check(*paths: Path) -> str:
    run = subprocess.run(
        [sys.executable, str(HARNESS), "--check", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_every_recorded_case_list_would_run() -> None:
    assert len(LISTS) >= 14, LISTS
    assert _check(*LISTS, *ROOT.glob("bench/results/*/*.cases")) == "every case would run"


def test_a_case_the_harness_cannot_run_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "cases"
    bad.write_text(
        "serve llama.cpp:r1-9\nserve llama.cpp:r1-8:bogus=1\nservex llama.cpp:r1-8\nbench llama.cpp:r1-8\n"
        "restart llama.cpp@x+image:q235-4\nserve llama.cpp@x+image:q235-4\n"
    )
    problems = _check(bad).splitlines()  # one line each; the other cases would run
    assert len(problems) == 4, problems
    assert "no model 'r1-9'" in problems[0]
    assert "bogus" in problems[1] and "Extra inputs are not permitted" in problems[1]
    assert "no measure 'servex'" in problems[2]
    assert "an image (+image) runs the serve measure only" in problems[3]


def test_every_run_of_a_replaced_script_has_its_case_list() -> None:
    runs = [
        path.parent
        for path in sorted(ROOT.glob("bench/results/*/README.md"))
        if REPLACED.search(path.read_text())
    ]
    assert len(runs) >= 18, runs
    assert [run.name for run in runs if not (run / "cases").is_file()] == []


@pytest.mark.parametrize("cases", LISTS, ids=lambda path: path.parent.name)
def test_the_list_holds_every_case_its_run_recorded(cases: Path) -> None:
    text = "\n".join(path.read_text() for path in (cases, *sorted(cases.parent.glob("*.cases"))))
    listed = {line.split("#", 1)[0].split()[-1] for line in text.splitlines() if " " in line.split("#")[0]}
    recorded = {
        json.loads(line)["case"]
        for path in cases.parent.rglob("*results.jsonl")
        for line in path.read_text().splitlines()
        if line.strip() and "case" in json.loads(line)
    }
    named = {case for case in recorded if ":" in case}  # full-size's rows are named: the comments say which
    assert named <= listed, sorted(named - listed)
    assert all(f"# {name}" in text for name in recorded - named), sorted(recorded - named)


def test_a_case_becomes_the_trees_image_arguments_the_engines_options_and_the_tools_levers() -> None:
    """The harness's own arithmetic, without the machine: a tree's configure arguments are its image's
    (no compiler launchers, CUDA for sm_90 unless +cpu-TARGET), a case's options the EngineOptions fields
    they name, and llama-bench's levers replace the stack's values rather than add a second list."""
    probe = """
import json
from machine import Case, Tree
from measures import engine_options, with_levers
from builder.platform.targets import cpu_target
case = Case.parse("bench ik_llama.cpp@8337e4c:r1-8:ub=512:ctx=8192:mmap=0:gpu=1:-t=12:-rtr=1")
args = ["-m", "x", "-t", "16", "-ot", "exps=CPU", "-p", "0", "-n", "0"]
print(json.dumps({
    "tree": [case.tree.engine_name, case.tree.source, case.tree.cpu_only, case.tree.is_image],
    "image": [(t := Tree("ik_llama.cpp@ikpy-0.1.5-cuda13.0-zen4+image")).engine_name, t.is_image, t.cpu_only],
    "cuda": [a for a in Tree("llama.cpp").configure_args() if "CUDA" in a],
    "cpu": [a for a in Tree("llama.cpp+cpu-avx2").configure_args() if "CUDA" in a or "march" in a],
    "avx2": cpu_target("avx2").march,
    "launchers": [a for a in Tree("llama.cpp").configure_args() if "LAUNCHER" in a],
    "options": engine_options(case).model_dump(exclude_unset=True),
    "levers": with_levers(args, case.options, "2048,8192", "0"),
}))
"""
    run = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HARNESS.parent,
        env={"PYTHONPATH": f"{ROOT}:{HARNESS.parent}", "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["tree"] == ["ik_llama.cpp", "ik_llama.cpp@8337e4c", False, False]
    assert seen["image"] == ["ik_llama.cpp", True, False]
    assert "-DCMAKE_CUDA_ARCHITECTURES=90-real" in seen["cuda"] and "-DGGML_CUDA=ON" in seen["cuda"]
    march = f"-march={seen['avx2']}"
    assert seen["cpu"] == [f"-DCMAKE_C_FLAGS={march}", f"-DCMAKE_CXX_FLAGS={march}"]
    assert seen["launchers"] == []
    assert seen["options"] == {"ubatch_size": 512, "ctx_size": 8192, "mmap": False}
    assert seen["levers"] == ["-m", "x", "-t", "12", "-p", "2048,8192", "-n", "0", "-rtr", "1"]


@pytest.mark.skipif(not all(map(shutil.which, ("gcc", "objcopy", "size"))), reason="needs gcc and binutils")
def test_fatbin_reads_each_cuda_objects_device_code(tmp_path: Path) -> None:
    """The fatbin measure over a tree's build: each *.cu.o's .nv_fatbin bytes (here objects given a section
    of that name, as nvcc links one) and their sum; a TREE+lineinfo tree is one that keeps -lineinfo."""
    build = tmp_path / "work/trees/ik_llama.cpp+lineinfo/build/ggml-cuda"
    build.mkdir(parents=True)
    (tmp_path / "a.c").write_text("int a;\n")
    subprocess.run(["gcc", "-c", str(tmp_path / "a.c"), "-o", str(tmp_path / "a.o")], check=True)
    for name, size in (("mmq.cu", 12345), ("fattn.cu", 678)):
        (tmp_path / name).write_bytes(b"\0" * size)
        section = f".nv_fatbin={tmp_path / name}"
        subprocess.run(
            ["objcopy", "--add-section", section, str(tmp_path / "a.o"), str(build / f"{name}.o")], check=True
        )
    probe = """
import json
from machine import Case
from measures import run_case
case = Case.parse("fatbin ik_llama.cpp+lineinfo:objects")
print(json.dumps([case.tree.keeps_lineinfo, run_case(case, 1, None, 0.0)]))
"""
    env = {
        "PYTHONPATH": f"{ROOT}:{HARNESS.parent}",
        "PATH": "/usr/bin:/bin",
        "DEVICE_WORK": str(tmp_path / "work"),
    }
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=HARNESS.parent, env=env, check=False)  # fmt: skip
    assert run.returncode == 0, run.stderr
    lineinfo, row = json.loads(run.stdout)
    assert lineinfo and "error" not in row, row
    assert row["objects"] == {"fattn.cu": 678, "mmq.cu": 12345} and row["fatbin_bytes"] == 13023
