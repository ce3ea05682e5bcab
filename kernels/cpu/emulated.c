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
//
// Its recordings (graph_begin/graph_end/graph_launch, kernels/backend.h) are the twin of a CUDA graph:
// while recording, each op and stream-ordered memory entry is kept as its arguments instead of run, and
// a launch runs the record again with those same arguments, so a value a step passed by value stays
// the one recorded, as it would in a graph; whatever would make the host wait or change the memory map
// inside a recording stops the process naming it.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernels/backend.h"

// ---- the recording's state (its machinery is at the end of the file) ------------------------------
static int recording;          // between graph_begin and graph_end
static int64_t last_launch;    // the ticket the last graph_launch returned (0: none yet)
static int64_t record_copies;  // copies recorded so far, in all recordings (tickets RECORDED_TICKET + index)
static int64_t record_first;   // the first index of the current recording (those before are older ones')
// Tickets handed out inside a recording stand for their copy in every launch; far above any real one.
#define RECORDED_TICKET ((int64_t)1 << 62)

static void refuse_in_recording(const char *what) {
    if (!recording) return;
    fprintf(stderr, "neox: %s inside a graph capture: the host would wait or the memory map change, which a "
            "CUDA graph cannot hold (the emulated device refuses it as CUDA would)\n", what);
    abort();
}

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
    refuse_in_recording("alloc");
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
    refuse_in_recording("free");
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

static void record_memset_zero(void *p, size_t bytes);
static void emu_memset_zero(void *p, size_t bytes) {
    if (recording) {
        record_memset_zero(p, bytes);
        return;
    }
    reach_stream(0);
    OPEN_FOR_SCOPE();
    memset(p, 0, bytes);
}

