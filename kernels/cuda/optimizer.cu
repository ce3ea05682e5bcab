// optimizer.cu: AdamW, SGD, Lion, MADGRAD, SM3, 1-bit Adam and the squared gradient norm on the GPU.
// AdamW's and the norm's segmented forms cover every parameter of the local state in one launch
// (plus one for the norm's final sum): a thread walks flat positions of the concatenated segments
// and finds its segment from a small table in device memory; the others launch once per segment.
// AdamW uses explicitly rounded operations (no fused multiply-adds), in kernels/cpu/optimizer.c's
// order, so its update equals the CPU's bit for bit. Norms are summed in double in an order fixed
// by n alone (grid-stride partials per block, then the blocks in order).
#include <string.h>

#include "kernels/cuda/common.cuh"

enum { OPT_THREADS = 256, NORM_BLOCKS_MAX = 1024 };

// One segment as the kernels see it: flat positions [start, next segment's start) map to buffer
// elements begin + (position - start). The table depends on the segments alone (not on the learning
// rate), so it is uploaded once and reused step after step (device_table below).
struct dev_segment {
    size_t begin, start;
    float weight_decay;
};

struct adam_consts {
    float lr, beta1, beta2, one_minus_beta1, one_minus_beta2, step_size, bc2_sqrt, eps, grad_scale;
};

// On the host for neox_cuda_adamw; on the device (one thread, from the step scalars) for the segmented
// update, whose learning rate and step a captured step must read afresh at every replay.
__host__ __device__ static adam_consts make_consts(float lr, float beta1, float beta2, float eps, long step,
                                                   float grad_scale) {
    adam_consts k;
    k.grad_scale = grad_scale;
    k.lr = lr;
    float bc1 = 1.0f - powf(beta1, (float)step), bc2 = 1.0f - powf(beta2, (float)step);
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.one_minus_beta1 = 1.0f - beta1;
    k.one_minus_beta2 = 1.0f - beta2;
    k.step_size = lr / bc1;
    k.bc2_sqrt = sqrtf(bc2);
    k.eps = eps;
    return k;
}

// decay: 1 - lr * weight_decay, rounded as the CPU rounds it.
__device__ __forceinline__ void adam_element(float *param, const float *grad, float *m, float *v, size_t i,
                                             float decay, const adam_consts &k) {
    float g = __fmul_rn(grad[i], k.grad_scale);
    float mi = __fadd_rn(__fmul_rn(k.beta1, m[i]), __fmul_rn(k.one_minus_beta1, g));
    float vi = __fadd_rn(__fmul_rn(k.beta2, v[i]), __fmul_rn(__fmul_rn(k.one_minus_beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    float p = __fmul_rn(param[i], decay);
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), k.bc2_sqrt), k.eps);
    param[i] = __fsub_rn(p, __fdiv_rn(__fmul_rn(k.step_size, mi), denom));
}

