#!/usr/bin/env bash
# The carry of bench/device/kt.py's measures (issue 27), written here (PyPI reachable) into .device/kt/:
# overlay.tar.xz, the KTransformers CUDA image's Python packages that the GPU machine lacks, for
# CPython 3.12 x86-64, unpacked --no-deps style (~22 MiB xz, ~210 MiB unpacked). The versions are
# those `pip install 'ktransformers[sglang]==0.7.2'` resolved for the image on 2026-12-01, less:
#   - what the GPU machine has (torch 2.11, triton, accelerate, numpy, aiohttp, httpx, ... KINDS.md);
#   - torch 2.9.1 and its CUDA 12.8 libraries (4.7 GiB: the machine's torch stands in for them);
#   - parts bound to torch 2.9 or not on the path of one GPU's bf16/Q4 Qwen3-MoE: the sgl_kernel
#     "payload" archives (sm100/FA3 objects), deep_gemm, mscclpp, flashinfer's cubins,
#     nvidia-cutlass-dsl, tilelang, quack, torchao, torch-memory-saver, torchcodec, xgrammar,
#     outlines, llguidance, media decoders, datasets, modelscope;
#   - kt-kernel's variants other than amx and avx512_bf16 (the machine is an Emerald Rapids; KT_VARIANTS=all
#     keeps them, for kt-check) and jedi's bundled type stubs;
# plus tokenizers 0.22.2 for the machine's 0.23.2, which transformers-kt 5.6 refuses at import, and the
# official openai and anthropic clients smoke's checks use (moe-stack's own pins, above the openai 2.6.1
# SGLang resolved: not yet run on the device with them).
# Also needs .device/seed/whl (the builder's own dependencies, as bench/device/harness.py installs them).
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
wheels=(
  sglang-kt==0.7.2 kt-kernel==0.7.2 transformers-kt==5.6.0.post6 accelerate-kt==1.14.0.post4
  tokenizers==0.22.2 apache-tvm-ffi==0.1.11 flashinfer-python==0.6.3 torch-c-dlpack-ext==0.1.5
  openai==3.57.0 anthropic==2.16.0 docstring-parser==0.18.0 httpx2==2.16.2 httpcore2==2.16.2
  truststore==0.10.5 h11==0.16.0 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1 loguru==0.7.3
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  fastapi==0.165.0 starlette==1.10.0 opentelemetry-api==1.45.2 uvicorn==0.54.0 python-multipart==0.0.34
  pyzmq==27.3.0 gguf==0.19.0 dill==0.4.1 interegular==0.3.3 msgspec==0.23.0 orjson==3.13.0
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 setproctitle==1.3.8
  jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  ipython==9.18.1 ipython-pygments-lexers==1.1.1 prompt-toolkit==3.0.53 jedi==0.20.1 parso==0.8.7
  matplotlib-inline==0.2.2 pexpect==4.9.0 ptyprocess==0.7.0 stack-data==0.6.3 asttokens==3.0.2
  executing==2.3.0 pure-eval==0.2.4 traitlets==5.16.1 wcwidth==0.9.4
)
platforms=()
for tag in 2_35 2_34 2_28 2_27 2_26 2_24 2_17 2_5; do platforms+=(--platform "manylinux_${tag}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$work/whl" "${wheels[@]}"
mkdir "$work/site"
for wheel in "$work"/whl/*.whl; do python3 -m zipfile -e "$wheel" "$work/site"; done
cd "$work/site"
rm -rf -- *_sgl_kernel_payload sgl_kernel_kt_payload_core deep_gemm lib _mscclpp* include flash_attn_origin \
  build_backend.py build_utils.py jedi/third_party/typeshed jedi/third_party/django-stubs
[ "${KT_VARIANTS:-}" = all ] || rm -f kt_kernel/_kt_kernel_ext_avx2.* kt_kernel/_kt_kernel_ext_avx512_{base,vbmi,vnni}.*
find . -name __pycache__ -prune -exec rm -rf {} +
mkdir -p "$repo/.device/kt"
tar -cf - . | xz -9e -T0 >"$repo/.device/kt/overlay.tar.xz"
echo "wrote $repo/.device/kt/overlay.tar.xz: $(du -h "$repo/.device/kt/overlay.tar.xz" | cut -f1), $(du -sh . | cut -f1) unpacked"
# py-spy, the sampling profiler the kt-restart measure runs on the restored server with profile=1 (2.9 MB)
python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux1_x86_64 -d "$repo/.device/kt" \
  py-spy==0.4.3
