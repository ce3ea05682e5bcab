// kernels.h: the compute backends. Each op is declared once here with its shapes; kernels/cpu/
// holds the readable reference implementation (C + OpenMP + CBLAS) and kernels/cuda/ the CUDA one,
// checked against it. Model code calls these and never branches on the backend.
#ifndef NEOX_KERNELS_H
#define NEOX_KERNELS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// ---- backends -------------------------------------------------------------------------------
// A one-line description of the compiled backends and what they found: "cpu (2 threads, OpenBLAS
// 0.3.21 ...)", plus ", cuda (1 device: NVIDIA H200, 139.8 GiB)" in a CUDA build.
const char *neox_backends_description(void);

typedef struct neox_cuda_device_info {
    char name[256];
    size_t total_memory;   // bytes
    int major, minor;      // compute capability
    int multiprocessors;
} neox_cuda_device_info;

// CUDA builds only: number of visible devices (0 when no driver or GPU; never an error), and the
// properties of one of them (returns -1 when index is out of range).
int neox_cuda_device_count(void);
int neox_cuda_device_info_get(int index, neox_cuda_device_info *info);

#ifdef __cplusplus
}
#endif
#endif
