// memory_report.c: what a training run says of its memory — the plan of every rank by region at
// start-up (the trainer's own buffers here, each registered part's added by its memory hook) (the "memory of rank N" lines, log_dir/memory_plan.json), the measured peaks as gauges
// of the metrics at each log (rank 0's own and the largest of any rank), and every rank's measured
// peak beside its plan at the end (log_dir/memory_peaks.json).
// The reductions and gathers of measured peaks are bookkeeping: they honour comm_timeout_seconds
// but are not counted by the communication accounting (whose per-step bytes the tests predict).
#include <string.h>

#include "internal.h"

void neox_train_memory_plan(const neox_trainer *t, neox_memory_plan *p) {
    const neox_model *m = t->model;
    memset(p, 0, sizeof *p);
    // Parameters: the fp32 master weights and, in a 16-bit precision, their 16-bit copies.
    p->params = (double)m->num_floats * 4;
    p->params16 = m->param16 ? (double)m->num_floats * 2 : 0;
    p->optimizer = (double)(t->state_end - t->state_begin) * (double)neox_optimizer_state_bytes_per_element(&t->optim);
    p->activations = (double)neox_model_activation_bytes(m);
    p->offloaded = (double)neox_model_host_recompute_bytes(m);  // checkpoint_in_cpu's layer inputs
    // The collectives' own temporaries on the host (MPI): the partitions' all-gather after the
    // update (stages 1, 2; the exchange adds its buckets' own).
    p->comm += (double)neox_train_gather_scratch_bytes(t);
    if (t->pipe_grad_send) p->comm += (double)t->rows * t->seq_length * m->desc.hidden_size * 4;
    // (The gradients and their communication: the exchange's part; ZeRO-3, the offload, the
    // reference model: theirs.)
    neox_train_parts_memory(t, p);
}

// DIR/NAME, atomically, from DOC (taken); flags are jansson's beyond the indent.
static int write_report(const char *dir, const char *name, json_t *doc, size_t flags, neox_error *err) {
    char *text = json_dumps(doc, JSON_INDENT(1) | flags);
    char *path = neox_asprintf("%s/%s", dir, name);
    int rc = neox_mkdirs(dir, err) == 0 ? neox_atomic_write(path, text, strlen(text), err) : -1;
    free(path);
    free(text);
    json_decref(doc);
    return rc;
}

// The plan of every rank in exact bytes, as log_dir/memory_plan.json (rank 0, with log_dir set):
// {"ranks": [{"parameters": B, ..., "offloaded": B}, ...]}, regions named as the start-up line names them.
static int write_memory_plan(const neox_trainer *t, const double *all, int n, neox_error *err) {
    static const char *names[] = {"parameters", "16-bit copies", "gradients", "optimizer", "activations",
                                  "communication", "offloaded"};
    enum { REGIONS = sizeof(neox_memory_plan) / sizeof(double) };
    _Static_assert(sizeof names / sizeof *names == REGIONS, "a name for every region");
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!t->rank0 || !dir) return 0;
    json_t *ranks = json_array();
    for (int r = 0; r < n; r++) {
        json_t *rank = json_object();
        for (int i = 0; i < REGIONS; i++) json_object_set_new(rank, names[i], json_integer((json_int_t)all[REGIONS * r + i]));
        json_array_append_new(ranks, rank);
    }
    return write_report(dir, "memory_plan.json", json_pack("{s:o}", "ranks", ranks), 0, err);
}

