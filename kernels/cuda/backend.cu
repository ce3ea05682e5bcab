// backend.cu: the CUDA backend's state and table: the current device, the one stream every op is
// queued on, the cuBLAS handle, scratch memory, device memory entry points, the capture of that stream
// as a CUDA graph, and the neox_backend table pointing at every neox_cuda_<op>.
#include <cublas_v2.h>
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/vmm.cuh"

static int g_device = -1;
static cudaStream_t g_stream;
static cublasHandle_t g_cublas;
static int g_tf32;
static void *g_scratch;
static size_t g_scratch_bytes;

extern "C" int neox_cuda_init(int device) {
    if (g_device >= 0) {
        if (device == g_device) return 0;
        fprintf(stderr, "neox cuda: already initialised on device %d, asked for %d\n", g_device, device);
        return -1;
    }
    int count = neox_cuda_device_count();
    if (device < 0 || device >= count) {
        fprintf(stderr, "neox cuda: device %d asked for, %d visible\n", device, count);
        return -1;
    }
    if (cudaSetDevice(device) != cudaSuccess || cudaStreamCreateWithFlags(&g_stream, cudaStreamNonBlocking) != cudaSuccess) {
        fprintf(stderr, "neox cuda: cannot start device %d: %s\n", device, cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    if (cublasCreate(&g_cublas) != CUBLAS_STATUS_SUCCESS || cublasSetStream(g_cublas, g_stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "neox cuda: cuBLAS did not start on device %d\n", device);
        return -1;
    }
    g_device = device;
    return 0;
}

static void ensure_init(void) {
    if (g_device < 0 && neox_cuda_init(0) != 0) abort();
}

cudaStream_t neox_cuda_current_stream(void) {
    ensure_init();
    return g_stream;
}
extern "C" void *neox_cuda_stream(void) { return (void *)neox_cuda_current_stream(); }
extern "C" void neox_cuda_set_tf32(int allow) { g_tf32 = allow != 0; }

cublasHandle_t neox_cuda_cublas(void) {
    ensure_init();
    return g_cublas;
}
int neox_cuda_tf32(void) { return g_tf32; }

void neox_cuda_after_launch(const char *file, int line) {
    static int sync = -1;
    if (sync < 0) {
        const char *v = getenv("NEOX_CUDA_SYNC");
        sync = v && *v && strcmp(v, "0") != 0;
    }
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess && sync) err = cudaStreamSynchronize(g_stream);
    if (err != cudaSuccess) {
        fprintf(stderr, "neox cuda: kernel launched at %s:%d: %s\n", file, line, cudaGetErrorString(err));
        abort();
    }
}

// ---- memory -------------------------------------------------------------------------------------

// The backend's allocations with their sizes, so that the bytes held, and their peak, are known
// (cudaFree does not say how much it frees).
struct held_block {
    void *p;
    size_t bytes;
};
static held_block *g_blocks;
static int g_nblocks, g_block_cap;
static size_t g_held, g_peak;

void neox_cuda_note_held(long long delta) {
    g_held += (size_t)delta;  // wraps back for a negative delta
    if (g_held > g_peak) g_peak = g_held;
}

static void note_alloc(void *p, size_t bytes) {
    if (g_nblocks == g_block_cap) {
        g_block_cap = g_block_cap ? 2 * g_block_cap : 64;
        g_blocks = (held_block *)realloc(g_blocks, (size_t)g_block_cap * sizeof *g_blocks);
        if (!g_blocks) abort();
    }
    g_blocks[g_nblocks++] = held_block{p, bytes};
    g_held += bytes;
    if (g_held > g_peak) g_peak = g_held;
}

static void note_free(void *p) {
    for (int i = 0; p && i < g_nblocks; i++)
        if (g_blocks[i].p == p) {
            g_held -= g_blocks[i].bytes;
            g_blocks[i] = g_blocks[--g_nblocks];
            return;
        }
}

void *neox_cuda_scratch(size_t bytes) {
    ensure_init();
    if (bytes > g_scratch_bytes) {
        note_free(g_scratch);
        if (g_scratch) CUDA_CHECK(cudaFree(g_scratch));  // waits for the ops that used it
        size_t grown = bytes + bytes / 4;
        CUDA_CHECK(cudaMalloc(&g_scratch, grown));
        note_alloc(g_scratch, grown);
        g_scratch_bytes = grown;
    }
    return g_scratch;
}

// Blocks of a granule or more are mapped granule by granule where the device can (kernels/cuda/vmm.cu),
// so that release gives back part of them; the rest are cudaMalloc blocks.
extern "C" void *neox_cuda_alloc(size_t bytes) {
    ensure_init();
    void *p = neox_vmm_alloc(bytes);
    if (p) return p;
    cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        size_t free_b = 0, total = 0;
        cudaMemGetInfo(&free_b, &total);
        fprintf(stderr, "neox cuda: out of device memory allocating %zu bytes (%zu of %zu free): %s\n", bytes, free_b,
                total, cudaGetErrorString(err));
        abort();
    }
    note_alloc(p, bytes ? bytes : 1);
    return p;
}
extern "C" void neox_cuda_free(void *p) {
    if (neox_vmm_free(p)) return;
    note_free(p);
    if (p) CUDA_CHECK(cudaFree(p));
}
extern "C" size_t neox_cuda_peak_bytes(void) { return g_peak; }
// Whole granules of a mapped block go back once the work queued before has run; a cudaMalloc block
// gives nothing back.
extern "C" size_t neox_cuda_release(void *p, size_t bytes) {
    return neox_vmm_release(p, bytes, neox_cuda_current_stream());
}
extern "C" size_t neox_cuda_commit(void *p, size_t bytes) { return neox_vmm_commit(p, bytes); }
extern "C" size_t neox_cuda_release_granularity(void) { return neox_vmm_granularity(); }
extern "C" void neox_cuda_memset_zero(void *p, size_t bytes) {
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, neox_cuda_current_stream()));
}
// Host <-> device copies wait for completion: the host buffer may be reused as soon as they return.
extern "C" void neox_cuda_to_device(void *dst, const void *src, size_t bytes) {
    neox_note_host_wait();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, neox_cuda_current_stream()));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}
