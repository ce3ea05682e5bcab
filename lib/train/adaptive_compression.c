// adaptive_compression.c: gradient_compression: adaptive in the trainer. Every
// gradient_compression_interval steps (from gradient_compression_start on) the data group measures
// its link (two timed all-reduces after a barrier), shares what each rank measured (the slowest
// rank's numbers win: a maximum over the group, so every rank decides on the same numbers), and
// lib/gradient/adaptive.c picks the scheme the next steps use: the configured all-reduce, bf16 on
// the wire, PowerSGD or 1-bit. Leaving a compressor hands its error back to the next gradients, so
// what it owed is not lost. Each decision and its inputs go to log_dir/gradient_compression.jsonl;
// gradient_compression_replay replays such a file instead of measuring (the same run again, bit
// for bit). The scheme in use and the step of the last decision are checkpointed.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PROBE_SMALL_FLOATS 256
#define PROBE_LARGE_FLOATS (256 * 1024)
#define PROBE_REPEATS 3
#define COST_SMOOTHING 0.5   // weight of the newest measurement of a scheme's own cost
#define MARGIN 0.02          // a less faithful scheme must save 2% of the step time
#define TRIAL_STEPS 3        // a scheme never run is decided on again after this many steps

struct neox_adaptive {
    neox_scheme scheme;          // what steps use now
    int64_t decided_at;          // iteration of the last decision; -1: none yet
    int64_t interval;
    int64_t trial_end;           // a scheme on trial is decided on again here; -1: no trial
    int tried[NEOX_SCHEME_COUNT];     // the scheme has run steps (its exposure has been measured)
    neox_grad_reducer *dense, *bf16;  // bf16 NULL when the configured wire is bf16 already
    double latency_s, bytes_per_s;    // the link at the last decision (0: not measured)
    double cost_s[NEOX_SCHEME_COUNT]; // this rank's measured extra cost per scheme
    double backward_s, step_s;        // this rank's last step
    double exposed_sum;               // exposed seconds of the steps since the last decision
    int64_t exposed_steps;
    double at_start[3];               // timers and clock when the step began
    float *probe;
    FILE *log;                        // rank 0, with log_dir
    int64_t *replay_iter;             // gradient_compression_replay: decisions to repeat
    neox_scheme *replay_scheme;
    int nreplay;
};

// ---- replay files ----------------------------------------------------------------------------
static int read_replay(neox_adaptive *a, const char *path, neox_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: cannot open %s", path);
    char line[8192];
    int rc = 0;
    for (int lineno = 1; rc == 0 && fgets(line, sizeof line, f); lineno++) {
        json_error_t je;
        json_t *d = json_loads(line, 0, &je);
        json_t *it = d ? json_object_get(d, "iteration") : NULL, *sc = d ? json_object_get(d, "scheme") : NULL;
        int scheme = json_is_string(sc) ? neox_scheme_from_name(json_string_value(sc)) : -1;
        if (!json_is_integer(it) || json_integer_value(it) < 0 || scheme < 0)
            rc = neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: %s line %d: expected a decision "
                           "{\"iteration\": N >= 0, \"scheme\": \"dense|bf16|powersgd|onebit\"}", path, lineno);
        else if (a->nreplay && json_integer_value(it) <= a->replay_iter[a->nreplay - 1])
            rc = neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: %s line %d: iteration %lld does not "
                           "follow the line before", path, lineno, (long long)json_integer_value(it));
        if (rc == 0) {
            a->replay_iter = neox_realloc(a->replay_iter, (size_t)(a->nreplay + 1) * sizeof *a->replay_iter);
            a->replay_scheme = neox_realloc(a->replay_scheme, (size_t)(a->nreplay + 1) * sizeof *a->replay_scheme);
            a->replay_iter[a->nreplay] = json_integer_value(it), a->replay_scheme[a->nreplay++] = scheme;
        }
        json_decref(d);
    }
    fclose(f);
    return rc;
}

// The replayed decision at this iteration, or -1 when the file has none there.
static int replayed(const neox_adaptive *a, int64_t iteration) {
    for (int i = 0; i < a->nreplay; i++)
        if (a->replay_iter[i] == iteration) return a->replay_scheme[i];
    return -1;
}

// ---- set-up ----------------------------------------------------------------------------------
static int check_own_keys(const neox_config *cfg, int adaptive, neox_error *err) {
    if (adaptive) return 0;
    if (neox_config_has(cfg, gradient_compression_interval))
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_interval: only gradient_compression: adaptive decides");
    if (neox_config_has(cfg, gradient_compression_replay))
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: only gradient_compression: adaptive decides");
    return 0;
}

