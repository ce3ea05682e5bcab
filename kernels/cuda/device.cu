// device.cu: CUDA device discovery (count and properties), used for backend choice and reporting.
// A machine without a driver or GPU reports zero devices; that is not an error.
#include <cuda_runtime.h>
#include <stdio.h>

#include "kernels/kernels.h"

extern "C" int neox_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no driver" error
        return 0;
    }
    return count;
}

extern "C" int neox_cuda_device_info_get(int index, neox_cuda_device_info *info) {
    cudaDeviceProp prop;
    if (index < 0 || index >= neox_cuda_device_count()) return -1;
    if (cudaGetDeviceProperties(&prop, index) != cudaSuccess) return -1;
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->total_memory = prop.totalGlobalMem;
    info->major = prop.major;
    info->minor = prop.minor;
    info->multiprocessors = prop.multiProcessorCount;
    return 0;
}
