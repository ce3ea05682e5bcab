// backend.c: which compute backends this build has and what they see, for --version and the
// start-up banner, and the run-time choice between them (kernels/backend.h).
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "kernels/backend.h"

const char *neox_backends_description(void) {
    static char text[1024];
    int n = snprintf(text, sizeof text, "cpu (%d OpenMP threads; %s)", omp_get_max_threads(), openblas_get_config());
#ifdef NEOX_CUDA
    int count = neox_cuda_device_count();
    neox_cuda_device_info info;
    if (count > 0 && neox_cuda_device_info_get(0, &info) == 0)
        snprintf(text + n, sizeof text - n, ", cuda (%d device%s: %s, %.1f GiB, sm_%d%d)", count, count == 1 ? "" : "s",
                 info.name, (double)info.total_memory / (1024.0 * 1024 * 1024), info.major, info.minor);
    else
        snprintf(text + n, sizeof text - n, ", cuda (compiled in; no device visible)");
#else
    (void)n;
#endif
    return text;
}

#ifndef NEOX_CUDA
const neox_backend *neox_backend_cuda(void) { return NULL; }
void neox_device_range_push(const char *name) { (void)name; }
void neox_device_range_pop(void) {}
void neox_device_profiler_capture(int on) { (void)on; }
#endif

const neox_backend *neox_backend_select(const char *choice, char *err, size_t errlen) {
    if (!strcmp(choice, "cpu")) return neox_backend_cpu();
    if (!strcmp(choice, "emulated")) return neox_backend_emulated();
    if (!strcmp(choice, "cuda") || !strcmp(choice, "auto")) {
        const neox_backend *cuda = neox_backend_cuda();
        if (cuda || !strcmp(choice, "auto")) return cuda ? cuda : neox_backend_cpu();
#ifdef NEOX_CUDA
        snprintf(err, errlen, "backend 'cuda': no CUDA device is visible");
#else
        snprintf(err, errlen, "backend 'cuda': this build has no CUDA backend (build with make CUDA=1)");
#endif
        return NULL;
    }
    snprintf(err, errlen, "backend '%s': expected cpu, cuda, auto or emulated", choice);
    return NULL;
}