// Index of the segment holding flat position j (segments sorted by start; seg[0].start == 0).
__device__ __forceinline__ int find_segment(const dev_segment *seg, int nseg, size_t j) {
    int lo = 0, hi = nseg - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (seg[mid].start <= j) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// guard: NULL, or the gradients' sum of squares: not finite (an fp16 overflow) skips the update.
// consts: made from the step scalars by adam_consts_kernel just before.
__global__ void adamw_segments_kernel(float *param, const float *grad, float *m, float *v, const dev_segment *seg,
                                      int nseg, size_t total, const adam_consts *consts, const double *guard) {
    size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    if (j >= total || (guard && !isfinite(*guard))) return;
    const adam_consts k = *consts;
    int s = find_segment(seg, nseg, j);
    for (; j < total; j += stride) {
        while (s + 1 < nseg && seg[s + 1].start <= j) s++;  // positions only grow: walk forward
        float decay = __fsub_rn(1.0f, __fmul_rn(k.lr, seg[s].weight_decay));
        adam_element(param, grad, m, v, seg[s].begin + (j - seg[s].start), decay, k);
    }
}

// The device copies of the segment tables, found by content: the update's and the norm's tables
// repeat every step, so after the first no table crosses from the host (a copy from pageable memory
// may wait for the stream). A few are kept; a fifth replaces the oldest.
enum { TABLES_KEPT = 4 };
struct table_entry {
    neox_segment *host;  // the segments as given (compared field by field: the struct has padding)
    int nseg, count;     // given, and non-empty ones in dev
    size_t total;        // their total length
    dev_segment *dev;
};
static table_entry g_tables[TABLES_KEPT];
static int g_oldest;

static bool same_segments(const table_entry &e, const neox_segment *segs, int nseg) {
    if (!e.host || e.nseg != nseg) return false;
    for (int i = 0; i < nseg; i++)
        if (e.host[i].begin != segs[i].begin || e.host[i].end != segs[i].end ||
            e.host[i].weight_decay != segs[i].weight_decay)
            return false;
    return true;
}

static const table_entry &device_table(const neox_segment *segs, int nseg) {
    for (int t = 0; t < TABLES_KEPT; t++)
        if (same_segments(g_tables[t], segs, nseg)) return g_tables[t];
    table_entry &e = g_tables[g_oldest];
    g_oldest = (g_oldest + 1) % TABLES_KEPT;
    free(e.host);
    if (e.dev) CUDA_CHECK(cudaFree(e.dev));
    size_t rows = (size_t)(nseg > 0 ? nseg : 1);
    e.host = (neox_segment *)malloc(rows * sizeof *e.host);
    dev_segment *table = (dev_segment *)malloc(rows * sizeof *table);
    if (!e.host || !table) abort();
    memcpy(e.host, segs, (size_t)nseg * sizeof *segs);
    e.nseg = nseg, e.count = 0, e.total = 0;
    for (int i = 0; i < nseg; i++) {
        if (segs[i].end <= segs[i].begin) continue;
        table[e.count++] = dev_segment{segs[i].begin, e.total, segs[i].weight_decay};
        e.total += segs[i].end - segs[i].begin;
    }
    CUDA_CHECK(cudaMalloc(&e.dev, rows * sizeof *table));
    CUDA_CHECK(cudaMemcpy(e.dev, table, (size_t)e.count * sizeof *table, cudaMemcpyHostToDevice));
    free(table);
    return e;
}

// One thread: the update's constants from the step scalars (the bias corrections' powf on the device).
// consts: (1)
__global__ void adam_consts_kernel(adam_consts *consts, const neox_step_scalars *sc, float beta1, float beta2,
                                   float eps, float grad_scale) {
    *consts = make_consts(sc->lr, beta1, beta2, eps, (long)sc->step, grad_scale);
}

// The constants' home: one per process, written by adam_consts_kernel before each update reads it
// (stream order keeps an update's from the next one's), allocated once, before any capture.
static adam_consts *adam_consts_buffer(void) {
    static adam_consts *buffer;
    if (!buffer) CUDA_CHECK(cudaMalloc(&buffer, sizeof *buffer));
    return buffer;
}

extern "C" void neox_cuda_adamw_segments(float *param, const float *grad, float *m, float *v, const neox_segment *segs,
                                         int nseg, const neox_step_scalars *sc, float beta1, float beta2, float eps,
                                         float grad_scale, const double *guard) {
    const table_entry &t = device_table(segs, nseg);
    if (t.count == 0) return;
    adam_consts *consts = adam_consts_buffer();
    adam_consts_kernel<<<1, 1, 0, neox_cuda_current_stream()>>>(consts, sc, beta1, beta2, eps, grad_scale);
    CUDA_LAUNCHED();
    adamw_segments_kernel<<<blocks_for(t.total, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
        param, grad, m, v, t.dev, t.count, t.total, consts, guard);
    CUDA_LAUNCHED();
}

// The unsegmented form keeps its arguments (no captured step calls it): the constants go up with it.
__global__ void adamw_kernel(float *param, const float *grad, float *m, float *v, size_t n, float weight_decay,
                             adam_consts k) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    float decay = __fsub_rn(1.0f, __fmul_rn(k.lr, weight_decay));
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        adam_element(param, grad, m, v, i, decay, k);
}

extern "C" void neox_cuda_adamw(float *param, const float *grad, float *m, float *v, size_t n, float lr, float beta1,
                                float beta2, float eps, float weight_decay, long step) {
    if (n == 0) return;
    adamw_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
        param, grad, m, v, n, weight_decay, make_consts(lr, beta1, beta2, eps, step, 1.0f));
    CUDA_LAUNCHED();
}