int neox_train_setup_adaptive(neox_trainer *t, int adaptive, neox_error *err) {
    if (check_own_keys(t->cfg, adaptive, err) != 0) return -1;
    if (!adaptive) return 0;
    if (t->be->on_device)
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression: adaptive switches between host compressors; "
                         "these gradients are on the GPU (compute_backend: cuda)");
    neox_adaptive *a = t->adaptive = neox_calloc(1, sizeof *a);
    a->scheme = NEOX_SCHEME_DENSE, a->decided_at = -1, a->trial_end = -1;
    a->interval = neox_config_int_or(t->cfg, gradient_compression_interval, 20);
    const char *replay = neox_config_str(t->cfg, gradient_compression_replay);
    if (replay && read_replay(a, replay, err) != 0) return -1;
    if (t->grid->data_size <= 1) return 0;
    a->dense = t->reducer;
    if (t->wire != NEOX_BF16) a->bf16 = neox_train_make_reducer(t, NEOX_BF16);
    a->probe = neox_calloc(PROBE_LARGE_FLOATS, sizeof(float));
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (t->rank0 && dir) {
        char *path = neox_asprintf("%s/gradient_compression.jsonl", dir);
        int rc = neox_mkdirs(dir, err);
        if (rc == 0 && !(a->log = fopen(path, "a"))) rc = neox_fail(err, NEOX_EXIT_FAILURE, "cannot open %s for appending", path);
        free(path);
        if (rc != 0) return -1;
    }
    return 0;
}

void neox_train_free_adaptive(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    if (!a) return;
    if (a->bf16) {
        if (t->reducer == a->bf16) t->reducer = a->dense;
        neox_grad_reducer_free(a->bf16);
    }
    if (a->log) fclose(a->log);
    free(a->probe);
    free(a->replay_iter);
    free(a->replay_scheme);
    free(a);
    t->adaptive = NULL;
}

neox_scheme neox_train_adaptive_scheme(const neox_trainer *t) {
    return t->adaptive ? t->adaptive->scheme : NEOX_SCHEME_DENSE;
}

// ---- measuring -------------------------------------------------------------------------------
// The fastest of PROBE_REPEATS timed all-reduces: a probe measures the link, and the noise of a
// busy host only ever adds time.
static double timed_allreduce(neox_trainer *t, size_t floats) {
    neox_comm *c = &t->grid->data;
    double best = INFINITY;
    for (int k = 0; k < PROBE_REPEATS; k++) {
        neox_barrier(c);
        double start = neox_now();
        neox_allreduce_sum(c, t->adaptive->probe, floats, NEOX_F32);
        best = fmin(best, neox_now() - start);
    }
    return best;
}

static double ring_bytes(const neox_trainer *t, double bytes) {
    double p = t->grid->data_size;
    return 2.0 * (p - 1) / p * bytes;
}

// What each scheme sends and how, for the model.
static void scheme_costs(const neox_trainer *t, neox_scheme_cost *cost) {
    const neox_adaptive *a = t->adaptive;
    double n = (double)t->model->num_floats;
    int64_t bucket = neox_config_int_or(t->cfg, zero_reduce_bucket_size, 500000000);
    int buckets = (int)ceil(n / (double)(bucket > 0 ? bucket : 1));
    double width = t->wire == NEOX_F32 ? 4.0 : 2.0;
    cost[NEOX_SCHEME_DENSE] = (neox_scheme_cost){1, ring_bytes(t, n * width), buckets, t->overlap_comm, 0};
    cost[NEOX_SCHEME_BF16] = (neox_scheme_cost){a->bf16 != NULL, ring_bytes(t, n * 2.0), buckets, t->overlap_comm, 0};
    cost[NEOX_SCHEME_POWERSGD] = (neox_scheme_cost){1, neox_powersgd_wire_bytes(t->grad_powersgd), 2, 0, 0};
    cost[NEOX_SCHEME_ONEBIT] = (neox_scheme_cost){1, neox_onebit_wire_bytes(t->grad_onebit), 2, 0, 0};
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) cost[s].compute_s = a->cost_s[s];
}

