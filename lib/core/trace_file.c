// trace_file.c: a capture of the range API (trace.c) as a Chrome trace-event file (the JSON object
// format that Perfetto and chrome://tracing open; docs/metrics.md, "Profiling a run"): one complete
// event ("ph": "X", ts and dur in microseconds from the capture's start) per range or collective,
// pid the rank, tid the thread's track, and metadata events that name the rank and its tracks.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

// Names are our own literals and formats of numbers; anything JSON would need escaped is replaced.
static void put_name(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) fputc(*s == '"' || *s == '\\' || (unsigned char)*s < 0x20 ? '_' : *s, f);
    fputc('"', f);
}

static const char *kind_names[] = {"range", "collective", "wait"};

static void put_event(FILE *f, const neox_trace_event *e, int rank) {
    int collective = e->kind != NEOX_TRACE_RANGE;
    fputs("{\"name\": ", f);
    if (collective) {
        char name[2 * NEOX_TRACE_NAME + 8];
        snprintf(name, sizeof name, "%s%s %s", e->kind == NEOX_TRACE_WAIT ? "wait " : "", e->name, e->group);
        put_name(f, name);
    } else {
        put_name(f, e->name);
    }
    fprintf(f, ", \"cat\": \"%s\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": %d, \"tid\": %d",
            kind_names[e->kind], 1e6 * e->start, 1e6 * e->seconds, rank, e->tid);
    if (collective) {
        fputs(", \"args\": {\"op\": ", f);
        put_name(f, e->name);
        fputs(", \"group\": ", f);
        put_name(f, e->group);
        if (e->bytes >= 0) fprintf(f, ", \"bytes\": %.0f", e->bytes);
        fputc('}', f);
    }
    fputc('}', f);
}

static int max_tid(const neox_trace_event *events, size_t n) {
    int most = 0;
    for (size_t i = 0; i < n; i++)
        if (events[i].tid > most) most = events[i].tid;
    return most;
}

static void put_metadata(FILE *f, int rank, int tracks) {
    fprintf(f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": \"rank %d\"}},\n",
            rank, rank);
    fprintf(f, "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"sort_index\": %d}}",
            rank, rank);
    for (int t = 0; t < tracks; t++)
        fprintf(f, ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": \"%s %d\"}}",
                rank, t, t == 0 ? "main thread" : "helper thread", t);
}

int neox_trace_write(const char *path, int rank, neox_error *err) {
    size_t n;
    const neox_trace_event *events = neox_trace_events(&n);
    neox_atomic_file *af = neox_atomic_open(path, err);
    if (!af) return -1;
    FILE *f = af->fp;
    fputs("{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n", f);
    put_metadata(f, rank, max_tid(events, n) + 1);
    for (size_t i = 0; i < n; i++) {
        fputs(",\n", f);
        put_event(f, &events[i], rank);
    }
    fputs("\n]}\n", f);
    return neox_atomic_commit(af, err);
}