extern "C" void neox_cuda_to_host(void *dst, const void *src, size_t bytes) {
    neox_note_host_wait();
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, neox_cuda_current_stream()));
    CUDA_CHECK(cudaStreamSynchronize(g_stream));
}
extern "C" void neox_cuda_copy(void *dst, const void *src, size_t bytes) {
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, neox_cuda_current_stream()));
}

// ---- asynchronous copies ------------------------------------------------------------------------
// A second stream carries them, so that they run beside the ops; an event recorded on the op stream
// orders each after the ops queued before it. Ticket k's completion is event k % COPY_EVENTS; a slot
// is reused only after its previous copy is done, and the copy stream runs in order, so a ticket whose
// slot holds a later one is done.
enum { COPY_EVENTS = 1024 };
static cudaStream_t g_copy_stream;
static cudaEvent_t g_ops_done, g_copy_done[COPY_EVENTS];
static int64_t g_copy_ticket[COPY_EVENTS], g_tickets;

static void ensure_copy_stream(void) {
    if (g_copy_stream) return;
    ensure_init();
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_copy_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&g_ops_done, cudaEventDisableTiming));
    for (int i = 0; i < COPY_EVENTS; i++) CUDA_CHECK(cudaEventCreateWithFlags(&g_copy_done[i], cudaEventDisableTiming));
}