// The group's measurements: the link probes, then this rank's step and costs; the maximum over
// the ranks of each, identical everywhere afterwards.
static void measure(neox_trainer *t, neox_adaptive_inputs *in) {
    neox_adaptive *a = t->adaptive;
    size_t large = t->model->num_floats < PROBE_LARGE_FLOATS ? t->model->num_floats : PROBE_LARGE_FLOATS;
    if (large < 2 * PROBE_SMALL_FLOATS) large = 2 * PROBE_SMALL_FLOATS;
    // The scheme in use, as real steps exposed it: the least over the ranks (the last rank to reach
    // the reduction waits only for it), as a maximum of negated values.
    double negated_exposed = a->exposed_steps ? -a->exposed_sum / (double)a->exposed_steps : -INFINITY;
    double v[5 + NEOX_SCHEME_COUNT] = {timed_allreduce(t, PROBE_SMALL_FLOATS), timed_allreduce(t, large), a->backward_s,
                                       a->step_s, negated_exposed};
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) v[5 + s] = a->cost_s[s];
    neox_allreduce_max(&t->grid->data, v, sizeof v / sizeof *v, NEOX_F64);
    memset(in, 0, sizeof *in);
    neox_adaptive_fit_link(ring_bytes(t, PROBE_SMALL_FLOATS * 4.0), v[0], ring_bytes(t, (double)large * 4.0), v[1],
                           &in->latency_s, &in->bytes_per_s);
    in->backward_s = v[2], in->step_s = v[3], in->margin = MARGIN;
    in->current = a->scheme, in->current_exposed_s = isfinite(v[4]) ? -v[4] : -1.0;
    scheme_costs(t, in->cost);
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) in->cost[s].compute_s = v[5 + s];
    a->latency_s = in->latency_s, a->bytes_per_s = in->bytes_per_s;
}

static void log_decision(neox_trainer *t, neox_scheme from, const neox_adaptive_inputs *in, const double *predicted) {
    neox_adaptive *a = t->adaptive;
    if (!a->log) return;
    json_t *d = json_pack("{s:I, s:s, s:s}", "iteration", (json_int_t)t->state.iteration, "scheme",
                          neox_scheme_name(a->scheme), "previous", neox_scheme_name(from));
    if (in) {
        json_t *pred = json_object(), *cost = json_object();
        for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
            if (!in->cost[s].available) continue;
            json_object_set_new(pred, neox_scheme_name(s), json_real(predicted[s]));
            json_object_set_new(cost, neox_scheme_name(s), json_real(in->cost[s].compute_s));
        }
        json_object_set_new(d, "latency_s", json_real(in->latency_s));
        json_object_set_new(d, "bytes_per_s", json_real(in->bytes_per_s));
        json_object_set_new(d, "backward_s", json_real(in->backward_s));
        json_object_set_new(d, "step_s", json_real(in->step_s));
        if (in->current_exposed_s >= 0) json_object_set_new(d, "measured_exposed_s", json_real(in->current_exposed_s));
        json_object_set_new(d, "predicted_exposed_s", pred);
        json_object_set_new(d, "measured_cost_s", cost);
    } else {
        json_object_set_new(d, "replayed", json_true());
    }
    char *text = json_dumps(d, JSON_COMPACT | JSON_REAL_PRECISION(6));
    fprintf(a->log, "%s\n", text);
    fflush(a->log);
    free(text);
    json_decref(d);
}

// ---- switching -------------------------------------------------------------------------------
static void use_scheme(neox_trainer *t, neox_scheme next) {
    neox_adaptive *a = t->adaptive;
    float *grads = t->model->grad_buf;
    if (a->scheme == NEOX_SCHEME_POWERSGD && next != a->scheme) neox_powersgd_flush(t->grad_powersgd, grads);
    if (a->scheme == NEOX_SCHEME_ONEBIT && next != a->scheme) neox_onebit_flush(t->grad_onebit, grads);
    a->scheme = next;
    t->reducer = next == NEOX_SCHEME_BF16 ? a->bf16 : a->dense;
}

static void decide(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    neox_scheme from = a->scheme;
    int forced = a->nreplay ? replayed(a, t->state.iteration) : -2;
    if (forced == -1) return;  // replaying: only the file's iterations decide
    a->decided_at = t->state.iteration;
    if (forced >= 0) {
        if (forced == NEOX_SCHEME_BF16 && !a->bf16) forced = NEOX_SCHEME_DENSE;
        use_scheme(t, (neox_scheme)forced);
        log_decision(t, from, NULL, NULL);
        return;
    }
    neox_adaptive_inputs in;
    double predicted[NEOX_SCHEME_COUNT];
    measure(t, &in);
    a->exposed_sum = 0, a->exposed_steps = 0;
    use_scheme(t, neox_adaptive_choose(&in, predicted));
    // A scheme chosen on its prediction alone runs a few steps, then is judged on what they measured.
    a->trial_end = !a->tried[a->scheme] && TRIAL_STEPS < a->interval ? t->state.iteration + TRIAL_STEPS : -1;
    log_decision(t, from, &in, predicted);
    if (t->rank0 && !t->opts.quiet && a->scheme != from)
        neox_info("iteration %lld: gradient compression %s -> %s (link %.3g Gbit/s, latency %.3g ms)",
                  (long long)t->state.iteration, neox_scheme_name(from), neox_scheme_name(a->scheme),
                  in.bytes_per_s * 8e-9, in.latency_s * 1e3);
}

