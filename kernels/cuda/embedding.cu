// embedding.cu: token (+ learned position) embedding lookup, and its gradient in the order
// kernels.h fixes (equal to kernels/cpu/embedding.c bit for bit, deterministic, no atomics): a
// stable radix sort of the (id, position) pairs (CUB), then the sorted sequence in spans of
// NEOX_EMBEDDING_SPAN tokens, one block per (span, 128 channels) adding its tokens in order: an id
// whose run stays inside the span is written to its row at once, the pieces of a run that crosses a
// span boundary are kept and a second kernel adds them onto the row in span order. Each thread
// adds at most one span's tokens and the runs that cross a boundary at most N / SPAN pieces, so a
// batch of one repeated token takes as long as one of distinct tokens. The looked-up rows and their
// gradient are templates on the activations' storage type (common.cuh); the tables stay fp32.
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"

enum { EMB_THREADS = 256 };

// out: (N, C), element e is token e / C, channel e % C.
template <typename S>
__global__ void embedding_forward_kernel(S *out, const int *ids, const float *wte, const float *wpe, int T, int C,
                                         size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t bt = e / C;
        int c = (int)(e % C), id = ids[bt];
        float o = id < 0 ? 0.0f : wte[(size_t)id * C + c];
        if (wpe) o += wpe[(bt % T) * C + c];
        act_store(out, e, o);
    }
}

extern "C" void neox_cuda_embedding_forward(void *out, const int *ids, const float *wte, const float *wpe, int B, int T,
                                            int C, neox_elem act) {
    size_t n = (size_t)B * T * C;
    if (n == 0) return;
    ACT_DISPATCH(act, S, embedding_forward_kernel<S><<<blocks_for(n, EMB_THREADS), EMB_THREADS, 0,
                                                       neox_cuda_current_stream()>>>((S *)out, ids, wte, wpe, T, C, n));
    CUDA_LAUNCHED();
}

// out: (N, C); rows: (v1 - v0, C). One thread per element of out; tokens outside [v0, v1) untouched.
template <typename S>
__global__ void embedding_rows_kernel(S *out, const int *ids, const float *rows, int v0, int v1, int C, size_t n) {
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        int id = ids[e / C];
        if (id >= v0 && id < v1) act_store(out, e, rows[(size_t)(id - v0) * C + e % C]);
    }
}

extern "C" void neox_cuda_embedding_rows(void *out, const int *ids, const float *rows, int v0, int v1, int N, int C,
                                         neox_elem act) {
    size_t n = (size_t)N * C;
    if (n == 0 || v1 <= v0) return;
    ACT_DISPATCH(act, S, embedding_rows_kernel<S><<<blocks_for(n, EMB_THREADS), EMB_THREADS, 0,
                                                    neox_cuda_current_stream()>>>((S *)out, ids, rows, v0, v1, C, n));
    CUDA_LAUNCHED();
}

enum { SPAN = NEOX_EMBEDDING_SPAN, SPAN_CHANNELS = 128 };

// The radix sort's input: keys = the ids as unsigned (ids < 0 sort last and are skipped), values =
// the positions 0..n-1 (so equal ids keep token order: the sort is stable).
__global__ void sort_input_kernel(unsigned *keys, int *pos, const int *ids, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) keys[i] = (unsigned)ids[i], pos[i] = i;
}

// Grid (channel blocks, spans). keys, pos: (n) sorted. A thread adds the tokens of span blockIdx.y
// into channel c run by run. A run that started before the span (it continues one from an earlier
// span) is summed from zero into first[span]; a run that starts here and crosses the span's end is
// summed onto the row's value into last[span]; every other run is complete and written to dwte.
// first, last: (spans, C).
template <typename S>
__global__ void embedding_span_kernel(float *dwte, float *first, float *last, const S *dout, const unsigned *keys,
                                      const int *pos, int n, int C) {
    __shared__ unsigned skey[SPAN];
    __shared__ int spos[SPAN];
    int j0 = blockIdx.y * SPAN, j1 = min(j0 + SPAN, n), c = blockIdx.x * SPAN_CHANNELS + threadIdx.x;
    for (int j = j0 + threadIdx.x; j < j1; j += blockDim.x) skey[j - j0] = keys[j], spos[j - j0] = pos[j];
    __syncthreads();
    if (c >= C) return;
    unsigned after = j1 < n ? keys[j1] : 0xffffffffu;  // the key past the span's end (none: invalid)
    for (int s = j0, e; s < j1 && (int)skey[s - j0] >= 0; s = e) {
        unsigned key = skey[s - j0];
        bool continued = s == j0 && j0 > 0 && keys[j0 - 1] == key;
        float acc = continued ? 0.0f : dwte[(size_t)key * C + c];
        for (e = s; e < j1 && skey[e - j0] == key; e++) acc += act_load(dout, (size_t)spos[e - j0] * C + c);
        if (continued) first[(size_t)blockIdx.y * C + c] = acc;
        else if (e == j1 && after == key) last[(size_t)blockIdx.y * C + c] = acc;
        else dwte[(size_t)key * C + c] = acc;
    }
}

