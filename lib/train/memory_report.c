// memory_report.c: what a training run says of its memory — the plan of every rank by region at
// start-up (the trainer's own buffers here, each registered part's added by its memory hook) (the "memory of rank N" lines, log_dir/memory_plan.json), the measured peaks as gauges
// of the metrics at each log (rank 0's own and the largest of any rank), and every rank's measured
// peak beside its plan at the end (log_dir/memory_peaks.json); under memory_profiling, a rank's
// snapshot of its plan by owner beside its measured peak after each profiled step.
// The reductions and gathers of measured peaks are bookkeeping: they honour comm_timeout_seconds
// but are not counted by the communication accounting (whose per-step bytes the tests predict).
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// The regions as the start-up line, memory_plan.json and a memory snapshot name them, in the
// order of neox_memory_plan's fields.
static const char *const region_names[] = {"parameters", "16-bit copies", "gradients", "optimizer", "activations",
                                           "communication", "offloaded"};
enum { REGIONS = sizeof(neox_memory_plan) / sizeof(double) };
_Static_assert(sizeof region_names / sizeof *region_names == REGIONS, "a name for every region");

static void own(neox_memory_owner_fn fn, void *ctx, const char *owner, int region, double bytes) {
    neox_memory_plan p = {0};
    ((double *)&p)[region] = bytes;
    fn(ctx, owner, &p);
}

enum { PARAMS, PARAMS16, GRADS, OPTIMIZER, ACTIVATIONS, COMM, OFFLOADED };

// SM3's per-tensor accumulators, whole on every rank: the step's two sets (the current ones and
// those it forms).
static double optimizer_accumulator_bytes(const neox_trainer *t) {
    int n;
    neox_optimizer_tensor *ts = neox_train_optimizer_tensors(t, &n);
    double floats = (double)neox_optimizer_accumulator_floats(&t->optim, ts, n);
    free(ts);
    return 2 * floats * sizeof(float);
}

// MPI's own temporary for the largest collective of the tensor-parallel group on CPU ranks: the
// all-reduce of a layer's (N, C) rows (both branches' input gradients at once under the parallel
// residual), or under sequence parallelism the reduce-scatter of (N, C) partial sums.
static double tensor_parallel_scratch(const neox_trainer *t) {
    const neox_model_desc *d = &t->model->desc;
    if (t->be->on_device || d->tp_size <= 1) return 0;
    double rows = (double)t->rows * t->seq_length;
    return 4 * rows * d->hidden_size * (d->parallel_residual && !d->sequence_parallel ? 2 : 1);
}

void neox_train_memory_owners(const neox_trainer *t, neox_memory_owner_fn fn, void *ctx) {
    const neox_model *m = t->model;
    // Parameters: the fp32 master weights and, in a 16-bit precision, their 16-bit copies.
    own(fn, ctx, "model parameters", PARAMS, (double)m->num_floats * 4);
    own(fn, ctx, "model 16-bit copies", PARAMS16, m->param16 ? (double)m->num_floats * 2 : 0);
    own(fn, ctx, "optimizer state", OPTIMIZER,
        (double)(t->state_end - t->state_begin) * (double)neox_optimizer_state_bytes_per_element(&t->optim));
    own(fn, ctx, "optimizer accumulators (per row and column)", OPTIMIZER, optimizer_accumulator_bytes(t));
    own(fn, ctx, "activation plan", ACTIVATIONS, (double)neox_model_activation_bytes(m));
    own(fn, ctx, "layer inputs on the host (checkpoint_in_cpu)", OFFLOADED, (double)neox_model_host_recompute_bytes(m));
    // The collectives' own temporaries on the host (MPI): the partitions' all-gather after the
    // update (stages 1, 2; the exchange adds its buckets' own).
    own(fn, ctx, "partition all-gather scratch", COMM, (double)neox_train_gather_scratch_bytes(t));
    own(fn, ctx, "tensor-parallel collective scratch", COMM, tensor_parallel_scratch(t));
    own(fn, ctx, "pipeline gradient send", COMM,
        t->pipe_grad_send ? (double)neox_model_stream_floats(&m->desc, t->rows, t->seq_length) * 4 : 0);
    // (The gradients and their communication: the exchange's part; ZeRO-3, the offload, the
    // reference model: theirs.)
    neox_train_parts_memory(t, fn, ctx);
}

