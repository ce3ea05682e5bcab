// op_timing.cu: CUDA events on the op stream for the per-op profile (kernels/op_profile.c): a mark is
// an event recorded after everything queued so far, and the time between two marks is what the
// device spent on the work queued between them. Events come from a pool that grows to the most marks
// outstanding at once and is reused after each reset (creating events is not free).
#include <vector>

#include "kernels/cuda/common.cuh"

static std::vector<cudaEvent_t> pool;
static int used;

extern "C" int neox_cuda_timing_mark(void) {
    if (used == (int)pool.size()) {
        cudaEvent_t e;
        CUDA_CHECK(cudaEventCreate(&e));
        pool.push_back(e);
    }
    CUDA_CHECK(cudaEventRecord(pool[used], neox_cuda_current_stream()));
    return used++;
}

extern "C" double neox_cuda_timing_elapsed_ms(int start, int stop) {
    float ms = 0.0f;
    CUDA_CHECK(cudaEventSynchronize(pool[stop]));
    CUDA_CHECK(cudaEventElapsedTime(&ms, pool[start], pool[stop]));
    return (double)ms;
}

extern "C" void neox_cuda_timing_reset(void) { used = 0; }