// The CPU's release (MADV_DONTNEED: the host pages really go back), then the pages inside stop counting
// and stay unmapped to the device's own entry points too until committed.
static size_t emu_release(void *p, size_t bytes) {
    refuse_in_recording("release");
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
    refuse_in_recording("commit");
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

static void record_copy(void *dst, const void *src, size_t bytes);
static void emu_copy(void *dst, const void *src, size_t bytes) {
    if (recording) {
        record_copy(dst, src, bytes);
        return;
    }
    reach_stream(0);
    OPEN_FOR_SCOPE();
    memmove(dst, src, bytes);
}

// A device's synchronous copies make the host wait (neox_note_host_wait counts it).
static void emu_to_host(void *dst, const void *src, size_t bytes) {
    refuse_in_recording("to_host (a synchronous copy)");
    neox_note_host_wait();
    emu_copy(dst, src, bytes);
}
static void emu_to_device(void *dst, const void *src, size_t bytes) {
    refuse_in_recording("to_device (a synchronous copy)");
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

static int64_t record_async_copy(int to_host, void *dst, const void *src, size_t bytes);
static int64_t emu_to_host_async(void *dst, const void *src, size_t bytes) {
    if (recording) return record_async_copy(1, dst, src, bytes);
    memset(dst, 0xff, bytes);  // a NaN in every float until the copy is waited for
    return queue_copy(dst, src, bytes);
}
static int64_t emu_to_device_async(void *dst, const void *src, size_t bytes) {
    if (recording) return record_async_copy(0, dst, src, bytes);
    return queue_copy(dst, src, bytes);
}
static void record_device_wait(int64_t ticket);
static void emu_device_wait(int64_t ticket) {
    if (recording) {
        record_device_wait(ticket);
        return;
    }
    reach_stream(0);
    run_copies(ticket);
}
// A copy that has run already (a device_wait of it or a later one ran it) costs the host no wait. A
// recorded copy's ticket stands for its last launch.
static void emu_host_wait(int64_t ticket) {
    if (ticket >= RECORDED_TICKET) {
        if (recording && ticket - RECORDED_TICKET >= record_first)
            refuse_in_recording("host_wait for a copy of the recording itself");
        ticket = last_launch;
    }
    if (ticket > copied) {
        refuse_in_recording("host_wait for a copy not yet done");
        neox_note_host_wait();
    }
    reach_stream(0);
    run_copies(ticket);
}
static void *emu_host_alloc(size_t bytes) {
    refuse_in_recording("host_alloc");
    return neox_backend_cpu()->host_alloc(bytes);
}
static void emu_host_free(void *p) {
    refuse_in_recording("host_free");
    neox_backend_cpu()->host_free(p);
}

static void emu_synchronize(void) {
    refuse_in_recording("synchronize");
    neox_note_host_wait();  // (the ops' work, which a device may still be doing, is waited for too)
    reach_stream(1);
    run_copies(queued);
}
static size_t emu_peak_bytes(void) { return peak; }

// Every op: the CPU op with the memory open. An op that returns a host value (the only return type
// other than void is double: sum_squares*) makes the host wait for it on a device.
#define EMU_RUN_OP(ret, name, params, args)                                                                   \
    static ret run_##name params {                                                                            \
        if (#ret[0] == 'd') neox_note_host_wait();                                                            \
        reach_stream(0);                                                                                      \
        OPEN_FOR_SCOPE();                                                                                     \
        return neox_##name args;                                                                              \
    }
NEOX_BACKEND_OPS(EMU_RUN_OP)

// ---- recordings ----------------------------------------------------------------------------------
// One recorded call: how to run it again and a copy of its arguments.
typedef struct recorded_call {
    void (*replay)(const void *args);
    void *args;
} recorded_call;

static recorded_call *record;
static int nrecord, record_cap;
static int64_t *launch_tickets;  // what each copy of the recording is in the current launch (from record_first)

static void record_call(void (*replay)(const void *), const void *args, size_t bytes) {
    if (nrecord == record_cap) {
        record_cap = record_cap ? 2 * record_cap : 256;
        record = realloc(record, (size_t)record_cap * sizeof *record);
        if (!record) abort();
    }
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) abort();
    memcpy(copy, args, bytes);
    record[nrecord++] = (recorded_call){replay, copy};
}

// Applying a macro to each of up to 20 arguments: EMU_EACH(F, a, b) is F(a) F(b); EMU_LIST(F, a, b) is F(a), F(b).
#define EMU_UNPAREN(...) __VA_ARGS__
#define EMU_CAT(a, b) EMU_CAT_(a, b)
#define EMU_CAT_(a, b) a##b
#define EMU_NARGS(...) EMU_NARGS_(__VA_ARGS__, 20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1)
#define EMU_NARGS_(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, _16, _17, _18, _19, _20, N, ...) N
#define EMU_EACH(F, ...) EMU_CAT(EMU_EACH_, EMU_NARGS(__VA_ARGS__))(F, __VA_ARGS__)
#define EMU_LIST(F, ...) EMU_CAT(EMU_LIST_, EMU_NARGS(__VA_ARGS__))(F, __VA_ARGS__)
#define EMU_EACH_1(F, x) F(x)
#define EMU_LIST_1(F, x) F(x)
#define EMU_EACH_2(F, x, ...) F(x) EMU_EACH_1(F, __VA_ARGS__)
#define EMU_LIST_2(F, x, ...) F(x), EMU_LIST_1(F, __VA_ARGS__)
#define EMU_EACH_3(F, x, ...) F(x) EMU_EACH_2(F, __VA_ARGS__)
#define EMU_LIST_3(F, x, ...) F(x), EMU_LIST_2(F, __VA_ARGS__)
#define EMU_EACH_4(F, x, ...) F(x) EMU_EACH_3(F, __VA_ARGS__)
#define EMU_LIST_4(F, x, ...) F(x), EMU_LIST_3(F, __VA_ARGS__)
#define EMU_EACH_5(F, x, ...) F(x) EMU_EACH_4(F, __VA_ARGS__)
#define EMU_LIST_5(F, x, ...) F(x), EMU_LIST_4(F, __VA_ARGS__)
#define EMU_EACH_6(F, x, ...) F(x) EMU_EACH_5(F, __VA_ARGS__)
#define EMU_LIST_6(F, x, ...) F(x), EMU_LIST_5(F, __VA_ARGS__)
#define EMU_EACH_7(F, x, ...) F(x) EMU_EACH_6(F, __VA_ARGS__)
#define EMU_LIST_7(F, x, ...) F(x), EMU_LIST_6(F, __VA_ARGS__)
#define EMU_EACH_8(F, x, ...) F(x) EMU_EACH_7(F, __VA_ARGS__)
#define EMU_LIST_8(F, x, ...) F(x), EMU_LIST_7(F, __VA_ARGS__)
#define EMU_EACH_9(F, x, ...) F(x) EMU_EACH_8(F, __VA_ARGS__)
#define EMU_LIST_9(F, x, ...) F(x), EMU_LIST_8(F, __VA_ARGS__)
#define EMU_EACH_10(F, x, ...) F(x) EMU_EACH_9(F, __VA_ARGS__)
#define EMU_LIST_10(F, x, ...) F(x), EMU_LIST_9(F, __VA_ARGS__)
#define EMU_EACH_11(F, x, ...) F(x) EMU_EACH_10(F, __VA_ARGS__)
#define EMU_LIST_11(F, x, ...) F(x), EMU_LIST_10(F, __VA_ARGS__)
#define EMU_EACH_12(F, x, ...) F(x) EMU_EACH_11(F, __VA_ARGS__)
#define EMU_LIST_12(F, x, ...) F(x), EMU_LIST_11(F, __VA_ARGS__)
#define EMU_EACH_13(F, x, ...) F(x) EMU_EACH_12(F, __VA_ARGS__)
#define EMU_LIST_13(F, x, ...) F(x), EMU_LIST_12(F, __VA_ARGS__)
#define EMU_EACH_14(F, x, ...) F(x) EMU_EACH_13(F, __VA_ARGS__)
#define EMU_LIST_14(F, x, ...) F(x), EMU_LIST_13(F, __VA_ARGS__)
#define EMU_EACH_15(F, x, ...) F(x) EMU_EACH_14(F, __VA_ARGS__)
#define EMU_LIST_15(F, x, ...) F(x), EMU_LIST_14(F, __VA_ARGS__)
#define EMU_EACH_16(F, x, ...) F(x) EMU_EACH_15(F, __VA_ARGS__)
#define EMU_LIST_16(F, x, ...) F(x), EMU_LIST_15(F, __VA_ARGS__)
#define EMU_EACH_17(F, x, ...) F(x) EMU_EACH_16(F, __VA_ARGS__)
#define EMU_LIST_17(F, x, ...) F(x), EMU_LIST_16(F, __VA_ARGS__)
#define EMU_EACH_18(F, x, ...) F(x) EMU_EACH_17(F, __VA_ARGS__)
#define EMU_LIST_18(F, x, ...) F(x), EMU_LIST_17(F, __VA_ARGS__)
#define EMU_EACH_19(F, x, ...) F(x) EMU_EACH_18(F, __VA_ARGS__)
#define EMU_LIST_19(F, x, ...) F(x), EMU_LIST_18(F, __VA_ARGS__)
#define EMU_EACH_20(F, x, ...) F(x) EMU_EACH_19(F, __VA_ARGS__)
#define EMU_LIST_20(F, x, ...) F(x), EMU_LIST_19(F, __VA_ARGS__)

// Each op's arguments as a struct (its parameter list with semicolons).
#define EMU_FIELD(param) param;
#define EMU_ARGS_STRUCT(ret, name, params, args) struct args_##name { EMU_EACH(EMU_FIELD, EMU_UNPAREN params) };
NEOX_BACKEND_OPS(EMU_ARGS_STRUCT)

// The host array an op reads when called (the segment tables: a CUDA op uploads its table then, so a
// graph holds that table's contents): the recording keeps its own copy, freed with the recording.
static void **kept_tables;
static int nkept, kept_cap;

static const neox_segment *keep_segments(const neox_segment *segs, int nseg) {
    if (nkept == kept_cap) {
        kept_cap = kept_cap ? 2 * kept_cap : 16;
        kept_tables = realloc(kept_tables, (size_t)kept_cap * sizeof *kept_tables);
        if (!kept_tables) abort();
    }
    neox_segment *copy = malloc((size_t)(nseg > 0 ? nseg : 1) * sizeof *copy);
    if (!copy) abort();
    memcpy(copy, segs, (size_t)(nseg > 0 ? nseg : 0) * sizeof *copy);
    return kept_tables[nkept++] = copy;
}

#define EMU_SEGMENT_OPS(X) X(sum_squares_segments_into) X(adamw_segments) X(sgd_segments) X(lion_segments) \
    X(madgrad_segments)
#define EMU_KEEP_SEGMENTS(name)                                                                               \
    static void keep_tables_##name(void *args) {                                                              \
        struct args_##name *a = args;                                                                         \
        a->segs = keep_segments(a->segs, a->nseg);                                                            \
    }
