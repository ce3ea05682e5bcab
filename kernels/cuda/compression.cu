// compression.cu: the compressed and sparse gradient exchanges' ops on the GPU (kernels.h; the
// reference is kernels/cpu/compression.c): 1-bit compression with error feedback and its two
// decompressions, the scaled add, PowerSGD's Gram-Schmidt and strided copies, the sum and scaling of
// rows by id. Products and sums are rounded one at a time (no fused multiply-add), as the CPU
// rounds them, so everything but the 1-bit scale's and the Gram-Schmidt's double sums (summed in
// another order) equals the CPU bit for bit.
#include "kernels/cuda/common.cuh"

#define THREADS 256
#define NORM_BLOCKS 1024
#define GRID_STRIDE(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)
#define LAUNCH(kernel, n, ...)                                                                              \
    do {                                                                                                    \
        if ((n) > 0) {                                                                                      \
            kernel<<<blocks_for((n), THREADS), THREADS, 0, neox_cuda_current_stream()>>>(__VA_ARGS__);      \
            CUDA_LAUNCHED();                                                                                \
        }                                                                                                   \
    } while (0)

// A float's 4 bytes at any offset of a message block (the wire's scales are not aligned).
__device__ float load_scale(const uint8_t *at) {
    float s;
    memcpy(&s, at, sizeof s);
    return s;
}

__device__ float sign_value(const uint8_t *bits, size_t i, float scale) {
    return bits[i / 8] >> (7 - i % 8) & 1 ? scale : -scale;
}

// ---- 1-bit compression -------------------------------------------------------------------------
// error: (padded)  x: (n)
__global__ void accumulate_kernel(float *error, const float *x, size_t n) {
    GRID_STRIDE(i, n) error[i] = __fadd_rn(error[i], x[i]);
}

