// emulated.c: a CPU backend that behaves like a device towards the code using it. Its memory is
// mapped PROT_NONE except while one of its own entry points runs, so host code that reads or writes
// backend memory directly, instead of through to_host/to_device, faults at once and is named. The
// ops are kernels/cpu's, so results equal the CPU backend's bit for bit. `compute_backend:
// emulated` runs the trainer's device paths (host staging of ids and loss statistics,
// the optimizer's segmented calls, checkpoints through host copies) on a machine without a GPU, on
// one rank or many: lib/parallel's twin of NCCL queues device collectives on this device's stream
// through the hook below and runs them when an op reaches them.
//
// Its asynchronous copies are the latest a device could make them: each waits in the copy queue until
// a host_wait or device_wait (or synchronize) reaches its ticket, and a copy to the host fills its
// destination with NaN bytes at once. So host code that reads a destination before waiting, or queues
// an op on a destination without device_wait, gets wrong numbers here, which the tests comparing
// against the CPU backend bit for bit see; and a source that changes before its copy runs (which a
// device may have copied already, or not) stops the process with a message.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/backend.h"

// A region's released pages (release) no longer count in held, and stay PROT_NONE even while an entry
// point runs, until commit takes them back: a device cannot fault a page in, so an op, copy or
// collective that touches one first is stopped here as it would be on a GPU. released[i] is 1 while
// page i is given back; nreleased counts them.
typedef struct region {
    char *p;
    size_t bytes;
    unsigned char *released;  // one flag per page, NULL until the first release
    size_t nreleased;
} region;

// The communication layer's hook (neox_emulated_set_stream_hook): called before ops and
// stream-ordered memory entry points, never from inside itself.
static void (*stream_hook)(int everything);
static int in_stream_hook;

void neox_emulated_set_stream_hook(void (*reach)(int everything)) { stream_hook = reach; }

static void reach_stream(int everything) {
    if (!stream_hook || in_stream_hook) return;
    in_stream_hook = 1;
    stream_hook(everything);
    in_stream_hook = 0;
}

static region *regions;
static int nregions, region_cap;
static size_t held, peak;  // bytes of the regions, and the most at once (the device's peak)
static int open_depth;  // entry points in progress (ops may call the memory entry points)

static size_t page_size(void) { return (size_t)sysconf(_SC_PAGESIZE); }

static void protect(void *p, size_t bytes, int prot) {
    if (mprotect(p, bytes, prot) != 0) {
        perror("neox emulated device: mprotect");
        abort();
    }
}

// The pages [first, end) of a region whose released flag is `released`, in runs, get prot.
static void protect_pages(const region *r, size_t first, size_t end, int released, int prot) {
    size_t page = page_size();
    for (size_t i = first; i < end;) {
        if (!r->released || r->released[i] != released) {
            i++;
            continue;
        }
        size_t j = i;
        while (j < end && r->released[j] == released) j++;
        protect(r->p + i * page, (j - i) * page, prot);
        i = j;
    }
}

static void protect_all(int prot) {
    for (int i = 0; i < nregions; i++) {
        protect(regions[i].p, regions[i].bytes, prot);
        if (prot != PROT_NONE && regions[i].nreleased)
            protect_pages(&regions[i], 0, regions[i].bytes / page_size(), 1, PROT_NONE);
    }
}

static void open_memory(void) {
    if (open_depth++ == 0) protect_all(PROT_READ | PROT_WRITE);
}

static void close_memory(void) {
    if (--open_depth == 0) protect_all(PROT_NONE);
}

void neox_emulated_open(void) { open_memory(); }
void neox_emulated_close(void) { close_memory(); }

static void close_at_exit(int *unused) {
    (void)unused;
    close_memory();
}

// Opens the memory for the rest of the enclosing block.
#define OPEN_FOR_SCOPE()                                                                                      \
    open_memory();                                                                                            \
    int scope_guard __attribute__((cleanup(close_at_exit))) = 0;                                              \
    (void)scope_guard

static const region *region_of(const void *p) {
    for (int i = 0; i < nregions; i++)
        if ((const char *)p >= regions[i].p && (const char *)p < regions[i].p + regions[i].bytes) return &regions[i];
    return NULL;
}

int neox_emulated_owns(const void *p) { return region_of(p) != NULL; }