// ---- the graph (graph_begin/graph_end/graph_launch, kernels/backend.h) ---------------------------
// A capture of the op stream; the copy stream joins it at its first copy (waiting on an event of the
// op stream, the fork CUDA's capture follows) and is joined back before it ends. Copies inside get
// tickets from g_capture_first on, each with an event of its own in the capture (device_wait's); after
// the capture each stands for the last launch, whose ticket's event is recorded on the op stream.
enum { CAPTURE_COPIES = 256 };
static int g_capturing, g_copy_joined;
static int64_t g_capture_first = 1, g_capture_end = 1;  // [first, end): the recording's tickets
static cudaEvent_t g_capture_done[CAPTURE_COPIES];
static cudaGraphExec_t g_graph_exec;
static int64_t g_last_launch;

static int64_t queue_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);

static int64_t capture_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    int64_t ticket = ++g_tickets, index = ticket - g_capture_first;
    if (index >= CAPTURE_COPIES) {
        fprintf(stderr, "neox cuda: more than %d asynchronous copies in one graph capture\n", CAPTURE_COPIES);
        abort();
    }
    if (!g_capture_done[index]) CUDA_CHECK(cudaEventCreateWithFlags(&g_capture_done[index], cudaEventDisableTiming));
    CUDA_CHECK(cudaEventRecord(g_ops_done, g_stream));
    CUDA_CHECK(cudaStreamWaitEvent(g_copy_stream, g_ops_done, 0));
    g_copy_joined = 1;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g_copy_stream));
    CUDA_CHECK(cudaEventRecord(g_capture_done[index], g_copy_stream));
    return ticket;
}

static int captured_ticket(int64_t ticket) {
    return ticket >= g_capture_first && ticket < (g_capturing ? g_tickets + 1 : g_capture_end);
}

extern "C" void neox_cuda_graph_begin(void) {
    ensure_copy_stream();
    if (g_capturing) {
        fprintf(stderr, "neox cuda: graph_begin inside a capture\n");
        abort();
    }
    g_capturing = 1, g_copy_joined = 0;
    g_capture_first = g_tickets + 1;
    // (thread-local: another thread's unsafe call does not break this capture)
    CUDA_CHECK(cudaStreamBeginCapture(g_stream, cudaStreamCaptureModeThreadLocal));
}

extern "C" void neox_cuda_graph_end(void) {
    if (g_copy_joined) {  // the copy stream's branch joins the op stream before the capture ends
        CUDA_CHECK(cudaEventRecord(g_ops_done, g_copy_stream));
        CUDA_CHECK(cudaStreamWaitEvent(g_stream, g_ops_done, 0));
    }
    cudaGraph_t graph;
    CUDA_CHECK(cudaStreamEndCapture(g_stream, &graph));
    g_capturing = 0;
    g_capture_end = g_tickets + 1;
    if (g_graph_exec) CUDA_CHECK(cudaGraphExecDestroy(g_graph_exec));
    CUDA_CHECK(cudaGraphInstantiate(&g_graph_exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
}

// The launch's ticket: an event on the op stream after it, in the copies' ring like theirs.
extern "C" int64_t neox_cuda_graph_launch(void) {
    if (g_capturing || !g_graph_exec) {
        fprintf(stderr, "neox cuda: graph_launch %s\n", g_capturing ? "inside a capture" : "before any capture");
        abort();
    }
    CUDA_CHECK(cudaGraphLaunch(g_graph_exec, g_stream));
    int64_t ticket = ++g_tickets;
    int slot = (int)(ticket % COPY_EVENTS);
    if (g_copy_ticket[slot]) CUDA_CHECK(cudaEventSynchronize(g_copy_done[slot]));
    CUDA_CHECK(cudaEventRecord(g_copy_done[slot], g_stream));
    g_copy_ticket[slot] = ticket;
    return g_last_launch = ticket;
}

static int64_t queue_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    ensure_copy_stream();
    if (g_capturing) return capture_copy(dst, src, bytes, kind);
    CUDA_CHECK(cudaEventRecord(g_ops_done, g_stream));
    CUDA_CHECK(cudaStreamWaitEvent(g_copy_stream, g_ops_done, 0));
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, g_copy_stream));
    int64_t ticket = ++g_tickets;
    int slot = (int)(ticket % COPY_EVENTS);
    if (g_copy_ticket[slot]) CUDA_CHECK(cudaEventSynchronize(g_copy_done[slot]));
    CUDA_CHECK(cudaEventRecord(g_copy_done[slot], g_copy_stream));
    g_copy_ticket[slot] = ticket;
    return ticket;
}

