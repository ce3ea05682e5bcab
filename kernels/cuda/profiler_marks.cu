// profiler_marks.cu: what a profiled run (`profile`, docs/metrics.md "Profiling a run") shows a
// device profiler: the range API's ranges as NVTX ranges (nvtx3 is header-only: nothing to link, and
// without a tool attached each call returns at once), and the capture window as cudaProfilerStart/Stop,
// so `nsys profile --capture-range=cudaProfilerApi` records exactly the profiled steps.
#include <cuda_profiler_api.h>
#include <nvtx3/nvToolsExt.h>

#include "kernels/cuda/common.cuh"

extern "C" void neox_device_range_push(const char *name) { nvtxRangePushA(name); }

extern "C" void neox_device_range_pop(void) { nvtxRangePop(); }

extern "C" void neox_device_profiler_capture(int on) { CUDA_CHECK(on ? cudaProfilerStart() : cudaProfilerStop()); }