// A fault inside a region is a host access to device memory: say so, then take the default action
// (the process is lost anyway, so a formatted message is worth the risk snprintf carries here).
static void on_fault(int sig, siginfo_t *info, void *context) {
    (void)context;
    const region *r = region_of(info->si_addr);
    if (r) {
        size_t offset = (size_t)((char *)info->si_addr - r->p);
        int released = r->released && r->released[offset / page_size()];
        char msg[240];
        int n = released ? snprintf(msg, sizeof msg, "neox: emulated device memory given back by release was touched "
                                    "before a commit took it back, at %p (offset %zu of a %zu-byte buffer)\n",
                                    info->si_addr, offset, r->bytes)
                         : snprintf(msg, sizeof msg, "neox: host code touched emulated device memory at %p (offset "
                                    "%zu of a %zu-byte buffer)\n", info->si_addr, offset, r->bytes);
        if (write(2, msg, (size_t)n) < 0) _exit(134);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

// (Re)installed at every allocation: whoever replaced it (a test framework) would turn the fault into
// something else.
static void install_fault_handler(void) {
    struct sigaction sa, old;
    if (sigaction(SIGSEGV, NULL, &old) == 0 && (old.sa_flags & SA_SIGINFO) && old.sa_sigaction == on_fault) return;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, NULL);
}

static void *emu_alloc(size_t bytes) {
    install_fault_handler();
    size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (bytes ? bytes + page - 1 : page) / page * page;
    void *p = mmap(NULL, len, open_depth ? PROT_READ | PROT_WRITE : PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "neox emulated device: out of memory allocating %zu bytes\n", bytes);
        abort();
    }
    if (nregions == region_cap) {
        region_cap = region_cap ? 2 * region_cap : 64;
        regions = realloc(regions, (size_t)region_cap * sizeof *regions);
        if (!regions) abort();
    }
    regions[nregions++] = (region){p, len, NULL, 0};
    held += len;
    if (held > peak) peak = held;
    return p;
}

static void emu_free(void *p) {
    reach_stream(0);  // a queued collective may still use it
    for (int i = 0; p && i < nregions; i++)
        if (regions[i].p == p) {
            munmap(p, regions[i].bytes);
            held -= regions[i].bytes - regions[i].nreleased * page_size();
            free(regions[i].released);
            regions[i] = regions[--nregions];
            return;
        }
}

static void emu_memset_zero(void *p, size_t bytes) {
    reach_stream(0);
    OPEN_FOR_SCOPE();
    memset(p, 0, bytes);
}

// The CPU's release (MADV_DONTNEED: the host pages really go back), then the pages inside stop counting
// and stay unmapped to the device's own entry points too until committed.
static size_t emu_release(void *p, size_t bytes) {
    reach_stream(0);  // a queued collective may still read the range
    OPEN_FOR_SCOPE();
    region *r = (region *)region_of(p);
    size_t given = neox_backend_cpu()->release(p, bytes), page = page_size();
    if (!r || !given) return given;
    if (!r->released && !(r->released = calloc(r->bytes / page, 1))) abort();
    size_t first = (size_t)((char *)p - r->p + page - 1) / page;
    for (size_t i = first; i < first + given / page; i++)
        if (!r->released[i]) {
            r->released[i] = 1;
            r->nreleased++;
            held -= page;
        }
    protect_pages(r, first, first + given / page, 1, PROT_NONE);
    return given;
}

// Every page the range touches that was given back is the device's again (zero, as the CPU's
// release left it), counted from now.
static size_t emu_commit(void *p, size_t bytes) {
    region *r = (region *)region_of(p);
    if (!r || !r->nreleased || bytes == 0) return 0;
    size_t page = page_size(), first = (size_t)((char *)p - r->p) / page;
    size_t end = ((size_t)((char *)p - r->p) + bytes + page - 1) / page, taken = 0;
    if (end > r->bytes / page) end = r->bytes / page;
    if (open_depth) protect_pages(r, first, end, 1, PROT_READ | PROT_WRITE);
    for (size_t i = first; i < end; i++)
        if (r->released[i]) {
            r->released[i] = 0;
            r->nreleased--;
            taken += page;
        }
    held += taken;
    if (held > peak) peak = held;
    return taken;
}

static void emu_copy(void *dst, const void *src, size_t bytes) {
    reach_stream(0);
    OPEN_FOR_SCOPE();
    memmove(dst, src, bytes);
}

// A device's synchronous copies make the host wait (neox_note_host_wait counts it).
static void emu_to_host(void *dst, const void *src, size_t bytes) {
    neox_note_host_wait();
    emu_copy(dst, src, bytes);
}
static void emu_to_device(void *dst, const void *src, size_t bytes) {
    neox_note_host_wait();
    emu_copy(dst, src, bytes);
}

