// backend.c: which compute backends this build has and what they see, for --version and the
// start-up banner.
#include <cblas.h>
#include <omp.h>
#include <stdio.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"

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