// ---- squared norms ------------------------------------------------------------------------------

// partial[block] = sum of x^2 over this block's grid-stride positions (in double).
__global__ void sum_squares_kernel(double *partial, const float *x, const dev_segment *seg, int nseg, size_t total) {
    size_t j = blockIdx.x * (size_t)blockDim.x + threadIdx.x, stride = (size_t)gridDim.x * blockDim.x;
    double sum = 0.0;
    if (j < total) {
        int s = find_segment(seg, nseg, j);
        for (; j < total; j += stride) {
            while (s + 1 < nseg && seg[s + 1].start <= j) s++;
            double e = x[seg[s].begin + (j - seg[s].start)];
            sum += e * e;
        }
    }
    sum = block_sum(sum);
    if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void sum_partials_kernel(double *out, const double *partial, int n) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += partial[i];
    sum = block_sum(sum);
    if (threadIdx.x == 0) *out = sum;
}

extern "C" void neox_cuda_sum_squares_segments_into(double *sumsq, const float *x, const neox_segment *segs, int nseg) {
    const table_entry &t = device_table(segs, nseg);
    cudaStream_t st = neox_cuda_current_stream();
    if (t.count == 0) {
        CUDA_CHECK(cudaMemsetAsync(sumsq, 0, sizeof *sumsq, st));
        return;
    }
    unsigned blocks = blocks_for(t.total, OPT_THREADS);
    if (blocks > NORM_BLOCKS_MAX) blocks = NORM_BLOCKS_MAX;
    double *partial = (double *)neox_cuda_scratch(blocks * sizeof(double));
    sum_squares_kernel<<<blocks, OPT_THREADS, 0, st>>>(partial, x, t.dev, t.count, t.total);
    CUDA_LAUNCHED();
    sum_partials_kernel<<<1, 1024, 0, st>>>(sumsq, partial, (int)blocks);
    CUDA_LAUNCHED();
}

// The same sum brought to the host: the one op of a step that waits for the device.
extern "C" double neox_cuda_sum_squares_segments(const float *x, const neox_segment *segs, int nseg) {
    static double *result;  // one device double, kept for the process
    if (!result) CUDA_CHECK(cudaMalloc(&result, sizeof *result));
    double host;
    neox_cuda_sum_squares_segments_into(result, x, segs, nseg);
    cudaStream_t st = neox_cuda_current_stream();
    neox_note_host_wait();
    CUDA_CHECK(cudaMemcpyAsync(&host, result, sizeof host, cudaMemcpyDeviceToHost, st));
    CUDA_CHECK(cudaStreamSynchronize(st));
    return host;
}

extern "C" double neox_cuda_sum_squares(const float *x, size_t n) {
    neox_segment all = {0, n, 0.0f};
    return neox_cuda_sum_squares_segments(x, &all, 1);
}

// ---- SGD (kernels/cpu/optimizer.c's neox_sgd_segments): one launch per segment, rounded as the CPU ----
// param, grad, buf: (n) of one segment. The learning rate and the first step's case come from the step
// scalars and the guard on the device (a replayed step's own).
__global__ void sgd_kernel(float *param, const float *grad, float *buf, size_t n, const neox_step_scalars *sc,
                           float momentum, float wd, const double *guard) {
    if (guard && !isfinite(*guard)) return;
    float lr = sc->lr;
    int first = sc->step == 1;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float d = __fadd_rn(grad[i], __fmul_rn(wd, param[i]));
        if (momentum != 0.0f) {
            buf[i] = first ? d : __fadd_rn(__fmul_rn(momentum, buf[i]), d);
            d = buf[i];
        }
        param[i] = __fsub_rn(param[i], __fmul_rn(lr, d));
    }
}

extern "C" void neox_cuda_sgd_segments(float *param, const float *grad, float *buf, const neox_segment *segs, int nseg,
                                       const neox_step_scalars *sc, float momentum, const double *guard) {
    for (int s = 0; s < nseg; s++) {
        size_t b = segs[s].begin, n = segs[s].end - segs[s].begin;
        if (n == 0) continue;
        sgd_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
            param + b, grad + b, momentum != 0.0f ? buf + b : NULL, n, sc, momentum, segs[s].weight_decay, guard);
        CUDA_LAUNCHED();
    }
}

