// reduce.cu: deterministic column sums over rows (bias and norm-weight gradients). Rows are cut
// into chunks whose number depends only on N; each block sums 32 columns of one chunk (8 row
// lanes, then the lanes in order), and a second kernel adds the chunks in order per column. So the
// result is the same from run to run, with no atomics, and work is spread over many blocks.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

enum { CS_COLS = 32, CS_LANES = 8, CS_MAX_CHUNKS = 256, CS_MIN_ROWS = 64 };

// partial: (chunks, C). Block (32, 8): column blockIdx.x * 32 + threadIdx.x, chunk blockIdx.y. a and b
// of storage type T (common.cuh).
template <typename T>
__global__ void column_partials_kernel(float *partial, const T *a, int lda, const T *b, const float *shift,
                                       const float *scale, int N, int C, int rows_per_chunk) {
    __shared__ float s[CS_LANES][CS_COLS];
    int c = blockIdx.x * CS_COLS + threadIdx.x;
    int r0 = blockIdx.y * rows_per_chunk, r1 = min(N, r0 + rows_per_chunk);
    float sum = 0.0f;
    if (c < C)
        for (int i = r0 + threadIdx.y; i < r1; i += CS_LANES) {
            float x = act_load(a, (size_t)i * lda + c);
            if (b) x = x * (act_load(b, (size_t)i * C + c) - (shift ? shift[i] : 0.0f)) * scale[i];  // as kernels/cpu/norm.c
            sum += x;
        }
    s[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float t = 0.0f;
        for (int l = 0; l < CS_LANES; l++) t += s[l][threadIdx.x];
        partial[(size_t)blockIdx.y * C + c] = t;
    }
}

__global__ void column_finish_kernel(float *acc, const float *partial, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float t = 0.0f;
    for (int k = 0; k < chunks; k++) t += partial[(size_t)k * C + c];
    acc[c] += t;
}

int neox_cuda_column_chunks(int N, int *rows_per_chunk) {
    int chunks = (N + CS_MIN_ROWS - 1) / CS_MIN_ROWS;
    if (chunks > CS_MAX_CHUNKS) chunks = CS_MAX_CHUNKS;
    *rows_per_chunk = (N + chunks - 1) / chunks;
    return (N + *rows_per_chunk - 1) / *rows_per_chunk;
}

void neox_cuda_column_finish(float *acc, const float *partial, int chunks, int C) {
    column_finish_kernel<<<(C + 255) / 256, 256, 0, neox_cuda_current_stream()>>>(acc, partial, chunks, C);
    CUDA_LAUNCHED();
}

void neox_cuda_column_sums_act(float *acc, const void *a, int lda, const void *b, const float *shift,
                               const float *scale, int N, int C, neox_elem act) {
    if (N <= 0 || C <= 0) return;
    int rows_per_chunk, chunks = neox_cuda_column_chunks(N, &rows_per_chunk);
    float *partial = (float *)neox_cuda_scratch((size_t)chunks * C * sizeof(float));
    cudaStream_t st = neox_cuda_current_stream();
    dim3 grid((C + CS_COLS - 1) / CS_COLS, chunks), block(CS_COLS, CS_LANES);
    ACT_DISPATCH(act, T, column_partials_kernel<T><<<grid, block, 0, st>>>(partial, (const T *)a, lda, (const T *)b,
                                                                            shift, scale, N, C, rows_per_chunk));
    CUDA_LAUNCHED();
    neox_cuda_column_finish(acc, partial, chunks, C);
}

void neox_cuda_column_sums(float *acc, const float *a, int lda, const float *b, const float *shift,
                           const float *scale, int N, int C) {
    neox_cuda_column_sums_act(acc, a, lda, b, shift, scale, N, C, NEOX_ELEM_F32);
}