// Each rank's planned memory by region, printed by rank 0 and written to log_dir/memory_plan.json
// (a failure to write it is a warning: the other ranks are past the point where they could stop).
void neox_train_report_memory_plan(const neox_trainer *t) {
    neox_memory_plan plan;
    neox_train_memory_plan(t, &plan);
    enum { REGIONS = sizeof plan / sizeof(double) };
    double mine[REGIONS];
    memcpy(mine, &plan, sizeof mine);
    int n = t->grid->world_size;
    double *all = neox_malloc((size_t)n * REGIONS * sizeof(double));
    if (n > 1) neox_allgather(&t->grid->world, mine, all, REGIONS, NEOX_F64);
    else memcpy(all, mine, sizeof mine);
    for (int r = 0; t->rank0 && !t->opts.quiet && r < n; r++) {
        if (n > 8 && r >= 4 && r < n - 4) {
            if (r == 4) neox_info("memory: ... (%d more ranks)", n - 8);
            continue;
        }
        const double *x = all + REGIONS * r;
        double total = 0;
        for (int i = 0; i < REGIONS; i++) total += x[i];
        char b[REGIONS + 1][16];
        for (int i = 0; i < REGIONS; i++) neox_format_bytes(x[i], b[i], sizeof b[i]);
        neox_info("memory of rank %d: %s = parameters %s + 16-bit copies %s + gradients %s + optimizer %s + activations "
                  "%s + communication %s + offloaded %s", r, neox_format_bytes(total, b[REGIONS], sizeof b[REGIONS]),
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6]);
    }
    neox_error err = {0};
    if (write_memory_plan(t, all, n, &err) != 0) neox_warn("memory_plan.json: %s", err.message);
    free(all);
}

// The measured peaks of this rank: the resident set, and the device's allocations on a device backend.
static void measured_peaks(const neox_trainer *t, double peaks[2]) {
    peaks[0] = (double)neox_peak_rss_bytes();
    peaks[1] = t->be->on_device ? (double)t->be->peak_bytes() : 0.0;
}

void neox_train_memory_gauges(neox_trainer *t) {
    double peaks[2], largest[2];
    measured_peaks(t, peaks);
    neox_metrics_set(t->metrics, "memory/peak_rss_bytes", peaks[0]);
    if (t->be->on_device) neox_metrics_set(t->metrics, "memory/device_peak_bytes", peaks[1]);
    if (t->grid->world_size == 1) return;
    memcpy(largest, peaks, sizeof largest);
    neox_allreduce_max_uncounted(&t->grid->world, largest, 2);
    neox_metrics_set(t->metrics, "memory/max_rank_peak_rss_bytes", largest[0]);
    if (t->be->on_device) neox_metrics_set(t->metrics, "memory/max_rank_device_peak_bytes", largest[1]);
}

// log_dir/memory_peaks.json: {"iteration": N, "ranks": [{"peak_rss_bytes": B, "device_peak_bytes": B,
// "planned_bytes": B}, ...]}, the device's peak only on a device backend, the plan the sum of the
// regions of memory_plan.json.
static int write_memory_peaks(const neox_trainer *t, const double *all, int n, neox_error *err) {
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!t->rank0 || !dir) return 0;
    json_t *ranks = json_array();
    for (int r = 0; r < n; r++) {
        const double *x = all + 3 * r;
        json_t *rank = json_pack("{s:I, s:I}", "peak_rss_bytes", (json_int_t)x[0], "planned_bytes", (json_int_t)x[2]);
        if (t->be->on_device) json_object_set_new(rank, "device_peak_bytes", json_integer((json_int_t)x[1]));
        json_array_append_new(ranks, rank);
    }
    json_t *doc = json_pack("{s:I, s:o}", "iteration", (json_int_t)t->state.iteration, "ranks", ranks);
    return write_report(dir, "memory_peaks.json", doc, JSON_SORT_KEYS, err);
}

int neox_train_write_memory_peaks(const neox_trainer *t, neox_error *err) {
    neox_memory_plan plan;
    neox_train_memory_plan(t, &plan);
    enum { REGIONS = sizeof plan / sizeof(double) };
    const double *region = (const double *)&plan;
    double mine[3];
    measured_peaks(t, mine);
    mine[2] = 0;
    for (int i = 0; i < REGIONS; i++) mine[2] += region[i];
    int n = t->grid->world_size;
    double *all = neox_malloc((size_t)n * sizeof mine);
    neox_gather_uncounted(&t->grid->world, mine, 3, all);
    int rc = write_memory_peaks(t, all, n, err);
    free(all);
    return rc;
}
