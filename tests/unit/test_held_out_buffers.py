"""The compute-buffer plan against runs it was not fitted to (issue 61, point 1).

bench/results/ik-ab-2026-12-06: ik_llama.cpp 8337e4c (the pinned tree) and 55d3c05 (the pin before) on an
H100, the presets' stacks on slices of R1, Qwen3-235B and Qwen3-Next widths at contexts and micro-batches
the earlier fits never saw. The fits name their points (compute_buffers.py); every other point is held out
here, and the plan's error on those is what docs/usage.md and the plan's own estimates quote.
"""

from __future__ import annotations

import json
from pathlib import Path

from builder.engines import get_engine
from builder.engines.compute_buffers import HELD_OUT_ERROR, gpu_compute
from builder.models.kv_cache import DEFAULT_UBATCH
from builder.models.planner import DEFAULT_VRAM_MARGIN
from builder.models.synth_catalog import synth_shape
from builder.models.synth_moe import shape_facts

RUNS = Path(__file__).resolve().parents[2] / "bench/results/ik-ab-2026-12-06/results.jsonl"
NEW_TREE, PIN_TREE = "ik_llama.cpp@8337e4c", "ik_llama.cpp"
MIB = 1024**2
# The slices the device runs wrote (bench/device/models.py) (real widths, fewer experts and layers).
SLICES = {
    "r1-8": ("deepseek2", {"layers": 8, "experts": 32}),
    "r1-16": ("deepseek2", {"layers": 16, "experts": 32}),
    "q235-8": ("qwen3moe", {"layers": 8, "experts": 32}),
    "qn-8": ("qwen3next", {"layers": 8, "experts": 128}),
}
# The (slice, context, micro-batch) points the fits were made from: R1's on this tree (IK_R1_LAYERS_MIB),
# Qwen3-235B's at 16k/2048 and Qwen3-Next's contexts 8k, 32k and 131k (both on the H200, at the pin before;
# Qwen3-Next's the same at -ub 512 and 2048).
FITTED = {
    ("r1-8", 32768, 512),
    ("r1-8", 32768, 1024),
    ("r1-8", 8192, 2048),
    ("r1-8", 65536, 2048),
    ("r1-8", 32768, 4096),
    ("q235-8", 16384, 2048),
    ("qn-8", 32768, 2048),
    ("qn-8", 32768, 512),
    ("qn-8", 131072, 2048),
}


def _runs(tree: str) -> list[dict]:
    """Each point's first run of `tree` that loaded (the speed cases repeat theirs each round)."""
    seen, runs = set(), []
    for line in RUNS.read_text().splitlines():
        run = json.loads(line)
        if (
            run.get("tree") == tree
            and "buffers_mib" in run
            and run["buffers_mib"]
            and _point(run) not in seen
        ):
            seen.add(_point(run))
            runs.append(run)
    return runs


def _flag(run: dict, flag: str, default: int) -> int:
    command = run["command"]
    return int(command[command.index(flag) + 1]) if flag in command else default


def _point(run: dict) -> tuple[str, int, int]:
    return run["model"], _flag(run, "--ctx-size", 0), _flag(run, "--ubatch-size", DEFAULT_UBATCH)


def _compute_mib(run: dict) -> float:
    return sum(mib for where, kind, mib in run["buffers_mib"] if where == "CUDA0" and kind == "compute")


def _planned(run: dict) -> tuple[float, bool, str]:
    """The plan's compute buffer (MiB), whether it calls it measured, and its basis."""
    arch, changes = SLICES[run["model"]]
    engine = get_engine("ik_llama.cpp")
    facts = engine.loaded_facts(shape_facts(synth_shape(arch, **changes)), mtp=None)
    _, ctx, ubatch = _point(run)
    estimate = gpu_compute(engine.buffer_fits, facts, ctx, ubatch, latent="-mla" in run["command"])
    return estimate.bytes / MIB, estimate.measured, estimate.basis


def test_a_third_of_the_points_are_held_out_and_the_plan_misses_them_by_no_more_than_it_says() -> None:
    runs = _runs(NEW_TREE)
    held_out = [run for run in runs if _point(run) not in FITTED]
    assert len(runs) >= 15 and 3 * len(held_out) >= len(runs), [_point(run) for run in runs]
    assert {run["model"] for run in held_out} == set(SLICES)
    errors = {}
    for run in held_out:
        planned, measured, basis = _planned(run)
        errors[_point(run)] = planned / _compute_mib(run) - 1
        assert measured or "an estimate" in basis, (_point(run), basis)
    assert max(abs(error) for error in errors.values()) <= HELD_OUT_ERROR, errors
    # What the error is: the largest shortfall 12 % (an extrapolation, -ub 4096 on Qwen3-235B widths), the
    # largest overstatement 10 % (R1's 16-layer slice), so the bound is not loose by much either.
    assert min(errors.values()) < -0.10 and max(errors.values()) > 0.08, errors
    shortfall = max(
        -error * _compute_mib(run) * MIB for run in held_out if (error := errors[_point(run)]) < 0
    )
    assert shortfall < 0.25 * DEFAULT_VRAM_MARGIN  # inside the margin every plan leaves free


def test_the_fitted_points_are_what_the_fits_say() -> None:
    """In sample: to 1 %, but for the R1 fit's 8k point, which it overstates as an envelope over contexts
    (-ub 2048 logged 1352 MiB at 8k, 1449 at 64k)."""
    for run in _runs(NEW_TREE):
        if _point(run) in FITTED:
            planned, measured, _ = _planned(run)
            error = planned / _compute_mib(run) - 1
            assert measured and (abs(error) <= 0.01 or 0 < error <= 0.08), (_point(run), error)


def test_the_tree_before_logged_five_times_r1s_buffer_and_the_same_elsewhere() -> None:
    """Why the R1 fit was made again: 55d3c05 decompressed the whole latent cache for prefill (7672 MiB at
    36k/2048 where 8337e4c logs 1464); on Qwen3-235B and Qwen3-Next widths both trees logged the same, so
    the H200's fits there (made at 55d3c05) hold for the pinned tree."""
    pin = {_point(run): _compute_mib(run) for run in _runs(PIN_TREE)}
    new = {_point(run): _compute_mib(run) for run in _runs(NEW_TREE)}
    both = pin.keys() & new.keys()
    assert {point[0] for point in both} == {"r1-8", "q235-8", "qn-8"}
    for point in both:
        if point[0] == "r1-8":
            assert pin[point] > 3 * new[point], (point, pin[point], new[point])
        else:
            assert pin[point] == new[point], point


def test_mainlines_r1_fit_holds_at_a_context_and_card_it_was_not_fitted_on() -> None:
    """Mainline's R1 fit (the H200's runs at 32k, 4 points) against its preset's run on the H100 at 36k
    (bench/results/restart-32k-2026-12-06, the case before the restart timing): to 0.1 %."""
    recorded = RUNS.parents[1] / "restart-32k-2026-12-06/callB/results.jsonl"
    run = json.loads(recorded.read_text().splitlines()[-1])
    assert run["tree"] == "llama.cpp" and _point(run) == ("r1-8", 36864, 2048)
    arch, changes = SLICES[run["model"]]
    engine = get_engine("llama.cpp")
    facts = engine.loaded_facts(shape_facts(synth_shape(arch, **changes)), mtp=None)
    estimate = gpu_compute(engine.buffer_fits, facts, 36864, 2048, latent=True)  # mainline's MLA: always
    assert estimate.measured and abs(estimate.bytes / MIB / _compute_mib(run) - 1) < 0.001
