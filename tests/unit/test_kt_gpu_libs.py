"""moe-stack-kt-gpu-libs, the KTransformers image's build step for SGLang's CUDA kernels: the payload
joined and placed, each claimed arch's library present and linked, the rest pruned, and each problem one
line. The site-packages here is laid out as kt-kernel 0.7.2's wheels lay it out, with small shared
libraries built on the spot standing in for the 100-300 MB CUDA ones (the ldd check is the same)."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

from builder.engines import get_engine
from builder.images.matrix import cuda_target
from builder.images.naming import image_spec
from builder.images.render import render_files

SCRIPT = Path(__file__).parents[2] / "dockerfiles/ktransformers/moe-stack-kt-gpu-libs"
MODULES = ("core_payload", "sglang_payload", "meta_payload")
PAYLOAD_FILES = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so")


def _library(path: Path, needs: Path | None = None) -> Path:
    """A shared library (linked against the library `needs`, when given)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.with_suffix(".c")
    source.write_text(f"int {path.name.split('.')[0]}_symbol(void) {{ return 1; }}\n")
    link = (
        [f"-L{needs.parent}", "-Wl,--no-as-needed", f"-l:{needs.name}", f"-Wl,-rpath,{needs.parent}"]
        if needs
        else []
    )
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(path), str(source), *link], check=True)
    source.unlink()
    return path


def _site(tmp_path: Path, needs: Path | None = None) -> Path:
    """sgl_kernel as the wheels install it: the Hopper library in place, the others in payload parts."""
    site = tmp_path / "site"
    _library(site / "sgl_kernel/sm90/common_ops.abi3.so")
    built = tmp_path / "built"
    files = {name: _library(built / name, needs) for name in PAYLOAD_FILES}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:gz") as bundle:
        for name, path in files.items():
            bundle.add(path, arcname=name)
    data = archive.getvalue()
    third = len(data) // 3 + 1
    for i, module in enumerate(MODULES):
        (site / module).mkdir(parents=True)
        (site / module / "payload.part").write_bytes(data[i * third : (i + 1) * third])
    digests = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in files.items()}
    (site / "sgl_kernel/_payload_manifest.py").write_text(
        f"VERSION = '0.3.21.post2'\nARCHIVE_SHA256 = {hashlib.sha256(data).hexdigest()!r}\n"
        f"PAYLOAD_MODULES = {MODULES!r}\nFILES = {digests!r}\n"
    )
    return site


def _run(site: Path, archs: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--archs", archs, "--site-packages", str(site)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_claimed_arch_gets_its_library_in_place_and_the_rest_goes(tmp_path: Path) -> None:
    site = _site(tmp_path)
    done = _run(site, "90,120")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["libraries"] == {
        "sgl_kernel/sm90/common_ops.abi3.so": "sm_90",
        "sgl_kernel/sm100/common_ops.abi3.so": "sm_120",
        "sgl_kernel/flash_ops.abi3.so": "sm_90,sm_120",
    }
    for name in PAYLOAD_FILES:  # where sgl_kernel's loader looks first: it never joins the parts
        assert (site / name).read_bytes() == (tmp_path / "built" / name).read_bytes()
    assert not list(site.glob("*/payload.part")) and report["joined_parts"] == 3


def test_a_hopper_only_image_drops_the_other_library_and_a_blackwell_one_the_hopper_library(
    tmp_path: Path,
) -> None:
    hopper = _site(tmp_path / "h")
    assert _run(hopper, "90").returncode == 0
    assert not (hopper / "sgl_kernel/sm100/common_ops.abi3.so").exists()
    assert (hopper / "sgl_kernel/sm90/common_ops.abi3.so").is_file()
    blackwell = _site(tmp_path / "b")
    assert json.loads(_run(blackwell, "120").stdout)["removed"] == ["sgl_kernel/sm90/common_ops.abi3.so"]


def test_what_it_refuses_in_one_line(tmp_path: Path) -> None:
    site = _site(tmp_path / "parts")
    (site / "meta_payload/payload.part").unlink()  # kt-kernel and sglang-kt without the meta wheel
    lacking = _run(site, "90")
    assert lacking.returncode == 1 and len(lacking.stderr.strip().splitlines()) == 1
    assert "lacks meta_payload (of 3 parts)" in lacking.stderr and "ktransformers[sglang]" in lacking.stderr

    site = _site(tmp_path / "hopper")
    (site / "sgl_kernel/sm90/common_ops.abi3.so").unlink()  # the meta wheel's own library
    missing = _run(site, "90")
    assert (
        missing.returncode == 1 and "sm90/common_ops.abi3.so is missing, and sm_90 load it" in missing.stderr
    )

    helper = _library(tmp_path / "unlinked/built/libhelper.so")  # linked against, then gone
    site = _site(tmp_path / "unlinked", needs=helper)
    helper.unlink()
    unlinked = _run(site, "120")
    assert unlinked.returncode == 1 and "does not link: libhelper.so not found" in unlinked.stderr

    assert "must name CUDA archs as numbers" in _run(site, "sm_90").stderr


def test_the_cuda_image_installs_the_meta_wheel_and_checks_its_archs() -> None:
    kt = get_engine("ktransformers")
    spec = image_spec(get_engine("ktransformers"), "zen4", cuda=cuda_target("12.8"))
    dockerfile = render_files(spec)["Dockerfile"]
    assert f"'ktransformers[sglang]=={spec.ref}'" in dockerfile
    archs = ",".join(map(str, spec.cuda.archs))
    assert f"moe-stack-kt-gpu-libs --archs {archs}" in dockerfile
    assert kt.fetch_requirements(spec) == [
        f"{name}=={spec.ref}" for name in ("kt-kernel", "sglang-kt", "ktransformers")
    ]
    cpu = render_files(image_spec(get_engine("ktransformers"), "zen4"))["Dockerfile"]
    assert "moe-stack-kt-gpu-libs" not in cpu and "sglang" not in cpu.split("FROM toolchain AS venv")[1]