// ---- per step --------------------------------------------------------------------------------
void neox_train_adaptive_begin_step(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    if (!a || t->grid->data_size <= 1) return;
    if (t->state.optimizer_steps >= t->compress_start &&
        (a->decided_at < 0 || a->nreplay || t->state.iteration - a->decided_at >= a->interval ||
         (a->trial_end >= 0 && t->state.iteration >= a->trial_end)))
        decide(t);
    a->at_start[0] = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD));
    a->at_start[1] = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE));
    a->at_start[2] = neox_now();
}

// After the step: this rank's backward and compute time, and the scheme's cost beyond what the
// link model predicts for it (its own work, or a link slower than measured).
void neox_train_adaptive_end_step(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    if (!a || t->grid->data_size <= 1) return;
    double backward = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD)) - a->at_start[0];
    double exposed = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE)) - a->at_start[1];
    double wall = neox_now() - a->at_start[2];
    a->backward_s = backward, a->step_s = fmax(0.0, wall - exposed);
    a->exposed_sum += exposed, a->exposed_steps++;
    a->tried[a->scheme] = 1;
    if (a->bytes_per_s > 0) {
        neox_adaptive_inputs in = {.latency_s = a->latency_s, .bytes_per_s = a->bytes_per_s, .backward_s = backward};
        scheme_costs(t, in.cost);
        in.cost[a->scheme].compute_s = 0;
        double extra = fmax(0.0, exposed - neox_adaptive_exposed(&in, &in.cost[a->scheme]));
        double *c = &a->cost_s[a->scheme];
        *c = *c > 0 ? COST_SMOOTHING * extra + (1 - COST_SMOOTHING) * *c : extra;
    }
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
        char tag[64];
        snprintf(tag, sizeof tag, "comm/adaptive/%s", neox_scheme_name(s));
        neox_metrics_add(t->metrics, tag, a->scheme == (neox_scheme)s);
    }
    neox_metrics_add(t->metrics, "comm/adaptive/link_gbit_per_s", a->bytes_per_s * 8e-9);
}

// ---- checkpoints -----------------------------------------------------------------------------
json_t *neox_train_adaptive_state(const neox_trainer *t) {
    const neox_adaptive *a = t->adaptive;
    if (!a) return NULL;
    json_t *tried = json_array();
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++)
        if (a->tried[s]) json_array_append_new(tried, json_string(neox_scheme_name(s)));
    return json_pack("{s:s, s:I, s:I, s:o}", "scheme", neox_scheme_name(a->scheme), "decided_at",
                     (json_int_t)a->decided_at, "trial_end", (json_int_t)a->trial_end, "tried", tried);
}

int neox_train_adaptive_restore(neox_trainer *t, json_t *state, const char *dir, neox_error *err) {
    neox_adaptive *a = t->adaptive;
    if (!a || !state) return 0;  // a checkpoint from another mode: decide afresh
    json_t *sc = json_object_get(state, "scheme"), *at = json_object_get(state, "decided_at");
    int scheme = json_is_string(sc) ? neox_scheme_from_name(json_string_value(sc)) : -1;
    if (scheme < 0 || !json_is_integer(at) || json_integer_value(at) < -1)
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s/state/train.json: gradient_compression: expected {\"scheme\": "
                         "\"dense|bf16|powersgd|onebit\", \"decided_at\": N >= -1}", dir);
    if (scheme == NEOX_SCHEME_BF16 && !a->bf16) scheme = NEOX_SCHEME_DENSE;
    a->decided_at = json_integer_value(at);
    // (trial_end and tried are absent from checkpoints written before trials: no trial, none tried.)
    json_t *trial = json_object_get(state, "trial_end"), *tried = json_object_get(state, "tried");
    a->trial_end = json_is_integer(trial) ? json_integer_value(trial) : -1;
    size_t i;
    json_t *name;
    json_array_foreach(tried, i, name) {
        int s = json_is_string(name) ? neox_scheme_from_name(json_string_value(name)) : -1;
        if (s < 0)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s/state/train.json: gradient_compression.tried: expected scheme "
                             "names", dir);
        a->tried[s] = 1;
    }
    // The compressors' errors were restored with the optimizer: switch without flushing them.
    a->scheme = (neox_scheme)scheme;
    if (t->grid->data_size > 1) t->reducer = scheme == NEOX_SCHEME_BF16 ? a->bf16 : a->dense;
    return 0;
}
