// embedding.cu: token (+ learned position) embedding lookup, and its gradient with the CPU's
// addition order, so the result is deterministic and equal to kernels/cpu/embedding.c's: each
// dwte row receives its tokens' gradients in token order. To get that order without atomics, each
// token finds the next token with the same id (a scan over later ids through shared memory;
// O(N^2) comparisons, about 1.3e8 for N = 16k tokens, microseconds on a GPU), and the first token
// of each id walks that chain for its row, one thread per channel.
#include "kernels/cuda/common.cuh"

enum { EMB_THREADS = 256 };

// out: (N, C), element e is token e / C, channel e % C.
__global__ void embedding_forward_kernel(float *out, const int *ids, const float *wte, const float *wpe, int T, int C,
                                         size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t bt = e / C;
        int c = (int)(e % C), id = ids[bt];
        float o = id < 0 ? 0.0f : wte[(size_t)id * C + c];
        if (wpe) o += wpe[(bt % T) * C + c];
        out[e] = o;
    }
}

extern "C" void neox_cuda_embedding_forward(float *out, const int *ids, const float *wte, const float *wpe, int B, int T,
                                            int C) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    embedding_forward_kernel<<<blocks_for(n, EMB_THREADS), EMB_THREADS, 0, neox_cuda_current_stream()>>>(
        out, ids, wte, wpe, T, C, n);
    CUDA_LAUNCHED();
}

// next[i] = the smallest j > i with ids[j] == ids[i] (or -1); ids < 0 have no chain. Also clears
// has_prev. Each block scans the ids after its own in tiles until all its tokens have found theirs.
__global__ void next_same_kernel(int *next, int *has_prev, const int *ids, int n) {
    __shared__ int tile[EMB_THREADS];
    int i = blockIdx.x * EMB_THREADS + threadIdx.x;
    int id = i < n ? ids[i] : -1, found = -1;
    bool searching = id >= 0;
    if (i < n) has_prev[i] = 0;
    for (int j0 = blockIdx.x * EMB_THREADS; __syncthreads_or(searching) && j0 < n; j0 += EMB_THREADS) {
        int j = j0 + threadIdx.x;
        tile[threadIdx.x] = j < n ? ids[j] : -1;
        __syncthreads();
        if (searching)
            for (int t = 0; t < EMB_THREADS; t++)
                if (j0 + t > i && tile[t] == id) {
                    found = j0 + t;
                    searching = false;
                    break;
                }
        __syncthreads();  // the tile is rewritten next round
    }
    if (i < n) next[i] = found;
}

// Each chained token has exactly one predecessor, so these writes never collide.
__global__ void mark_chained_kernel(int *has_prev, const int *next, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && next[i] >= 0) has_prev[next[i]] = 1;
}

// Grid (channel blocks, token strides): the first token of each id adds its chain to dwte's row in order.
__global__ void embedding_chain_kernel(float *dwte, const float *dout, const int *ids, const int *next,
                                       const int *has_prev, int n, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int i = blockIdx.y; i < n; i += gridDim.y) {
        if (ids[i] < 0 || has_prev[i]) continue;
        float *e = dwte + (size_t)ids[i] * C + c;
        float acc = *e;
        for (int j = i; j >= 0; j = next[j]) acc += dout[(size_t)j * C + c];
        *e = acc;
    }
}

// dwpe[t, c] += dout[b, t, c] for b in order. Grid (channel blocks, position strides).
__global__ void position_grad_kernel(float *dwpe, const float *dout, int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        float acc = dwpe[(size_t)t * C + c];
        for (int b = 0; b < B; b++) acc += dout[((size_t)b * T + t) * C + c];
        dwpe[(size_t)t * C + c] = acc;
    }
}

extern "C" void neox_cuda_embedding_backward(float *dwte, float *dwpe, const float *dout, const int *ids, int B, int T,
                                             int C) {
    int n = B * T;
    if (n == 0 || C == 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    int *next = (int *)neox_cuda_scratch(2 * (size_t)n * sizeof(int)), *has_prev = next + n;
    unsigned token_blocks = (unsigned)((n + EMB_THREADS - 1) / EMB_THREADS);
    next_same_kernel<<<token_blocks, EMB_THREADS, 0, st>>>(next, has_prev, ids, n);
    CUDA_LAUNCHED();
    mark_chained_kernel<<<token_blocks, EMB_THREADS, 0, st>>>(has_prev, next, n);
    CUDA_LAUNCHED();
    unsigned cblocks = (unsigned)((C + 127) / 128);
    embedding_chain_kernel<<<dim3(cblocks, n < 65535 ? n : 65535), 128, 0, st>>>(dwte, dout, ids, next, has_prev, n, C);
    CUDA_LAUNCHED();
    if (dwpe) {
        position_grad_kernel<<<dim3(cblocks, T < 65535 ? T : 65535), 128, 0, st>>>(dwpe, dout, B, T, C);
        CUDA_LAUNCHED();
    }
}