static void add_owner(void *ctx, const char *owner, const neox_memory_plan *bytes) {
    (void)owner;
    double *sum = ctx;
    for (int i = 0; i < REGIONS; i++) sum[i] += ((const double *)bytes)[i];
}

void neox_train_memory_plan(const neox_trainer *t, neox_memory_plan *p) {
    memset(p, 0, sizeof *p);
    neox_train_memory_owners(t, add_owner, p);
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

// The model's activation plan by layer (neox_model_activation_layout), as LAYOUT doubles after a
// rank's regions, and its names in memory_plan.json.
enum { LAYOUT = 5, ENTRY = REGIONS + LAYOUT };
static const char *const layout_names[LAYOUT] = {"per_layer", "layers", "slots", "layer_set", "rest"};

static void activation_layout(const neox_trainer *t, double *out) {
    neox_activation_layout a = neox_model_activation_layout(t->model);
    double v[LAYOUT] = {(double)a.per_layer, a.layers, a.slots, (double)a.layer_set, (double)a.rest};
    memcpy(out, v, sizeof v);
}

// The plan of every rank in exact bytes, as log_dir/memory_plan.json (rank 0, with log_dir set):
// {"ranks": [{"parameters": B, ..., "offloaded": B}, ...], "activation_layers": [{"per_layer": B,
// "layers": L, "slots": S, "layer_set": B, "rest": B}, ...]}, regions named as the start-up line
// names them; the model's activations are slots x layers x per_layer + rest.
static int write_memory_plan(const neox_trainer *t, const double *all, int n, neox_error *err) {
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!t->rank0 || !dir) return 0;
    json_t *ranks = json_array(), *layers = json_array();
    for (int r = 0; r < n; r++) {
        json_t *rank = json_object(), *layout = json_object();
        for (int i = 0; i < REGIONS; i++)
            json_object_set_new(rank, region_names[i], json_integer((json_int_t)all[ENTRY * r + i]));
        for (int i = 0; i < LAYOUT; i++)
            json_object_set_new(layout, layout_names[i], json_integer((json_int_t)all[ENTRY * r + REGIONS + i]));
        json_array_append_new(ranks, rank);
        json_array_append_new(layers, layout);
    }
    return write_report(dir, "memory_plan.json", json_pack("{s:o, s:o}", "ranks", ranks, "activation_layers", layers), 0,
                        err);
}