// ---- 1-bit Adam (kernels/cpu/optimizer.c's neox_adam_moments, neox_onebit_adam_apply) ----------
// m, v, grad: (n); v may be NULL (the frozen variance). Rounded as the CPU rounds, no FMA.
__global__ void adam_moments_kernel(float *m, float *v, const float *grad, size_t n, float beta1, float beta2) {
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        m[i] = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
        if (v) v[i] = __fadd_rn(__fmul_rn(beta2, v[i]), __fmul_rn(__fmul_rn(omb2, g), g));
    }
}

// param, m, v: (n); param -= lr * (m / (sqrt(v) + eps) + weight_decay * param).
__global__ void onebit_adam_apply_kernel(float *param, const float *m, const float *v, size_t n, float lr, float eps,
                                         float weight_decay) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float update = __fdiv_rn(m[i], __fadd_rn(__fsqrt_rn(v[i]), eps));
        if (weight_decay > 0.0f) update = __fadd_rn(update, __fmul_rn(weight_decay, param[i]));
        param[i] = __fadd_rn(param[i], __fmul_rn(-lr, update));
    }
}

extern "C" void neox_cuda_adam_moments(float *m, float *v, const float *grad, size_t n, float beta1, float beta2) {
    if (n == 0) return;
    adam_moments_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(m, v, grad, n, beta1,
                                                                                                    beta2);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_onebit_adam_apply(float *param, const float *m, const float *v, size_t n, float lr, float eps,
                                            float weight_decay) {
    if (n == 0) return;
    onebit_adam_apply_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
        param, m, v, n, lr, eps, weight_decay);
    CUDA_LAUNCHED();
}

// ---- Lion and MADGRAD (kernels/cpu/optimizer.c's neox_lion_segments, neox_madgrad_segments) -----
// One launch per segment, explicitly rounded in the CPU's order (no FMA). The decay factor is formed
// in double, as the CPU forms it (MADGRAD's on the host; Lion's on the device, from the step scalars'
// learning rate: a double product and difference are correctly rounded on both).
__host__ __device__ static float host_decay_factor(float lr, float weight_decay) {
    return (float)(1.0 - (double)lr * weight_decay);
}

// param, grad, m: (n) of one segment; the learning rate from the step scalars, the guard as SGD's.
__global__ void lion_kernel(float *param, const float *grad, float *m, size_t n, const neox_step_scalars *sc,
                            float beta1, float beta2, float weight_decay, const double *guard) {
    if (guard && !isfinite(*guard)) return;
    float lr = sc->lr, decay = host_decay_factor(lr, weight_decay);
    float omb1 = 1.0f - beta1, omb2 = 1.0f - beta2;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float g = grad[i];
        float c = __fadd_rn(__fmul_rn(beta1, m[i]), __fmul_rn(omb1, g));
        float sign = (float)((c > 0.0f) - (c < 0.0f));
        param[i] = __fadd_rn(__fmul_rn(param[i], decay), __fmul_rn(-lr, sign));
        m[i] = __fadd_rn(__fmul_rn(beta2, m[i]), __fmul_rn(omb2, g));
    }
}

extern "C" void neox_cuda_lion_segments(float *param, const float *grad, float *m, const neox_segment *segs, int nseg,
                                        const neox_step_scalars *sc, float beta1, float beta2, const double *guard) {
    for (int s = 0; s < nseg; s++) {
        size_t b = segs[s].begin, n = segs[s].end - segs[s].begin;
        if (n == 0) continue;
        lion_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
            param + b, grad + b, m + b, n, sc, beta1, beta2, segs[s].weight_decay, guard);
        CUDA_LAUNCHED();
    }
}

// MADGRAD's denominator: powf(sum_sq, 1/3) + eps (powf is not exactly rounded on either side: the
// CPU and the GPU may differ in the last place here).
__device__ static float madgrad_rms(float sum_sq, float eps) { return __fadd_rn(powf(sum_sq, 1.0f / 3.0f), eps); }

