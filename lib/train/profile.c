// profile.c: `profile` and `memory_profiling` with their window `profile_step_start` and
// `profile_step_stop` (GPT-NeoX's keys; docs/metrics.md, "Profiling a run"). The window is the steps
// that begin with start <= completed iterations < stop, stop - start of them, as GPT-NeoX's torch
// profiler records (its `active`). With `profile` the range API (lib/core/trace.c) captures them:
// each rank writes log_dir/trace_rankN.json when the window closes (or the run ends inside it), and
// a CUDA build's NVTX ranges and cudaProfilerStart/Stop mark the same steps for Nsight Systems. With
// `memory_profiling` each rank writes a snapshot of its memory after each step of the window into
// memory_profiling_path. The loop calls the step's two functions; the part reads the keys and frees.
#include <string.h>

#include "internal.h"

typedef struct neox_profile_run {
    int trace, memory;      // profile, memory_profiling
    int64_t start, stop;    // the window, in completed iterations
    const char *memory_path;
    int capturing;          // the trace's capture is on
} neox_profile_run;

extern const neox_train_part neox_train_profile_part;

static neox_profile_run *profile_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_profile_part); }

static int setup_profile(neox_trainer *t, neox_error *err) {
    int trace = neox_config_bool(t->cfg, profile), memory = neox_config_bool(t->cfg, memory_profiling);
    if (!trace && !memory) return 0;
    int64_t start = neox_config_int(t->cfg, profile_step_start), stop = neox_config_int(t->cfg, profile_step_stop);
    if (stop <= start)
        return neox_fail(err, NEOX_EXIT_USAGE, "profile_step_stop (%lld) must be greater than profile_step_start (%lld): "
                         "the window is the steps from start to stop, stop - start of them", (long long)stop, (long long)start);
    if (trace && !neox_config_str(t->cfg, log_dir))
        return neox_fail(err, NEOX_EXIT_USAGE, "profile: set log_dir (each rank writes its trace there as trace_rankN.json)");
    const char *path = neox_config_str(t->cfg, memory_profiling_path);
    if (memory && (!path || !*path))
        return neox_fail(err, NEOX_EXIT_USAGE, "memory_profiling: set memory_profiling_path (the folder the snapshots go to)");
    neox_profile_run *p = neox_calloc(1, sizeof *p);
    *p = (neox_profile_run){.trace = trace, .memory = memory, .start = start, .stop = stop, .memory_path = path};
    *neox_train_part_slot(t, &neox_train_profile_part) = p;
    return 0;
}

static void free_profile(neox_trainer *t) {
    void **slot = neox_train_part_slot(t, &neox_train_profile_part);
    if (!*slot) return;
    neox_trace_stop();
    neox_trace_set_sink(NULL);
    neox_trace_free();
    free(*slot);
    *slot = NULL;
}

// Every rank's time 0 is the same moment: the end of an all-reduce they all wait in (bookkeeping,
// not counted), so a slow rank or a wait shows where the ranks' tracks sit side by side.
static void start_capture(neox_trainer *t) {
    if (!strcmp(t->be->name, "cuda")) {
        static const neox_trace_sink nvtx = {neox_device_range_push, neox_device_range_pop, neox_device_profiler_capture};
        neox_trace_set_sink(&nvtx);
    }
    double together = 0.0;
    if (t->grid->world_size > 1) neox_allreduce_max_uncounted(&t->grid->world, &together, 1);
    neox_trace_start(neox_now());
}

static int stop_capture(neox_trainer *t, neox_error *err) {
    neox_profile_run *p = profile_of(t);
    p->capturing = 0;
    neox_trace_stop();
    char *path = neox_asprintf("%s/trace_rank%d.json", neox_config_str(t->cfg, log_dir), t->grid->world_rank);
    int rc = neox_mkdirs(neox_config_str(t->cfg, log_dir), err) == 0 ? neox_trace_write(path, t->grid->world_rank, err) : -1;
    if (rc == 0 && t->rank0 && !t->opts.quiet)
        neox_info("profile: wrote %s/trace_rank*.json (iterations %lld to %lld)", neox_config_str(t->cfg, log_dir),
                  (long long)p->start + 1, (long long)t->state.iteration);
    free(path);
    return rc;
}

static int in_window(const neox_profile_run *p, int64_t completed) { return completed >= p->start && completed < p->stop; }

void neox_train_profile_begin_step(neox_trainer *t) {
    neox_profile_run *p = profile_of(t);
    if (p && p->trace && !p->capturing && in_window(p, t->state.iteration)) {
        start_capture(t);
        p->capturing = 1;
    }
    neox_range_pushf("step %lld", (long long)t->state.iteration + 1);
}

int neox_train_profile_end_step(neox_trainer *t, neox_error *err) {
    neox_range_pop();
    neox_profile_run *p = profile_of(t);
    if (!p) return 0;
    int64_t done = t->state.iteration - 1;  // (the step just run began with this many completed)
    if (p->memory && in_window(p, done) && neox_train_write_memory_snapshot(t, p->memory_path, err) != 0) return -1;
    if (p->capturing && !in_window(p, done + 1)) return stop_capture(t, err);
    return 0;
}

int neox_train_profile_finish(neox_trainer *t, neox_error *err) {
    neox_profile_run *p = profile_of(t);
    return p && p->capturing ? stop_capture(t, err) : 0;
}

const neox_train_part neox_train_profile_part = {
    .name = "profile",
    .stage = NEOX_PART_AFTER_PRECISION,
    .setup = setup_profile,
    .free = free_profile,
};
