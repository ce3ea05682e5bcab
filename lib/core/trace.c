// trace.c: the one range API of a profiled run (`profile`, docs/metrics.md "Profiling a run").
// Code marks what it does with neox_range_push/neox_range_pop (a step, a micro-batch's passes, a
// layer, the optimizer, a checkpoint save) and a collective reports itself once done with
// neox_trace_complete; while a capture is on, each becomes a Chrome trace event held in memory
// (written by trace_file.c) and, where a sink is set (NVTX on a CUDA build), a range of the
// device's profiler. While no capture is on every call is the one test of neox_trace_on.
//
// Ranges are per thread: each thread has its own stack and its own track (tid) in the trace.
// Events are kept in one array under a mutex, since a helper thread may report a collective.
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

_Atomic int neox_trace_on;

enum { TRACE_MAX_DEPTH = 32 };

typedef struct open_range {
    char name[NEOX_TRACE_NAME];
    double start;
} open_range;

// A thread's ranges in flight and its track; track 0 is the thread that started the capture.
typedef struct thread_ranges {
    open_range stack[TRACE_MAX_DEPTH];
    int depth;        // may pass TRACE_MAX_DEPTH: deeper ranges are counted, not recorded
    int tid;          // -1 until the thread records its first event
    unsigned epoch;   // the capture the stack belongs to (a new capture starts it empty)
} thread_ranges;

static _Thread_local thread_ranges mine = {.tid = -1};

static struct {
    pthread_mutex_t lock;
    neox_trace_event *events;
    size_t count, cap;
    double origin;        // neox_now() at the capture's start: ts 0
    pthread_t starter;    // the thread whose track is 0
    int next_tid;
    _Atomic unsigned epoch;   // counts captures (a helper thread reads it)
    neox_trace_sink sink;
} trace = {.lock = PTHREAD_MUTEX_INITIALIZER};

void neox_trace_set_sink(const neox_trace_sink *sink) {
    if (sink) trace.sink = *sink;
    else memset(&trace.sink, 0, sizeof trace.sink);
}

void neox_trace_start(double origin) {
    pthread_mutex_lock(&trace.lock);
    trace.count = 0;
    trace.origin = origin;
    trace.starter = pthread_self();
    trace.next_tid = 1;
    trace.epoch++;
    pthread_mutex_unlock(&trace.lock);
    if (trace.sink.capture) trace.sink.capture(1);
    neox_trace_on = 1;
}

void neox_trace_stop(void) {
    neox_trace_on = 0;
    if (trace.sink.capture) trace.sink.capture(0);
}

const neox_trace_event *neox_trace_events(size_t *count) {
    *count = trace.count;
    return trace.events;
}

void neox_trace_free(void) {
    neox_trace_on = 0;
    free(trace.events);
    trace.events = NULL;
    trace.count = trace.cap = 0;
}

// The calling thread's ranges, emptied when they belong to an earlier capture.
static thread_ranges *my_ranges(void) {
    if (mine.epoch != trace.epoch) {
        mine.depth = 0;
        mine.tid = -1;
        mine.epoch = trace.epoch;
    }
    return &mine;
}

static void append(const neox_trace_event *e) {
    pthread_mutex_lock(&trace.lock);
    if (trace.count == trace.cap) {
        trace.cap = trace.cap ? 2 * trace.cap : 4096;
        trace.events = neox_realloc(trace.events, trace.cap * sizeof *trace.events);
    }
    trace.events[trace.count++] = *e;
    pthread_mutex_unlock(&trace.lock);
}

static int my_tid(thread_ranges *r) {
    if (r->tid >= 0) return r->tid;
    pthread_mutex_lock(&trace.lock);
    r->tid = pthread_equal(pthread_self(), trace.starter) ? 0 : trace.next_tid++;
    pthread_mutex_unlock(&trace.lock);
    return r->tid;
}

void neox_trace_push_named(const char *name) {
    thread_ranges *r = my_ranges();
    if (r->depth < TRACE_MAX_DEPTH) {
        open_range *o = &r->stack[r->depth];
        snprintf(o->name, sizeof o->name, "%s", name);
        o->start = neox_now();
    }
    r->depth++;
    if (trace.sink.push) trace.sink.push(name);
}

void neox_trace_pushf(const char *fmt, ...) {
    char name[NEOX_TRACE_NAME];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    neox_trace_push_named(name);
}

// A pop without its push (a range opened before the capture started) is ignored.
void neox_trace_pop_range(void) {
    thread_ranges *r = my_ranges();
    if (r->depth == 0) return;
    r->depth--;
    if (trace.sink.pop) trace.sink.pop();
    if (r->depth >= TRACE_MAX_DEPTH) return;
    const open_range *o = &r->stack[r->depth];
    neox_trace_event e = {.start = o->start - trace.origin, .seconds = neox_now() - o->start, .bytes = -1,
                          .tid = my_tid(r), .depth = r->depth};
    memcpy(e.name, o->name, sizeof e.name);
    append(&e);
}

void neox_trace_complete_at(const char *name, const char *group, double start, double seconds, double bytes, int wait) {
    thread_ranges *r = my_ranges();
    neox_trace_event e = {.start = start - trace.origin, .seconds = seconds, .bytes = bytes, .tid = my_tid(r),
                          .depth = r->depth, .kind = wait ? NEOX_TRACE_WAIT : NEOX_TRACE_COLLECTIVE};
    snprintf(e.name, sizeof e.name, "%s", name);
    snprintf(e.group, sizeof e.group, "%s", group);
    append(&e);
}