// param, grad, sum_sq, s, x0: (n) of one segment; x0 unused without momentum.
__global__ void madgrad_kernel(float *param, const float *grad, float *sum_sq, float *s, float *x0, size_t n,
                               float decay, float lamb, float momentum, float ck, float eps, int first) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        if (momentum != 0.0f && first) x0[i] = param[i];
        float p = decay != 1.0f ? __fmul_rn(param[i], decay) : param[i], g = grad[i];
        float origin = momentum != 0.0f ? x0[i] : __fadd_rn(p, __fdiv_rn(s[i], madgrad_rms(sum_sq[i], eps)));
        sum_sq[i] = __fadd_rn(sum_sq[i], __fmul_rn(__fmul_rn(lamb, g), g));
        s[i] = __fadd_rn(s[i], __fmul_rn(lamb, g));
        float z = __fadd_rn(origin, __fdiv_rn(-s[i], madgrad_rms(sum_sq[i], eps)));
        param[i] = momentum != 0.0f ? __fadd_rn(__fmul_rn(p, momentum), __fmul_rn(ck, z)) : z;
    }
}

extern "C" void neox_cuda_madgrad_segments(float *param, const float *grad, float *sum_sq, float *s, float *x0,
                                           const neox_segment *segs, int nseg, float lr_eps, float lamb,
                                           float momentum, float eps, int first) {
    float ck = (float)(1.0 - (double)momentum);
    for (int k = 0; k < nseg; k++) {
        size_t b = segs[k].begin, n = segs[k].end - segs[k].begin;
        if (n == 0) continue;
        float wd = segs[k].weight_decay, decay = wd != 0.0f ? host_decay_factor(lr_eps, wd) : 1.0f;
        madgrad_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
            param + b, grad + b, sum_sq + b, s + b, momentum != 0.0f ? x0 + b : NULL, n, decay, lamb, momentum, ck,
            eps, first);
        CUDA_LAUNCHED();
    }
}

// ---- SM3 (kernels/cpu/optimizer.c's neox_sm3_segments) --------------------------------------------
// One launch per segment, a thread per element. nu is never negative, so its float order is the
// order of its bits as signed integers and the row and column maxima are integer atomicMax on
// acc_next. The expressions are kernels.h's, which the compiler may contract into FMAs: the result
// matches the CPU's within rounding, not bit for bit.
__device__ static void atomic_max_nonnegative(float *addr, float v) { atomicMax((int *)addr, __float_as_int(v)); }

// param, grad, m: (n) of one segment, element i at tensor position first + i; acc, acc_next: every
// tensor's accumulators (segment sg's at row_acc, col_acc).
__global__ void sm3_kernel(float *param, const float *grad, float *m, const float *acc, float *acc_next, size_t n,
                           neox_sm3_segment sg, float lr, float momentum, float beta, float eps) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t t = sg.first + i, r = t / sg.cols, c = t % sg.cols;
        float a = acc[sg.row_acc + r], g = grad[i];
        if (sg.col_acc != NEOX_SM3_NO_COLS) a = fminf(a, acc[sg.col_acc + c]);
        float nu = neox_sm3_nu(a, g, beta), u = neox_sm3_update(nu, g, eps);
        if (momentum > 0.0f) m[i] = u = u * (1.0f - momentum) + momentum * m[i];
        param[i] = param[i] - lr * u;
        atomic_max_nonnegative(&acc_next[sg.row_acc + r], nu);
        if (sg.col_acc != NEOX_SM3_NO_COLS) atomic_max_nonnegative(&acc_next[sg.col_acc + c], nu);
    }
}

extern "C" void neox_cuda_sm3_segments(float *param, const float *grad, float *m, const float *acc, float *acc_next,
                                       const neox_sm3_segment *segs, int nseg, float lr, float momentum, float beta,
                                       float eps) {
    for (int k = 0; k < nseg; k++) {
        size_t b = segs[k].begin, n = segs[k].end - segs[k].begin;
        if (n == 0) continue;
        sm3_kernel<<<blocks_for(n, OPT_THREADS), OPT_THREADS, 0, neox_cuda_current_stream()>>>(
            param + b, grad + b, momentum > 0.0f ? m + b : NULL, acc, acc_next, n, segs[k], lr, momentum, beta, eps);
        CUDA_LAUNCHED();
    }
}