EMU_SEGMENT_OPS(EMU_KEEP_SEGMENTS)
#define EMU_KEEP_ENTRY(name) [NEOX_OP_##name] = keep_tables_##name,
static void (*const keep_tables[NEOX_OP_COUNT])(void *args) = {EMU_SEGMENT_OPS(EMU_KEEP_ENTRY)};

// A recorder that keeps an op's arguments and a replayer that calls the op with them. An op that
// returns a host value cannot be recorded.
#define EMU_MEMBER(arg) recorded_->arg
#define EMU_RECORDED_OP(ret, name, params, args)                                                              \
    static void replay_##name(const void *recorded_args_) {                                                   \
        const struct args_##name *recorded_ = recorded_args_;                                                 \
        (void)run_##name(EMU_LIST(EMU_MEMBER, EMU_UNPAREN args));                                             \
    }                                                                                                         \
    static void record_##name params {                                                                        \
        if (#ret[0] == 'd') refuse_in_recording(#name " (an op that returns a host value)");                  \
        struct args_##name recorded_ = {EMU_UNPAREN args};                                                    \
        if (keep_tables[NEOX_OP_##name]) keep_tables[NEOX_OP_##name](&recorded_);                             \
        record_call(replay_##name, &recorded_, sizeof recorded_);                                             \
    }
NEOX_BACKEND_OPS(EMU_RECORDED_OP)

// The table's ops: run, or recorded while a recording is open.
#define EMU_OP(ret, name, params, args)                                                                       \
    static ret emu_##name params {                                                                            \
        if (!recording) return run_##name args;                                                               \
        record_##name args;                                                                                   \
        return (ret)0;                                                                                        \
    }
#define EMU_VOID_OP(ret, name, params, args)                                                                  \
    static void emu_##name params {                                                                           \
        if (recording) record_##name args;                                                                    \
        else run_##name args;                                                                                 \
    }
#define EMU_ANY_OP(ret, name, params, args) EMU_SELECT_##ret(ret, name, params, args)
#define EMU_SELECT_void EMU_VOID_OP
#define EMU_SELECT_double EMU_OP
NEOX_BACKEND_OPS(EMU_ANY_OP)

// The stream-ordered memory entries, recorded likewise (they run again through the table's own).
typedef struct recorded_memory {
    void *dst;
    const void *src;
    size_t bytes;
    int64_t index;  // a copy's place among the recording's copies; a device_wait's copy (or a real ticket)
    int to_host;
} recorded_memory;

static void replay_memset_zero(const void *p) {
    const recorded_memory *r = p;
    emu_memset_zero(r->dst, r->bytes);
}
static void record_memset_zero(void *p, size_t bytes) {
    recorded_memory r = {.dst = p, .bytes = bytes};
    record_call(replay_memset_zero, &r, sizeof r);
}
static void replay_copy(const void *p) {
    const recorded_memory *r = p;
    emu_copy(r->dst, r->src, r->bytes);
}
static void record_copy(void *dst, const void *src, size_t bytes) {
    recorded_memory r = {.dst = dst, .src = src, .bytes = bytes};
    record_call(replay_copy, &r, sizeof r);
}
static void replay_async_copy(const void *p) {
    const recorded_memory *r = p;
    void *dst = r->dst;
    launch_tickets[r->index - record_first] = r->to_host ? emu_to_host_async(dst, r->src, r->bytes)
                                          : emu_to_device_async(dst, r->src, r->bytes);
}
static int64_t record_async_copy(int to_host, void *dst, const void *src, size_t bytes) {
    recorded_memory r = {.dst = dst, .src = src, .bytes = bytes, .index = record_copies++, .to_host = to_host};
    record_call(replay_async_copy, &r, sizeof r);
    return RECORDED_TICKET + r.index;
}
static void replay_device_wait(const void *p) {
    const recorded_memory *r = p;
    int64_t ticket = r->index;
    if (ticket >= RECORDED_TICKET + record_first) ticket = launch_tickets[ticket - RECORDED_TICKET - record_first];
    else if (ticket >= RECORDED_TICKET) ticket = last_launch;  // (an older recording's copy)
    emu_device_wait(ticket);
}
static void record_device_wait(int64_t ticket) {
    recorded_memory r = {.index = ticket};
    record_call(replay_device_wait, &r, sizeof r);
}

static void emu_graph_begin(void) {
    if (recording) refuse_in_recording("graph_begin (a recording is open already)");
    for (int i = 0; i < nrecord; i++) free(record[i].args);
    for (int i = 0; i < nkept; i++) free(kept_tables[i]);
    nrecord = nkept = 0;
    record_first = record_copies;
    recording = 1;
}

static void emu_graph_end(void) {
    if (!recording) {
        fprintf(stderr, "neox: graph_end without graph_begin\n");
        abort();
    }
    recording = 0;
    free(launch_tickets);
    launch_tickets = calloc((size_t)(record_copies - record_first + 1), sizeof *launch_tickets);
    if (!launch_tickets) abort();
}

// The recording run again, in order; its ticket is the newest copy's (every earlier one runs first).
static int64_t emu_graph_launch(void) {
    if (recording) refuse_in_recording("graph_launch");
    for (int i = 0; i < nrecord; i++) record[i].replay(record[i].args);
    return last_launch = queued;
}

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
    .graph_begin = emu_graph_begin,
    .graph_end = emu_graph_end,
    .graph_launch = emu_graph_launch,
    NEOX_BACKEND_OPS(EMU_ENTRY)
};

const neox_backend *neox_backend_emulated(void) { return &emulated_backend; }