// ---- the copy queue ----------------------------------------------------------------------------
typedef struct queued_copy {
    void *dst;
    const void *src;
    size_t bytes;
    uint64_t src_hash;  // the source when queued: it must not change before the copy runs
} queued_copy;

static queued_copy *queue;
static int64_t queued, copied;  // tickets handed out, and done (copy k is queue[k - copied - 1])
static size_t queue_cap;

static uint64_t hash_bytes(const void *p, size_t bytes) {
    const unsigned char *c = p;
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < bytes; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
    return h;
}

static int64_t queue_copy(void *dst, const void *src, size_t bytes) {
    reach_stream(0);
    OPEN_FOR_SCOPE();
    size_t n = (size_t)(queued - copied);
    if (n == queue_cap) {
        queue_cap = queue_cap ? 2 * queue_cap : 64;
        queue = realloc(queue, queue_cap * sizeof *queue);
        if (!queue) abort();
    }
    queue[n] = (queued_copy){dst, src, bytes, hash_bytes(src, bytes)};
    return ++queued;
}

// Runs the queued copies up to ticket, in order.
static void run_copies(int64_t ticket) {
    if (ticket <= copied) return;
    OPEN_FOR_SCOPE();
    int64_t n = ticket - copied;
    for (int64_t i = 0; i < n; i++) {
        if (hash_bytes(queue[i].src, queue[i].bytes) != queue[i].src_hash) {
            fprintf(stderr, "neox: the source of an asynchronous copy (%zu bytes at %p) changed before the copy was "
                    "waited for\n", queue[i].bytes, queue[i].src);
            abort();
        }
        memmove(queue[i].dst, queue[i].src, queue[i].bytes);
    }
    memmove(queue, queue + n, (size_t)(queued - ticket) * sizeof *queue);
    copied = ticket;
}

static int64_t emu_to_host_async(void *dst, const void *src, size_t bytes) {
    memset(dst, 0xff, bytes);  // a NaN in every float until the copy is waited for
    return queue_copy(dst, src, bytes);
}
static int64_t emu_to_device_async(void *dst, const void *src, size_t bytes) { return queue_copy(dst, src, bytes); }
static void emu_device_wait(int64_t ticket) {
    reach_stream(0);
    run_copies(ticket);
}
// A copy that has run already (a device_wait of it or a later one ran it) costs the host no wait.
static void emu_host_wait(int64_t ticket) {
    if (ticket > copied) neox_note_host_wait();
    reach_stream(0);
    run_copies(ticket);
}
static void *emu_host_alloc(size_t bytes) { return neox_backend_cpu()->host_alloc(bytes); }
static void emu_host_free(void *p) { neox_backend_cpu()->host_free(p); }

static void emu_synchronize(void) {
    neox_note_host_wait();  // (the ops' work, which a device may still be doing, is waited for too)
    reach_stream(1);
    run_copies(queued);
}
static size_t emu_peak_bytes(void) { return peak; }

// Every op: the CPU op with the memory open. An op that returns a host value (the only return type
// other than void is double: sum_squares*) makes the host wait for it on a device.
#define EMU_OP(ret, name, params, args)                                                                       \
    static ret emu_##name params {                                                                            \
        if (#ret[0] == 'd') neox_note_host_wait();                                                            \
        reach_stream(0);                                                                                      \
        OPEN_FOR_SCOPE();                                                                                     \
        return neox_##name args;                                                                              \
    }
NEOX_BACKEND_OPS(EMU_OP)

#define EMU_ENTRY(ret, name, params, args) .name = emu_##name,

static const neox_backend emulated_backend = {
    .name = "emulated",
    .on_device = 1,
    .releases = 1,
    .alloc = emu_alloc,
    .free = emu_free,
    .memset_zero = emu_memset_zero,
    .to_device = emu_to_device,
    .to_host = emu_to_host,
    .copy = emu_copy,
    .synchronize = emu_synchronize,
    .peak_bytes = emu_peak_bytes,
    .release = emu_release,
    .commit = emu_commit,
    .release_granularity = page_size,
    .host_alloc = emu_host_alloc,
    .host_free = emu_host_free,
    .to_host_async = emu_to_host_async,
    .to_device_async = emu_to_device_async,
    .host_wait = emu_host_wait,
    .device_wait = emu_device_wait,
    NEOX_BACKEND_OPS(EMU_ENTRY)
};

const neox_backend *neox_backend_emulated(void) { return &emulated_backend; }