// Grid (channel blocks, spans): the run that starts in span blockIdx.y and crosses its end adds the
// pieces of the spans it continues into, in order, onto its partial row, and writes the row.
__global__ void embedding_carry_kernel(float *dwte, const float *first, const float *last, const unsigned *keys,
                                       int n, int C) {
    int span = blockIdx.y, j0 = span * SPAN, j1 = min(j0 + SPAN, n), c = blockIdx.x * SPAN_CHANNELS + threadIdx.x;
    if (c >= C || j1 >= n) return;
    unsigned key = keys[j1 - 1];
    bool starts_here = j0 == 0 || keys[j0 - 1] != key;  // sorted: else the whole span is one continued run
    if ((int)key < 0 || keys[j1] != key || !starts_here) return;
    float acc = last[(size_t)span * C + c];
    for (int b = span + 1, end; ; b++) {
        acc += first[(size_t)b * C + c];
        end = min((b + 1) * SPAN, n);
        if (end >= n || keys[end] != key) break;
    }
    dwte[(size_t)key * C + c] = acc;
}

// dwpe[t, c] += dout[b, t, c] for b in order. Grid (channel blocks, position strides).
template <typename S>
__global__ void position_grad_kernel(float *dwpe, const S *dout, int B, int T, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    for (int t = blockIdx.y; t < T; t += gridDim.y) {
        float acc = dwpe[(size_t)t * C + c];
        for (int b = 0; b < B; b++) acc += act_load(dout, ((size_t)b * T + t) * C + c);
        dwpe[(size_t)t * C + c] = acc;
    }
}

// The bytes of scratch CUB's radix sort of n pairs needs (after the keys, positions and span pieces).
static size_t sort_scratch_bytes(int n) {
    size_t bytes = 0;
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(NULL, bytes, (const unsigned *)NULL, (unsigned *)NULL, (const int *)NULL,
                                               (int *)NULL, n));
    return bytes;
}

extern "C" void neox_cuda_embedding_backward(float *dwte, float *dwpe, const void *dout, const int *ids, int B, int T,
                                             int C, neox_elem act) {
    int n = B * T;
    if (n == 0 || C == 0) return;
    cudaStream_t st = neox_cuda_current_stream();
    int spans = (n + SPAN - 1) / SPAN;
    size_t sort_bytes = sort_scratch_bytes(n), keys_bytes = ((size_t)n * 4 + 255) / 256 * 256;
    size_t piece_bytes = 2 * (size_t)spans * C * sizeof(float);
    char *scratch = (char *)neox_cuda_scratch(4 * keys_bytes + piece_bytes + sort_bytes);
    unsigned *keys_in = (unsigned *)scratch, *keys = (unsigned *)(scratch + keys_bytes);
    int *pos_in = (int *)(scratch + 2 * keys_bytes), *pos = (int *)(scratch + 3 * keys_bytes);
    float *first = (float *)(scratch + 4 * keys_bytes), *last = first + (size_t)spans * C;
    void *sort_tmp = scratch + 4 * keys_bytes + piece_bytes;
    sort_input_kernel<<<(n + 255) / 256, 256, 0, st>>>(keys_in, pos_in, ids, n);
    CUDA_LAUNCHED();
    CUDA_CHECK(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys, pos_in, pos, n, 0, 32, st));
    dim3 grid((unsigned)((C + SPAN_CHANNELS - 1) / SPAN_CHANNELS), (unsigned)spans);
    ACT_DISPATCH(act, S, embedding_span_kernel<S><<<grid, SPAN_CHANNELS, 0, st>>>(dwte, first, last, (const S *)dout,
                                                                                 keys, pos, n, C));
    CUDA_LAUNCHED();
    embedding_carry_kernel<<<grid, SPAN_CHANNELS, 0, st>>>(dwte, first, last, keys, n, C);
    CUDA_LAUNCHED();
    if (dwpe) {
        unsigned cblocks = (unsigned)((C + 127) / 128);
        dim3 pgrid(cblocks, T < 65535 ? T : 65535);
        ACT_DISPATCH(act, S, position_grad_kernel<S><<<pgrid, 128, 0, st>>>(dwpe, (const S *)dout, B, T, C));
        CUDA_LAUNCHED();
    }
}
