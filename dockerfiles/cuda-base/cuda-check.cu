// The CUDA base's self-check: a kernel, a cuBLAS SGEMM and a driver API call, so building it proves
// nvcc, the host compiler, cudart, cuBLAS and the driver stub link; on a GPU host it also runs.
#include <cstdio>
#include <vector>

#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

__global__ void fill(float *x, float value, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = value;
}

int main() {
    int driver = 0;
    if (cuDriverGetVersion(&driver) != CUDA_SUCCESS || driver == 0) {
        std::puts("moe-stack-cuda-check: no CUDA driver (the stub answered)");
        return 2;
    }
    const int n = 256;
    float *a = nullptr, *b = nullptr, *c = nullptr;
    if (cudaMalloc(&a, n * n * sizeof(float)) != cudaSuccess || cudaMalloc(&b, n * n * sizeof(float)) != cudaSuccess ||
        cudaMalloc(&c, n * n * sizeof(float)) != cudaSuccess) {
        std::puts("moe-stack-cuda-check: cudaMalloc failed");
        return 3;
    }
    fill<<<(n * n + 255) / 256, 256>>>(a, 1.0f, n * n);
    fill<<<(n * n + 255) / 256, 256>>>(b, 2.0f, n * n);
    cublasHandle_t handle;
    const float one = 1.0f, zero = 0.0f;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS ||
        cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a, n, b, n, &zero, c, n) != CUBLAS_STATUS_SUCCESS) {
        std::puts("moe-stack-cuda-check: cuBLAS failed");
        return 4;
    }
    std::vector<float> host(n * n);
    cudaMemcpy(host.data(), c, host.size() * sizeof(float), cudaMemcpyDeviceToHost);
    const float expect = 2.0f * n;
    int wrong = 0;
    for (float value : host) wrong += value != expect;
    std::printf("moe-stack-cuda-check: driver %d, sgemm %dx%d: %d wrong of %d (each should be %.0f)\n", driver, n, n,
                wrong, n * n, expect);
    return wrong == 0 ? 0 : 1;
}