// The event of a ticket still to wait for, or NULL when it is done (a copy of the last capture's:
// its launch's).
static cudaEvent_t copy_event(int64_t ticket) {
    if (ticket <= 0 || !g_copy_stream) return NULL;
    if (captured_ticket(ticket)) {
        if (g_capturing) return g_capture_done[ticket - g_capture_first];
        ticket = g_last_launch;
        if (ticket <= 0) return NULL;
    }
    int slot = (int)(ticket % COPY_EVENTS);
    return g_copy_ticket[slot] == ticket ? g_copy_done[slot] : NULL;
}

extern "C" int64_t neox_cuda_to_host_async(void *dst, const void *src, size_t bytes) {
    return queue_copy(dst, src, bytes, cudaMemcpyDeviceToHost);
}
extern "C" int64_t neox_cuda_to_device_async(void *dst, const void *src, size_t bytes) {
    return queue_copy(dst, src, bytes, cudaMemcpyHostToDevice);
}
extern "C" void neox_cuda_host_wait(int64_t ticket) {
    if (g_capturing && captured_ticket(ticket)) {
        fprintf(stderr, "neox cuda: host_wait for a copy inside the graph capture it belongs to\n");
        abort();
    }
    cudaEvent_t e = copy_event(ticket);
    if (!e) return;
    cudaError_t done = cudaEventQuery(e);  // a copy that has finished costs the host no wait
    if (done == cudaSuccess) return;
    if (done != cudaErrorNotReady) CUDA_CHECK(done);
    neox_note_host_wait();
    CUDA_CHECK(cudaEventSynchronize(e));
}
// Inside a capture only the capture's own copies are waited for: an event recorded outside it cannot
// be (its copy was queued before the capture, which the caller waited for then).
extern "C" void neox_cuda_device_wait(int64_t ticket) {
    if (g_capturing && !captured_ticket(ticket)) return;
    cudaEvent_t e = copy_event(ticket);
    if (e) CUDA_CHECK(cudaStreamWaitEvent(neox_cuda_current_stream(), e, 0));
}
extern "C" void *neox_cuda_host_alloc(size_t bytes) {
    ensure_init();
    void *p = NULL;
    cudaError_t err = cudaMallocHost(&p, bytes ? bytes : 1);
    if (err != cudaSuccess) {
        fprintf(stderr, "neox cuda: cannot page-lock %zu bytes of host memory: %s\n", bytes, cudaGetErrorString(err));
        abort();
    }
    return p;
}
extern "C" void neox_cuda_host_free(void *p) {
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

extern "C" void neox_cuda_synchronize(void) {
    neox_note_host_wait();
    CUDA_CHECK(cudaStreamSynchronize(neox_cuda_current_stream()));
    if (g_copy_stream) CUDA_CHECK(cudaStreamSynchronize(g_copy_stream));
}

// ---- the table ----------------------------------------------------------------------------------

#define CUDA_ENTRY(ret, name, params, args) table.name = neox_cuda_##name;

extern "C" const neox_backend *neox_backend_cuda(void) {
    static neox_backend table;
    static int ready = -1;  // -1 not tried, 0 no device, 1 ready
    if (ready < 0) {
        ready = neox_cuda_device_count() > 0 && (g_device >= 0 || neox_cuda_init(0) == 0);
        table.name = "cuda";
        table.on_device = 1;
        table.releases = ready && neox_vmm_ready();
        NEOX_BACKEND_MEMORY(CUDA_ENTRY)
        NEOX_BACKEND_GRAPH(CUDA_ENTRY)
        NEOX_BACKEND_OPS(CUDA_ENTRY)
    }
    return ready ? &table : NULL;
}