// partial: (gridDim.x) sums of squares in double
__global__ void squares_kernel(double *partial, const float *x, size_t n) {
    double sum = 0.0;
    GRID_STRIDE(i, n) sum += (double)x[i] * x[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// scale = sqrt(sum) / sqrt(padded), rounded as the CPU rounds it.
__global__ void scale_kernel(float *scale, const double *partial, int blocks, size_t padded) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < blocks; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *scale = __fdiv_rn((float)sqrt(sum), (float)sqrt((double)padded));
}

// One thread per sign byte: packs its 8 elements, then takes scale * sign from them. Threads below
// chunks also store the scale's bytes for their chunk.
// error: (padded)  signs: chunk c's (padded / chunks / 8) bytes at c * sign_stride
__global__ void pack_kernel(uint8_t *signs, size_t sign_stride, uint8_t *scale_out, size_t scale_stride, float *error,
                            const float *scale, size_t padded, size_t chunk, int chunks) {
    float s = *scale;
    GRID_STRIDE(j, padded / 8) {
        float *e = error + 8 * j;
        unsigned byte = 0;
        for (int k = 0; k < 8; k++) {
            byte = byte << 1 | (e[k] >= 0.0f);
            e[k] = __fsub_rn(e[k], e[k] >= 0.0f ? s : -s);
        }
        size_t c = 8 * j / chunk;
        signs[c * sign_stride + (j - c * chunk / 8)] = (uint8_t)byte;
        if (j < (size_t)chunks) memcpy(scale_out + j * scale_stride, &s, sizeof s);
    }
}

extern "C" void neox_cuda_onebit_compress(uint8_t *signs, size_t sign_stride, uint8_t *scale, size_t scale_stride,
                                          float *error, const float *x, size_t n, size_t padded, int chunks) {
    if (padded == 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    LAUNCH(accumulate_kernel, n, error, x, n);
    unsigned blocks = blocks_for(padded, THREADS);
    if (blocks > NORM_BLOCKS) blocks = NORM_BLOCKS;
    double *partial = (double *)neox_cuda_scratch(blocks * sizeof(double) + sizeof(float));
    float *s = (float *)(partial + blocks);
    squares_kernel<<<blocks, THREADS, 0, st>>>(partial, error, padded);
    CUDA_LAUNCHED();
    scale_kernel<<<1, 1024, 0, st>>>(s, partial, (int)blocks, padded);
    CUDA_LAUNCHED();
    // (padded / 8 >= chunks: every chunk has at least one byte, so its thread stores its scale)
    LAUNCH(pack_kernel, padded / 8, signs, sign_stride, scale, scale_stride, error, s, padded, padded / chunks, chunks);
}

// out: (n)  blocks: (p, block) bytes
__global__ void average_kernel(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,
                               size_t n, int p, float mean) {
    GRID_STRIDE(j, n) {
        float sum = 0.0f;
        for (int q = 0; q < p; q++) {
            const uint8_t *b = blocks + (size_t)q * block;
            float v = sign_value(b + signs_at, j, __fmul_rn(load_scale(b + scale_at), mean));
            sum = q ? __fadd_rn(sum, v) : v;
        }
        out[j] = sum;
    }
}

extern "C" void neox_cuda_onebit_average(float *out, const uint8_t *blocks, size_t block, size_t signs_at,
                                         size_t scale_at, size_t n, int p) {
    LAUNCH(average_kernel, n, out, blocks, block, signs_at, scale_at, n, p, 1.0f / (float)p);
}

// out: (n)  blocks: (ceil(n / chunk), block) bytes
__global__ void decompress_kernel(float *out, const uint8_t *blocks, size_t block, size_t signs_at, size_t scale_at,
                                  size_t chunk, size_t n) {
    GRID_STRIDE(i, n) {
        const uint8_t *b = blocks + i / chunk * block;
        out[i] = sign_value(b + signs_at, i % chunk, load_scale(b + scale_at));
    }
}

extern "C" void neox_cuda_onebit_decompress(float *out, const uint8_t *blocks, size_t block, size_t signs_at,
                                            size_t scale_at, size_t chunk, size_t n) {
    LAUNCH(decompress_kernel, n, out, blocks, block, signs_at, scale_at, chunk, n);
}

// ---- error feedback and PowerSGD -----------------------------------------------------------------
// acc, x: (n)
__global__ void add_scaled_kernel(float *acc, const float *x, size_t n, float s) {
    GRID_STRIDE(i, n) acc[i] = __fadd_rn(acc[i], __fmul_rn(s, x[i]));
}

extern "C" void neox_cuda_add_scaled(float *acc, const float *x, size_t n, float s) {
    LAUNCH(add_scaled_kernel, n, acc, x, n, s);
}

// One block walks the columns in order (each depends on the ones before); the rows are its threads.
// P: (n, r) row-major
__global__ void orthonormalise_kernel(float *P, int n, int r) {
    for (int i = 0; i < r; i++) {
        for (int j = 0; j < i; j++) {
            double dot = 0.0;
            for (int k = threadIdx.x; k < n; k += blockDim.x) dot += (double)P[k * r + i] * P[k * r + j];
            dot = block_sum(dot);
            for (int k = threadIdx.x; k < n; k += blockDim.x)
                P[k * r + i] = __fsub_rn(P[k * r + i], (float)(dot * P[k * r + j]));
            __syncthreads();
        }
        double norm = 0.0;
        for (int k = threadIdx.x; k < n; k += blockDim.x) norm += (double)P[k * r + i] * P[k * r + i];
        norm = block_sum(norm);
        float inv = (float)(1.0 / (sqrt(norm) + 1e-8));
        for (int k = threadIdx.x; k < n; k += blockDim.x) P[k * r + i] = __fmul_rn(P[k * r + i], inv);
        __syncthreads();
    }
}

extern "C" void neox_cuda_orthonormalise_columns(float *P, int n, int r) {
    if (n <= 0 || r <= 0) return;
    orthonormalise_kernel<<<1, 1024, 0, neox_cuda_current_stream()>>>(P, n, r);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_copy_matrix(float *dst, int ldd, const float *src, int lds, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ldd * sizeof(float), src, (size_t)lds * sizeof(float),
                                 (size_t)cols * sizeof(float), (size_t)rows, cudaMemcpyDeviceToDevice,
                                 neox_cuda_current_stream()));
}

// ---- sparse rows by id ---------------------------------------------------------------------------
// grad: (V, C)  ids: (n)
__global__ void zero_rows_kernel(float *grad, const int *ids, int n, int C) {
    GRID_STRIDE(t, (size_t)n * C) grad[(size_t)ids[t / C] * C + t % C] = 0.0f;
}

// One thread per column walks the list in order, so a repeated id adds its rows as the CPU does.
// grad: (V, C)  rows: (n, C)  ids: (n)
__global__ void sum_rows_kernel(float *grad, const float *rows, const int *ids, int n, int C) {
    GRID_STRIDE(k, (size_t)C) {
        for (int i = 0; i < n; i++) {
            float *dst = grad + (size_t)ids[i] * C + k;
            *dst = __fadd_rn(*dst, rows[(size_t)i * C + k]);
        }
    }
}

extern "C" void neox_cuda_rows_sum_by_id(float *grad, const float *rows, const int *ids, int n, int C) {
    if (n <= 0 || C <= 0) return;
    LAUNCH(zero_rows_kernel, (size_t)n * C, grad, ids, n, C);
    LAUNCH(sum_rows_kernel, (size_t)C, grad, rows, ids, n, C);
}

// x: (V, C)  ids: (n) distinct
__global__ void scale_rows_kernel(float *x, const int *ids, int n, int C, float s) {
    GRID_STRIDE(t, (size_t)n * C) {
        float *v = x + (size_t)ids[t / C] * C + t % C;
        *v = __fmul_rn(*v, s);
    }
}

extern "C" void neox_cuda_scale_rows(float *x, const int *ids, int n, int C, float s) {
    if (n <= 0 || C <= 0) return;
    LAUNCH(scale_rows_kernel, (size_t)n * C, x, ids, n, C, s);
}
