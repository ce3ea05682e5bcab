// loss.cu: softmax cross-entropy fused over the vocabulary, one block per row, as kernels/cpu/
// cross_entropy.c: the row max, the sum of exponentials in double, the log-sum-exp saved for the
// backward, which recomputes the probabilities and may overwrite the logits in place. The two
// halves (row max, row sum) serve a vocabulary split over tensor-parallel ranks.
#include "kernels/cuda/common.cuh"

enum { CE_THREADS = 512 };

__device__ float row_max(const float *z, int V) {
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, z[j]);
    return block_max(mx);
}

__device__ double row_sumexp(const float *z, float mx, int V) {
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(z[j] - mx);
    return block_sum(sum);
}

__global__ void cross_entropy_forward_kernel(float *losses, float *lse, const float *logits, const int *targets,
                                             int V) {
    const float *z = logits + (size_t)blockIdx.x * V;
    float mx = row_max(z, V);
    double sum = row_sumexp(z, mx, V);
    if (threadIdx.x == 0) {
        float l = mx + (float)log(sum);
        lse[blockIdx.x] = l;
        int t = targets[blockIdx.x];
        losses[blockIdx.x] = t >= 0 && t < V ? l - z[t] : 0.0f;  // a masked position: no loss (as the CPU)
    }
}

__global__ void row_max_kernel(float *mx, const float *logits, int V) {
    float m = row_max(logits + (size_t)blockIdx.x * V, V);
    if (threadIdx.x == 0) mx[blockIdx.x] = m;
}

__global__ void row_sumexp_kernel(double *sum, const float *logits, const float *mx, int V) {
    double s = row_sumexp(logits + (size_t)blockIdx.x * V, mx[blockIdx.x], V);
    if (threadIdx.x == 0) sum[blockIdx.x] = s;
}

// Each element is read and written by the same thread, so dlogits may alias logits.
__global__ void cross_entropy_backward_kernel(float *dlogits, const float *logits, const float *lse,
                                              const int *targets, const float *weight, float scale, int V) {
    size_t row = blockIdx.x;
    float w = (weight ? weight[row] : 1.0f) * scale, l = lse[row];
    int target = targets[row];
    const float *z = logits + row * V;
    float *dz = dlogits + row * V;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float d = expf(z[j] - l) * w;
        dz[j] = j == target ? d - w : d;
    }
}

// out, targets: (N); one thread per row.
__global__ void target_logit_kernel(double *out, const float *logits, const int *targets, int N, int V) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    int t = targets[i];
    out[i] = t >= 0 && t < V ? (double)logits[(size_t)i * V + t] : 0.0;
}

// Rows go one per block; a grid's first dimension holds 2^31 - 1 blocks, far more than N.
extern "C" void neox_cuda_cross_entropy_forward(float *losses, float *lse, const float *logits, const int *targets,
                                                int N, int V) {
    if (N <= 0) return;
    cross_entropy_forward_kernel<<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(losses, lse, logits, targets, V);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_row_max(float *mx, const float *logits, int N, int V) {
    if (N <= 0) return;
    row_max_kernel<<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(mx, logits, V);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_row_sumexp(double *sum, const float *logits, const float *mx, int N, int V) {
    if (N <= 0) return;
    row_sumexp_kernel<<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(sum, logits, mx, V);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_backward(float *dlogits, const float *logits, const float *lse,
                                                 const int *targets, const float *weight, float scale, int N, int V) {
    if (N <= 0) return;
    cross_entropy_backward_kernel<<<N, CE_THREADS, 0, neox_cuda_current_stream()>>>(dlogits, logits, lse, targets,
                                                                                    weight, scale, V);
    CUDA_LAUNCHED();
}

extern "C" void neox_cuda_cross_entropy_target_logit(double *out, const float *logits, const int *targets, int N, int V) {
    if (N <= 0) return;
    target_logit_kernel<<<(N + 255) / 256, 256, 0, neox_cuda_current_stream()>>>(out, logits, targets, N, V);
    CUDA_LAUNCHED();
}

// One block: thread t takes rows t, t + blockDim.x, ...; the block's sums in the fixed order of
// block_sum, so the loss repeats bit for bit from run to run.
__global__ void cross_entropy_loss_kernel(float *lse, double *loss, const float *mx, const double *stats,
                                          const float *mask, int N) {
    double sum = 0.0, wsum = 0.0;
    for (int i = threadIdx.x; i < N; i += blockDim.x) {
        float l = mx[i] + (float)log(stats[i]);
        lse[i] = l;
        sum += (double)mask[i] * (l - (float)stats[N + i]);
        wsum += mask[i];
    }
    sum = block_sum(sum);
    wsum = block_sum(wsum);
    if (threadIdx.x == 0) loss[0] = sum, loss[1] = wsum;
}

extern "C" void neox_cuda_cross_entropy_loss(float *lse, double *loss, const float *mx, const double *stats,
                                             const float *mask, int N) {
    cross_entropy_loss_kernel<<<1, 1024, 0, neox_cuda_current_stream()>>>(lse, loss, mx, stats, mask, N);
    CUDA_LAUNCHED();
}
