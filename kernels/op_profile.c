// op_profile.c: the per-op profile (kernels/backend.h): a backend table that wraps another, one
// wrapper per NEOX_BACKEND_OPS entry generated from the list as kernels/cpu/emulated.c generates its
// own, each adding the call's cost (kernels/op_cost.c) and time to the sums of its op in the scope
// the model set (phase, layer). Installed only when a run asks for it, so an unprofiled table is the
// backend's own and costs nothing.
//
// Times: on the CPU and the emulated device an op has finished when its call returns, so the wall
// clock around the call is its time. On the cuda backend a call only queues work; two CUDA events
// around it on the op stream time it on the device (kernels/cuda/op_timing.cu), and the events are
// read in batches of PENDING_MAX calls (reading waits for the device, so a profiled GPU run stalls
// once per batch: it measures the ops, not the overlap of host and device).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/backend.h"
#ifdef NEOX_CUDA
#include "kernels/cuda/cuda.h"
#endif

#define PENDING_MAX 2048

static const neox_backend *inner;
static neox_backend table;
static int keep_trace, device_events;
static neox_phase scope_phase = NEOX_PHASE_OTHER;
static int scope_layer = -1;

// Sums per (layer slot, phase, op); slot 0 is "outside the layers", slot l + 1 is layer l.
static neox_op_stat *stats;
static int layer_slots, layers_seen;
static neox_op_call *trace;
static size_t ntrace, trace_cap;

#ifdef NEOX_CUDA
// Calls whose device time is not read yet: the stat they add to and their two events.
typedef struct pending_call {
    size_t stat;
    int start, stop;
} pending_call;
static pending_call pending[PENDING_MAX];
static int npending;
#endif

static const char *const phase_names[NEOX_PHASE_COUNT] = {"forward", "backward", "optimizer", "other"};
const char *neox_phase_name(neox_phase p) { return p >= 0 && p < NEOX_PHASE_COUNT ? phase_names[p] : "?"; }

void neox_profile_scope(neox_phase phase, int layer) {
    scope_phase = phase;
    scope_layer = layer;
}

static int64_t host_waits;
void neox_note_host_wait(void) { host_waits++; }
int64_t neox_host_waits(void) { return host_waits; }

static void *grown(void *p, size_t bytes) {
    p = realloc(p, bytes);
    if (!p) {
        fprintf(stderr, "neox: out of memory growing the op profile (%zu bytes)\n", bytes);
        abort();
    }
    return p;
}

static size_t stat_index(int slot, neox_phase phase, neox_op_id op) {
    return ((size_t)slot * NEOX_PHASE_COUNT + (size_t)phase) * NEOX_OP_COUNT + (size_t)op;
}

// The stat of op in the current scope, growing the layer slots to hold it.
static size_t current_stat(neox_op_id op) {
    int slot = scope_layer + 1 > 0 ? scope_layer + 1 : 0;
    if (slot >= layer_slots) {
        int slots = slot + 1 > 2 * layer_slots ? slot + 1 : 2 * layer_slots;
        size_t per_slot = (size_t)NEOX_PHASE_COUNT * NEOX_OP_COUNT;
        stats = grown(stats, (size_t)slots * per_slot * sizeof *stats);
        memset(stats + (size_t)layer_slots * per_slot, 0, (size_t)(slots - layer_slots) * per_slot * sizeof *stats);
        layer_slots = slots;
    }
    if (scope_layer + 1 > layers_seen) layers_seen = scope_layer + 1;
    return stat_index(slot, scope_phase, op);
}

static double wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void neox_profile_flush(void) {
#ifdef NEOX_CUDA
    for (int i = 0; i < npending; i++)
        stats[pending[i].stat].seconds += 1e-3 * neox_cuda_timing_elapsed_ms(pending[i].start, pending[i].stop);
    if (npending) neox_cuda_timing_reset();
    npending = 0;
#endif
}

// What op_end needs of a call: its stat, and its start (seconds, or an event's index).
typedef struct op_timing {
    size_t stat;
    double t0;
    int start;
} op_timing;

static op_timing op_begin(neox_op_id op, neox_op_cost cost) {
    size_t s = current_stat(op);
    stats[s].calls++;
    stats[s].flops += cost.flops;
    stats[s].bytes += cost.bytes;
    if (keep_trace) {
        if (ntrace == trace_cap) trace = grown(trace, (trace_cap = trace_cap ? 2 * trace_cap : 4096) * sizeof *trace);
        trace[ntrace++] = (neox_op_call){op, scope_phase, scope_layer < 0 ? -1 : scope_layer, cost};
    }
    op_timing t = {.stat = s};
#ifdef NEOX_CUDA
    if (device_events) {
        t.start = neox_cuda_timing_mark();
        return t;
    }
#endif
    t.t0 = wall_seconds();
    return t;
}

static void op_end(op_timing *t) {
#ifdef NEOX_CUDA
    if (device_events) {
        pending[npending++] = (pending_call){t->stat, t->start, neox_cuda_timing_mark()};
        if (npending == PENDING_MAX) neox_profile_flush();
        return;
    }
#endif
    stats[t->stat].seconds += wall_seconds() - t->t0;
}

// Every op: the inner table's, between op_begin and op_end (run at the end of the block, after the
// call's result is taken).
#define PROFILED_OP(ret, name, params, args)                                                                  \
    static ret profiled_##name params {                                                                       \
        op_timing timing __attribute__((cleanup(op_end), unused)) =                                           \
            op_begin(NEOX_OP_##name, neox_op_cost_##name args);                                               \
        return inner->name args;                                                                              \
    }
NEOX_BACKEND_OPS(PROFILED_OP)

#define PROFILED_ENTRY(ret, name, params, args) table.name = profiled_##name;

void neox_profile_reset(void) {
    neox_profile_flush();
    if (stats) memset(stats, 0, (size_t)layer_slots * NEOX_PHASE_COUNT * NEOX_OP_COUNT * sizeof *stats);
    layers_seen = 0;
    ntrace = 0;
}

const neox_backend *neox_profile_install(const neox_backend *wrapped, int trace_calls) {
    neox_profile_reset();
    inner = wrapped;
    keep_trace = trace_calls;
    table = *wrapped;  // the name, on_device and memory entries stay the wrapped table's
    NEOX_BACKEND_OPS(PROFILED_ENTRY)
    // (a recording would freeze the profile's timing around each op, and CUDA events cannot be read in one)
    table.graph_begin = NULL, table.graph_end = NULL, table.graph_launch = NULL;
    // (a team's ops run on several threads at once, which the per-op timers do not expect)
    table.team_threads = NULL, table.team_run = NULL, table.team_barrier = NULL, table.team_linear = NULL;
    device_events = 0;
#ifdef NEOX_CUDA
    device_events = !strcmp(wrapped->name, "cuda");
#endif
    return &table;
}

const neox_backend *neox_profile_inner(void) { return inner; }
const char *neox_profile_timing(void) { return device_events ? "CUDA events" : "wall clock"; }
int neox_profile_layers(void) { return layers_seen; }

neox_op_stat neox_profile_stat(neox_phase phase, int layer, neox_op_id op) {
    int slot = layer < 0 ? 0 : layer + 1;
    if (slot >= layer_slots || phase < 0 || phase >= NEOX_PHASE_COUNT || op < 0 || op >= NEOX_OP_COUNT)
        return (neox_op_stat){0};
    return stats[stat_index(slot, phase, op)];
}

const neox_op_call *neox_profile_trace(size_t *ncalls) {
    *ncalls = ntrace;
    return trace;
}
