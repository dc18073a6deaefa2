# Rendered by moe-stack 0.1.0: do not edit, `moe-stack base --cuda 12.4` re-renders it.
# CUDA 12.4 from Debian trixie's non-free archive on moe-stack/debian:trixie, where
# Debian puts it (nvcc in /usr/bin, headers in /usr/include, libraries in /usr/lib/x86_64-linux-gnu),
# with /usr/local/cuda-12.4 (bin, include, lib64, lib64/stubs/libcuda.so) laid over those paths as NVIDIA's
# images have it and /usr/local/cuda linked to it. The system's apt sources stay as they are: the
# archive is a list of its own. No `# syntax=` line on purpose: the frontend image can't be pulled
# there either.

# ---- host-driver: a package that stands for the driver's libraries (the host's, mounted at run time) ----
FROM moe-stack/debian:trixie AS host-driver
COPY host-driver.control /pkg/DEBIAN/control
RUN mkdir -p /out && dpkg-deb --build /pkg /out/moe-stack-host-driver.deb

# ---- devel: the whole toolkit (nvcc with its host g++-13, headers, cudart, cuBLAS, the stubs) ----
FROM moe-stack/debian:trixie AS devel
ARG DEBIAN_FRONTEND=noninteractive
COPY moe-stack-cuda.sources /etc/apt/sources.list.d/
COPY --from=host-driver /out/moe-stack-host-driver.deb /tmp/
COPY cuda-view.sh /tmp/
RUN apt-get update \
 && apt-get install -y --no-install-recommends /tmp/moe-stack-host-driver.deb nvidia-cuda-toolkit=12.4.131~12.4.1-2 nvidia-cuda-dev=12.4.127~12.4.1-2 libcudart12=12.4.127~12.4.1-2 libcublas12=12.4.5.8~12.4.1-2 libcublaslt12=12.4.5.8~12.4.1-2 \
 && rm -rf /var/lib/apt/lists/* /tmp/moe-stack-host-driver.deb \
 && sh /tmp/cuda-view.sh /usr/local/cuda-12.4 \
 && rm /tmp/cuda-view.sh \
 && ln -s cuda-12.4 /usr/local/cuda
ENV \
    CUDA_HOME="/usr/local/cuda" \
    CUDA_VERSION="12.4.127" \
    NVIDIA_VISIBLE_DEVICES="all" \
    NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
    NVIDIA_REQUIRE_CUDA="cuda>=12.4"
LABEL \
    org.opencontainers.image.title="CUDA 12.4 devel from Debian trixie non-free packages (moe-stack base)" \
    org.opencontainers.image.created="2026-11-30T00:00:00Z" \
    io.moe-stack.builder-version="0.1.0" \
    io.moe-stack.cuda="12.4" \
    io.moe-stack.cuda-full-version="12.4.127" \
    io.moe-stack.cuda-flavour="devel" \
    io.moe-stack.os-base="moe-stack/debian:trixie" \
    io.moe-stack.deb.nvidia-cuda-toolkit="12.4.131~12.4.1-2" \
    io.moe-stack.deb.nvidia-cuda-dev="12.4.127~12.4.1-2" \
    io.moe-stack.deb.libcudart12="12.4.127~12.4.1-2" \
    io.moe-stack.deb.libcublas12="12.4.5.8~12.4.1-2" \
    io.moe-stack.deb.libcublaslt12="12.4.5.8~12.4.1-2" \
    io.moe-stack.base-mirror="http://deb.debian.org/debian"

# ---- runtime: only what a server loads (cudart, cuBLAS, cuBLASLt) -----------------------------------
FROM moe-stack/debian:trixie AS runtime
ARG DEBIAN_FRONTEND=noninteractive
COPY moe-stack-cuda.sources /etc/apt/sources.list.d/
RUN apt-get update \
 && apt-get install -y --no-install-recommends libcudart12=12.4.127~12.4.1-2 libcublas12=12.4.5.8~12.4.1-2 libcublaslt12=12.4.5.8~12.4.1-2 \
 && rm -rf /var/lib/apt/lists/*
# The NVIDIA container toolkit reads these: without `compute` it mounts no libcuda.so.1.
ENV \
    CUDA_HOME="/usr/local/cuda" \
    CUDA_VERSION="12.4.127" \
    NVIDIA_VISIBLE_DEVICES="all" \
    NVIDIA_DRIVER_CAPABILITIES="compute,utility" \
    NVIDIA_REQUIRE_CUDA="cuda>=12.4"
LABEL \
    org.opencontainers.image.title="CUDA 12.4 runtime from Debian trixie non-free packages (moe-stack base)" \
    org.opencontainers.image.created="2026-11-30T00:00:00Z" \
    io.moe-stack.builder-version="0.1.0" \
    io.moe-stack.cuda="12.4" \
    io.moe-stack.cuda-full-version="12.4.127" \
    io.moe-stack.cuda-flavour="runtime" \
    io.moe-stack.os-base="moe-stack/debian:trixie" \
    io.moe-stack.deb.libcudart12="12.4.127~12.4.1-2" \
    io.moe-stack.deb.libcublas12="12.4.5.8~12.4.1-2" \
    io.moe-stack.deb.libcublaslt12="12.4.5.8~12.4.1-2" \
    io.moe-stack.base-mirror="http://deb.debian.org/debian"

# ---- check: devel compiles and links a kernel + cuBLAS program for one arch; runtime resolves it ----
FROM devel AS check-build
ARG DEBIAN_FRONTEND=noninteractive
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
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
