// vmm.cu: device allocations that can give part of themselves back. A block is a reserved range of
// device addresses with one physical granule (2 MiB on current GPUs) mapped at each granule's place,
// through CUDA's virtual memory management (cuMemAddressReserve, cuMemCreate, cuMemMap): release
// unmaps the granules inside a range and frees their memory, commit maps fresh ones. ZeRO-3's flat
// buffers then hold device memory only for the units gathered, as host pages do on CPU ranks.
//
// Release is stream-ordered, as the table promises: the granules are marked, an event is recorded on
// the op stream, and they are unmapped only once the event has passed (checked at every later entry,
// so the host never waits for it). A commit that comes first keeps them mapped. The driver's entry
// points are looked up through the runtime, so nothing links libcuda directly.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vmm.cuh"

static struct {
    PFN_cuMemGetAllocationGranularity_v10020 granularity;
    PFN_cuMemAddressReserve_v10020 reserve;
    PFN_cuMemAddressFree_v10020 address_free;
    PFN_cuMemCreate_v10020 create;
    PFN_cuMemRelease_v10020 release;
    PFN_cuMemMap_v10020 map;
    PFN_cuMemUnmap_v10020 unmap;
    PFN_cuMemSetAccess_v10020 set_access;
    PFN_cuDeviceGetAttribute_v2000 attribute;
} drv;

typedef struct vmm_block {
    CUdeviceptr base;
    size_t granules;
    CUmemGenericAllocationHandle *handle;  // per granule, 0 while unmapped
    uint64_t *releasing;                   // per granule, the release waiting to unmap it (0: none)
} vmm_block;

typedef struct pending_release {
    vmm_block *block;
    size_t first, end;  // granules
    uint64_t mark;
    cudaEvent_t passed;
} pending_release;

static int g_ready = -1;  // -1 not tried, 0 unavailable, 1 ready
static int g_device;
static size_t g_granule;
static vmm_block **g_blocks;
static int g_nblocks, g_block_cap;
static pending_release *g_pending;
static int g_npending, g_pending_cap;
static uint64_t g_marks;

#define CU_CHECK(call)                                                                                       \
    do {                                                                                                     \
        CUresult cu_result = (call);                                                                         \
        if (cu_result != CUDA_SUCCESS) {                                                                     \
            fprintf(stderr, "neox cuda: %s failed (driver error %d) at %s:%d\n", #call, (int)cu_result,     \
                    __FILE__, __LINE__);                                                                     \
            abort();                                                                                         \
        }                                                                                                    \
    } while (0)

static int lookup(const char *name, void **fn) {
    cudaDriverEntryPointQueryResult found;
    return cudaGetDriverEntryPointByVersion(name, fn, 12000, cudaEnableDefault, &found) == cudaSuccess &&
           found == cudaDriverEntryPointSuccess && *fn;
}

static CUmemAllocationProp granule_properties(void) {
    CUmemAllocationProp prop = {};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = g_device;
    return prop;
}

// Whether the driver offers virtual memory management on the current device (NEOX_CUDA_VMM=0 turns
// it off: every allocation is then a cudaMalloc block, and release gives nothing back).
int neox_vmm_ready(void) {
    if (g_ready >= 0) return g_ready;
    const char *off = getenv("NEOX_CUDA_VMM");
    g_ready = 0;
    if ((off && strcmp(off, "0") == 0) || cudaGetDevice(&g_device) != cudaSuccess) return 0;
    int ok = lookup("cuMemGetAllocationGranularity", (void **)&drv.granularity) &&
             lookup("cuMemAddressReserve", (void **)&drv.reserve) &&
             lookup("cuMemAddressFree", (void **)&drv.address_free) && lookup("cuMemCreate", (void **)&drv.create) &&
             lookup("cuMemRelease", (void **)&drv.release) && lookup("cuMemMap", (void **)&drv.map) &&
             lookup("cuMemUnmap", (void **)&drv.unmap) && lookup("cuMemSetAccess", (void **)&drv.set_access) &&
             lookup("cuDeviceGetAttribute", (void **)&drv.attribute);
    int supported = 0;
    if (!ok || drv.attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, g_device) !=
                   CUDA_SUCCESS || !supported)
        return 0;
    CUmemAllocationProp prop = granule_properties();
    if (drv.granularity(&g_granule, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || !g_granule) return 0;
    return g_ready = 1;
}

size_t neox_vmm_granularity(void) { return neox_vmm_ready() ? g_granule : 0; }

static void map_granule(vmm_block *b, size_t i) {
    CUmemAllocationProp prop = granule_properties();
    CUdeviceptr at = b->base + i * g_granule;
    CU_CHECK(drv.create(&b->handle[i], g_granule, &prop, 0));
    CU_CHECK(drv.map(at, g_granule, 0, b->handle[i], 0));
    CUmemAccessDesc access = {};
    access.location = prop.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CU_CHECK(drv.set_access(at, g_granule, &access, 1));
    neox_cuda_note_held((long long)g_granule);
}

