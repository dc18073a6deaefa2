# Rendered by moe-stack 0.1.0: do not edit, `moe-stack base --cuda 13.0` re-renders it.
# CUDA 13.0 from NVIDIA's PyPI wheels on moe-stack/debian:trixie, laid out like NVIDIA's images:
# /usr/local/cuda-13.0 (bin, include, lib64, nvvm, lib64/stubs/libcuda.so), /usr/local/cuda linked to it.
# For hosts that reach a PyPI and a Debian mirror but no container registry. No `# syntax=` line on
# purpose: the frontend image can't be pulled there either.

# ---- unpack: the wheels (named context `cuda-wheels`, downloaded on the host), checked, laid out ----
FROM moe-stack/debian:trixie AS unpack
ARG DEBIAN_FRONTEND=noninteractive
# unzip keeps the wheels' mode bits (Python's zipfile drops them). The base pins the version.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends unzip \
 && rm -rf /var/lib/apt/lists/*
# `cuda-wheels` is a named build context (the host's download), not a stage of this file.
# hadolint ignore=DL3022
COPY --from=cuda-wheels / /wheels/
COPY cuda-wheels.sha256 cuda-layout.sh /tmp/
# The bytes unpacked are the ones whose sha256 the labels record.
RUN sha256sum --check --strict --quiet /tmp/cuda-wheels.sha256 \
 && for wheel in nvidia_cuda_nvcc-13.0.88-py3-none-manylinux_2_27_x86_64.whl nvidia_cuda_crt-13.0.88-py3-none-manylinux_2_27_x86_64.whl nvidia_nvvm-13.0.88-py3-none-manylinux_2_27_x86_64.whl nvidia_cuda_cccl-13.0.85-py3-none-manylinux_2_27_x86_64.whl nvidia_cuda_cuobjdump-13.2.51-py3-none-manylinux_2_27_x86_64.whl nvidia_cuda_runtime-13.0.96-py3-none-manylinux_2_27_x86_64.whl nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl; do \
      unzip -q -o "/wheels/$wheel" 'nvidia/cu13/*' -d /unpacked; \
    done \
 && sh /tmp/cuda-layout.sh /unpacked/nvidia/cu13 /out/devel /out/runtime libcudart.so.13 libcublas.so.13 libcublasLt.so.13

# ---- stub: the driver's link stub, which no wheel ships (libcuda.so.1 comes from the host driver) ----
FROM moe-stack/debian:trixie AS stub
ARG DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
COPY --from=unpack /out/devel/include/cuda.h /tmp/
COPY make-cuda-stub.sh /tmp/
RUN sh /tmp/make-cuda-stub.sh /tmp/cuda.h /out/libcuda.so

# ---- devel: the whole toolkit (nvcc, headers, cudart, cuBLAS), for the engines' build stage ----------
FROM moe-stack/debian:trixie AS devel
COPY --from=unpack /out/devel/ /usr/local/cuda-13.0/
COPY --from=stub /out/libcuda.so /usr/local/cuda-13.0/lib/stubs/libcuda.so
RUN ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda/lib64 >/etc/ld.so.conf.d/cuda.conf \
 && ldconfig
ENV PATH=/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs \
    CUDA_HOME="/usr/local/cuda" \
    CUDA_VERSION="13.0.96" \
    NVIDIA_VISIBLE_DEVICES="all" \
    NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
LABEL \
    org.opencontainers.image.title="CUDA 13.0 devel from PyPI wheels (moe-stack base)" \
    org.opencontainers.image.created="2026-11-30T00:00:00Z" \
    io.moe-stack.builder-version="0.1.0" \
    io.moe-stack.cuda="13.0" \
    io.moe-stack.cuda-full-version="13.0.96" \
    io.moe-stack.cuda-flavour="devel" \
    io.moe-stack.os-base="moe-stack/debian:trixie" \
    io.moe-stack.wheel.nvidia-cuda-nvcc="13.0.88 sha256:56fe502eb77625a12f25172caa3cdddb4e4c8ba2c8c17dba44b164761b380f03" \
    io.moe-stack.wheel.nvidia-cuda-crt="13.0.88 sha256:2c8043c7c9e02492716426e9919fc78d2c5b3b2a7a768a88e952676b08aa55a4" \
    io.moe-stack.wheel.nvidia-nvvm="13.0.88 sha256:c5f41ffeb6466944a026dfa5317d7d85355c119bbec279205d22f1869d1054e0" \
    io.moe-stack.wheel.nvidia-cuda-cccl="13.0.85 sha256:e0da7ad981f3a8aff08241b5bfc1af868742a63e2762f53a5171c492ef242649" \
    io.moe-stack.wheel.nvidia-cuda-cuobjdump="13.2.51 sha256:95c69d3ddf0c2c1f535ec44c3433a66aeee19f588d9d22f73356e20b25f12b50" \
    io.moe-stack.wheel.nvidia-cuda-runtime="13.0.96 sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548" \
    io.moe-stack.wheel.nvidia-cublas="13.1.0.3 sha256:ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"

# ---- runtime: only what a server loads (cudart, cuBLAS, cuBLASLt) -----------------------------------
FROM moe-stack/debian:trixie AS runtime
COPY --from=unpack /out/runtime/ /usr/local/cuda-13.0/
RUN ln -s cuda-13.0 /usr/local/cuda \
 && echo /usr/local/cuda/lib64 >/etc/ld.so.conf.d/cuda.conf \
 && ldconfig
# The NVIDIA container toolkit reads these: without `compute` it mounts no libcuda.so.1.
ENV \
    CUDA_HOME="/usr/local/cuda" \
    CUDA_VERSION="13.0.96" \
    NVIDIA_VISIBLE_DEVICES="all" \
    NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
    NVIDIA_REQUIRE_CUDA="cuda>=13.0"
LABEL \
    org.opencontainers.image.title="CUDA 13.0 runtime from PyPI wheels (moe-stack base)" \
    org.opencontainers.image.created="2026-11-30T00:00:00Z" \
    io.moe-stack.builder-version="0.1.0" \
    io.moe-stack.cuda="13.0" \
    io.moe-stack.cuda-full-version="13.0.96" \
    io.moe-stack.cuda-flavour="runtime" \
    io.moe-stack.os-base="moe-stack/debian:trixie" \
    io.moe-stack.wheel.nvidia-cuda-runtime="13.0.96 sha256:7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548" \
    io.moe-stack.wheel.nvidia-cublas="13.1.0.3 sha256:ee8722c1f0145ab246bccb9e452153b5e0515fd094c3678df50b2a0888b8b171"

# ---- check: devel compiles and links a kernel + cuBLAS program for one arch; runtime resolves it ----
FROM devel AS check-build
ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
COPY cuda-check.cu /tmp/
RUN mkdir -p /out /report \
 && nvcc -O2 -arch=sm_90 -o /out/moe-stack-cuda-check /tmp/cuda-check.cu -lcublas -lcuda \
 && cuobjdump --list-elf /out/moe-stack-cuda-check >/report/elf.txt \
 && nm -D --defined-only /usr/local/cuda/lib64/stubs/libcuda.so | grep -c ' T cu' >/report/stub-symbols.txt

FROM runtime AS check-run
COPY --from=check-build /out/moe-stack-cuda-check /usr/local/bin/
RUN mkdir -p /report && ldd /usr/local/bin/moe-stack-cuda-check >/report/ldd.txt 2>&1

# `moe-stack base` exports this stage and checks it before tagging the images.
FROM scratch AS check
COPY --from=check-build /report/ /
COPY --from=check-run /report/ /
COPY --from=check-build /out/moe-stack-cuda-check /