// Each rank's planned memory by region, printed by rank 0 and written to log_dir/memory_plan.json
// (a failure to write it is a warning: the other ranks are past the point where they could stop).
void neox_train_report_memory_plan(const neox_trainer *t) {
    neox_memory_plan plan;
    neox_train_memory_plan(t, &plan);
    double mine[ENTRY];
    memcpy(mine, &plan, REGIONS * sizeof(double));
    activation_layout(t, mine + REGIONS);
    int n = t->grid->world_size;
    double *all = neox_malloc((size_t)n * ENTRY * sizeof(double));
    if (n > 1) neox_allgather(&t->grid->world, mine, all, ENTRY, NEOX_F64);
    else memcpy(all, mine, sizeof mine);
    for (int r = 0; t->rank0 && !t->opts.quiet && r < n; r++) {
        if (n > 8 && r >= 4 && r < n - 4) {
            if (r == 4) neox_info("memory: ... (%d more ranks)", n - 8);
            continue;
        }
        const double *x = all + ENTRY * r;
        double total = 0;
        for (int i = 0; i < REGIONS; i++) total += x[i];
        char b[REGIONS + 1][16];
        for (int i = 0; i < REGIONS; i++) neox_format_bytes(x[i], b[i], sizeof b[i]);
        neox_info("memory of rank %d: %s = parameters %s + 16-bit copies %s + gradients %s + optimizer %s + activations "
                  "%s + communication %s + offloaded %s", r, neox_format_bytes(total, b[REGIONS], sizeof b[REGIONS]),
                  b[0], b[1], b[2], b[3], b[4], b[5], b[6]);
        const double *y = x + REGIONS;
        char per[16], rest[16];
        neox_info("activations of rank %d: %d slot(s) x %d layer(s) x %s per layer + %s", r, (int)y[2], (int)y[1],
                  neox_format_bytes(y[0], per, sizeof per), neox_format_bytes(y[4], rest, sizeof rest));
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

// ---- memory_profiling's snapshot ----------------------------------------------------------------

// The owners of a snapshot, one entry per (owner, region) with bytes, and the regions' sums.
typedef struct snapshot_owners {
    const neox_trainer *t;
    json_t *owners;
    double regions[REGIONS];
} snapshot_owners;

// Where a region's bytes live: the host for offloaded state, host temporaries of MPI and every byte
// of a backend without a device; otherwise the device.
static const char *memory_of(const neox_trainer *t, const char *owner, int region) {
    int host = !t->be->on_device || region == OFFLOADED || !strcmp(owner, "partition all-gather scratch");
    return host ? "host" : "device";
}

static void snapshot_owner(void *ctx, const char *owner, const neox_memory_plan *bytes) {
    snapshot_owners *s = ctx;
    for (int i = 0; i < REGIONS; i++) {
        double b = ((const double *)bytes)[i];
        if (b == 0) continue;
        s->regions[i] += b;
        json_array_append_new(s->owners, json_pack("{s:s, s:s, s:I, s:s}", "owner", owner, "region", region_names[i],
                                                   "bytes", (json_int_t)b, "memory", memory_of(s->t, owner, i)));
    }
}

static int larger_first(const void *a, const void *b) {
    json_int_t x = json_integer_value(json_object_get(*(json_t *const *)a, "bytes"));
    json_int_t y = json_integer_value(json_object_get(*(json_t *const *)b, "bytes"));
    return (x < y) - (x > y);
}

// The peak: the plan holds every byte it names from start-up to the end (decision 3), so the owners
// of the measured peak are the plan's largest; what the measurement holds beyond the plan is
// unplanned (libraries, scratch, the host's own).
static json_t *peak_json(const neox_trainer *t, json_t *owners, double planned) {
    double measured = t->be->on_device ? (double)t->be->peak_bytes() : (double)neox_peak_rss_bytes();
    size_t n = json_array_size(owners);
    json_t **sorted = neox_malloc((n ? n : 1) * sizeof *sorted);
    for (size_t i = 0; i < n; i++) sorted[i] = json_array_get(owners, i);
    qsort(sorted, n, sizeof *sorted, larger_first);
    json_t *largest = json_array();
    for (size_t i = 0; i < n && i < 5; i++) json_array_append(largest, sorted[i]);
    free(sorted);
    return json_pack("{s:s, s:I, s:I, s:I, s:o}", "measured", t->be->on_device ? "device_peak_bytes" : "peak_rss_bytes",
                     "measured_bytes", (json_int_t)measured, "planned_bytes", (json_int_t)planned, "unplanned_bytes",
                     (json_int_t)(measured - planned), "owners", largest);
}

int neox_train_write_memory_snapshot(const neox_trainer *t, const char *dir, neox_error *err) {
    snapshot_owners s = {.t = t, .owners = json_array()};
    neox_train_memory_owners(t, snapshot_owner, &s);
    json_t *regions = json_object();
    double planned = 0;
    for (int i = 0; i < REGIONS; i++) {
        json_object_set_new(regions, region_names[i], json_integer((json_int_t)s.regions[i]));
        planned += s.regions[i];
    }
    json_t *measured = json_pack("{s:I}", "peak_rss_bytes", (json_int_t)neox_peak_rss_bytes());
    if (t->be->on_device) json_object_set_new(measured, "device_peak_bytes", json_integer((json_int_t)t->be->peak_bytes()));
    json_t *doc = json_pack("{s:I, s:i, s:s, s:o, s:I, s:o, s:o, s:o}", "iteration", (json_int_t)t->state.iteration,
                            "rank", t->grid->world_rank, "backend", t->be->name, "regions", regions, "planned_bytes",
                            (json_int_t)planned, "owners", s.owners, "measured", measured, "peak",
                            peak_json(t, s.owners, planned));
    char name[96];
    snprintf(name, sizeof name, "memory_snapshot_rank%d_iter%lld.json", t->grid->world_rank, (long long)t->state.iteration);
    return write_report(dir, name, doc, JSON_PRESERVE_ORDER, err);
}