static void unmap_granule(vmm_block *b, size_t i) {
    CU_CHECK(drv.unmap(b->base + i * g_granule, g_granule));
    CU_CHECK(drv.release(b->handle[i]));
    b->handle[i] = 0;
    b->releasing[i] = 0;
    neox_cuda_note_held(-(long long)g_granule);
}

// Unmaps what the releases whose events have passed marked, unless a commit took it back since.
static void settle_releases(void) {
    int kept = 0;
    for (int k = 0; k < g_npending; k++) {
        pending_release *r = &g_pending[k];
        cudaError_t passed = cudaEventQuery(r->passed);
        if (passed == cudaErrorNotReady) {
            g_pending[kept++] = *r;
            continue;
        }
        CUDA_CHECK(passed);
        for (size_t i = r->first; i < r->end; i++)
            if (r->block->releasing[i] == r->mark) unmap_granule(r->block, i);
        CUDA_CHECK(cudaEventDestroy(r->passed));
    }
    g_npending = kept;
}

static vmm_block *block_of(const void *p) {
    CUdeviceptr at = (CUdeviceptr)(uintptr_t)p;
    for (int i = 0; i < g_nblocks; i++)
        if (at >= g_blocks[i]->base && at < g_blocks[i]->base + g_blocks[i]->granules * g_granule) return g_blocks[i];
    return NULL;
}

static void *grow(void *array, int *cap, size_t item) {
    *cap = *cap ? 2 * *cap : 64;
    void *grown = realloc(array, (size_t)*cap * item);
    if (!grown) abort();
    return grown;
}

void *neox_vmm_alloc(size_t bytes) {
    if (!neox_vmm_ready() || bytes < g_granule) return NULL;
    settle_releases();
    vmm_block *b = (vmm_block *)calloc(1, sizeof *b);
    if (!b) abort();
    b->granules = (bytes + g_granule - 1) / g_granule;
    b->handle = (CUmemGenericAllocationHandle *)calloc(b->granules, sizeof *b->handle);
    b->releasing = (uint64_t *)calloc(b->granules, sizeof *b->releasing);
    if (!b->handle || !b->releasing) abort();
    if (drv.reserve(&b->base, b->granules * g_granule, g_granule, 0, 0) != CUDA_SUCCESS) {
        free(b->handle), free(b->releasing), free(b);
        return NULL;  // no address room: the caller takes a cudaMalloc block
    }
    for (size_t i = 0; i < b->granules; i++) map_granule(b, i);
    if (g_nblocks == g_block_cap) g_blocks = (vmm_block **)grow(g_blocks, &g_block_cap, sizeof *g_blocks);
    g_blocks[g_nblocks++] = b;
    return (void *)(uintptr_t)b->base;
}

// Frees the block at p, after the work queued on it; 0 when p is not one of ours.
int neox_vmm_free(void *p) {
    vmm_block *b = p ? block_of(p) : NULL;
    if (!b || (CUdeviceptr)(uintptr_t)p != b->base) return 0;
    CUDA_CHECK(cudaDeviceSynchronize());  // as cudaFree: nothing still queued may use it
    settle_releases();
    for (size_t i = 0; i < b->granules; i++)
        if (b->handle[i]) unmap_granule(b, i);
    CU_CHECK(drv.address_free(b->base, b->granules * g_granule));
    for (int i = 0; i < g_nblocks; i++)
        if (g_blocks[i] == b) g_blocks[i] = g_blocks[--g_nblocks];
    free(b->handle), free(b->releasing), free(b);
    return 1;
}

size_t neox_vmm_release(void *p, size_t bytes, cudaStream_t stream) {
    vmm_block *b = bytes ? block_of(p) : NULL;
    if (!b) return 0;
    settle_releases();
    size_t lo = (size_t)((CUdeviceptr)(uintptr_t)p - b->base), hi = lo + bytes;
    size_t first = (lo + g_granule - 1) / g_granule, end = hi / g_granule, given = 0;
    if (end > b->granules) end = b->granules;
    uint64_t mark = ++g_marks;
    for (size_t i = first; i < end; i++)
        if (b->handle[i] && !b->releasing[i]) {  // (one already on its way back is counted by its release)
            b->releasing[i] = mark;
            given += g_granule;
        }
    if (!given) return 0;
    if (g_npending == g_pending_cap) g_pending = (pending_release *)grow(g_pending, &g_pending_cap, sizeof *g_pending);
    pending_release *r = &g_pending[g_npending++];
    *r = pending_release{b, first, end, mark, NULL};
    CUDA_CHECK(cudaEventCreateWithFlags(&r->passed, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(r->passed, stream));
    return given;
}

size_t neox_vmm_commit(void *p, size_t bytes) {
    vmm_block *b = bytes ? block_of(p) : NULL;
    if (!b) return 0;
    settle_releases();
    size_t lo = (size_t)((CUdeviceptr)(uintptr_t)p - b->base);
    size_t first = lo / g_granule, end = (lo + bytes + g_granule - 1) / g_granule, taken = 0;
    if (end > b->granules) end = b->granules;
    for (size_t i = first; i < end; i++) {
        b->releasing[i] = 0;  // a release not yet settled keeps its granule
        if (!b->handle[i]) {
            map_granule(b, i);
            taken += g_granule;
        }
    }
    return taken;
}
