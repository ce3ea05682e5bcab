// adaptive_compression.c: gradient_compression: adaptive in the trainer. Every
// gradient_compression_interval steps (from gradient_compression_start on) the data group measures
// its link (two timed all-reduces after a barrier), shares what each rank measured (the slowest
// rank's numbers win: a maximum over the group, so every rank decides on the same numbers), and
// lib/gradient/adaptive.c plans how the next steps reduce each gradient bucket: the configured
// all-reduce, bf16 on the wire (both in the reducer, overlapped with backward), PowerSGD at one of
// the candidate ranks, or 1-bit (both after backward, on the bucket's own parameters). A bucket
// that leaves a compressor hands its error back to the next gradients, so what it owed is not
// lost. Each decision and its inputs go to log_dir/gradient_compression.jsonl;
// gradient_compression_replay replays such a file instead of measuring (the same run again, bit
// for bit). The plan in use and the step of the last decision are checkpointed.
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define PROBE_SMALL_FLOATS 256
#define PROBE_LARGE_FLOATS (256 * 1024)
#define PROBE_REPEATS 3
#define COST_SMOOTHING 0.5   // weight of the newest measurement of a compressor's own cost
#define MARGIN 0.02          // a less faithful plan must save 2% of the step time
#define TRIAL_STEPS 3        // a scheme never run is decided on again after this many steps
#define MAX_RANKS (NEOX_BUCKET_OPTIONS - 3)  // besides dense, bf16 and 1-bit
#define REMEMBERED 4         // plans whose measured exposure the policy keeps in reach...
#define REMEMBER_INTERVALS 4 // ...for this many intervals after they last ran,
#define REMEMBER_LINK 2.0     // ...and while the link's bandwidth stays within this factor of theirs

typedef struct bucket_state {
    int first, count;            // its parameters, as the compressors' segments
    double elements;
    double slack_s;              // this rank's last measured backward time after it was ready
    neox_bucket_choice use;      // what steps use now (rank: its PowerSGD Q's, kept while others run)
    int64_t steps[NEOX_BUCKET_OPTIONS];  // steps reduced with each option (the comms summary)
} bucket_state;

// A plan that ran, with the exposed seconds per step measured with it (shared by the group).
typedef struct remembered_plan {
    neox_bucket_choice *use;  // per bucket
    double exposed_s;
    int64_t at;               // the decision that measured it
    double bytes_per_s;       // the link's bandwidth then
} remembered_plan;

struct neox_adaptive {
    int nbuckets;
    bucket_state *bucket;
    int ranks[MAX_RANKS], nranks;     // PowerSGD's candidate ranks, largest first
    int64_t decided_at;               // iteration of the last decision; -1: none yet
    int64_t interval;
    int64_t trial_end;                // a scheme on trial is decided on again here; -1: no trial
    int tried[NEOX_SCHEME_COUNT];     // the scheme has run steps (its cost has been measured)
    double latency_s, bytes_per_s;    // the link at the last decision (0: not measured)
    // This rank's measured own cost of the compressors beyond the link model: 1-bit's seconds per
    // element, PowerSGD's per multiply-add (rank x elements of its compressed matrices).
    double unit_cost[NEOX_SCHEME_COUNT];
    double backward_s, step_s;        // this rank's last step
    double exposed_sum;               // exposed seconds of the steps since the last decision
    int64_t exposed_steps;
    remembered_plan remembered[REMEMBERED];
    int nremembered;
    double at_start[4];               // timers, clock and the reducer's progress when the step began
    float *probe;
    FILE *log;                        // rank 0, with log_dir
    // gradient_compression_replay: the decisions to repeat (a plan of nreplay_buckets per line;
    // a whole-gradient line has one entry for every bucket).
    int64_t *replay_iter;
    neox_bucket_choice **replay_plan;
    int *replay_whole, nreplay, nreplay_buckets;
    const char *replay_path;
    // NEOX_ADAPTIVE_MEASUREMENTS: what each decision measures, from a file instead of the clock.
    json_t *fixed;
    const char *fixed_path;
};

// ---- choices as text: "dense", "bf16", "onebit", "powersgd:4" ------------------------------
static int same_choice(neox_bucket_choice a, neox_bucket_choice b) {
    return a.scheme == b.scheme && (a.scheme != NEOX_SCHEME_POWERSGD || a.rank == b.rank);
}

static void choice_text(neox_bucket_choice c, char *buf, size_t size) {
    if (c.scheme == NEOX_SCHEME_POWERSGD) snprintf(buf, size, "powersgd:%d", c.rank);
    else snprintf(buf, size, "%s", neox_scheme_name(c.scheme));
}

// "powersgd" alone means the largest rank; returns -1 for anything else unknown.
static int parse_choice(const char *text, int max_rank, neox_bucket_choice *c) {
    const char *colon = strchr(text, ':');
    char name[32];
    size_t len = colon ? (size_t)(colon - text) : strlen(text);
    if (len >= sizeof name) return -1;
    memcpy(name, text, len), name[len] = 0;
    int s = neox_scheme_from_name(name);
    if (s < 0 || (colon && s != NEOX_SCHEME_POWERSGD)) return -1;
    c->scheme = (neox_scheme)s, c->rank = max_rank;
    if (colon) {
        char *end;
        long r = strtol(colon + 1, &end, 10);
        if (*end || r < 1 || r > max_rank) return -1;
        c->rank = (int)r;
    }
    return 0;
}

// ---- replay files ----------------------------------------------------------------------------
static int replay_fail(neox_error *err, const char *path, int lineno, const char *what) {
    return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: %s line %d: %s", path, lineno, what);
}

// One line: {"iteration": N, "buckets": [choices]} or the whole-gradient {"iteration": N, "scheme": S}.
static int read_replay_line(neox_adaptive *a, json_t *d, int max_rank, const char *path, int lineno, neox_error *err) {
    static const char expected[] = "expected a decision {\"iteration\": N >= 0, \"buckets\": [\"dense|bf16|powersgd[:R]|"
                                   "onebit\", ...]} or {\"iteration\": N >= 0, \"scheme\": \"dense|bf16|powersgd|onebit\"}";
    json_t *it = d ? json_object_get(d, "iteration") : NULL, *plan = d ? json_object_get(d, "buckets") : NULL;
    json_t *sc = d ? json_object_get(d, "scheme") : NULL;
    if (!json_is_integer(it) || json_integer_value(it) < 0 || (!json_is_array(plan) && !json_is_string(sc)))
        return replay_fail(err, path, lineno, expected);
    if (a->nreplay && json_integer_value(it) <= a->replay_iter[a->nreplay - 1])
        return replay_fail(err, path, lineno, "its iteration does not follow the line before");
    int n = plan ? (int)json_array_size(plan) : 1;
    if (plan && a->nreplay_buckets && n != a->nreplay_buckets)
        return replay_fail(err, path, lineno, "a different number of buckets than the lines before");
    if (plan) a->nreplay_buckets = n;
    size_t at = (size_t)a->nreplay;
    a->replay_iter = neox_realloc(a->replay_iter, (at + 1) * sizeof *a->replay_iter);
    a->replay_whole = neox_realloc(a->replay_whole, (at + 1) * sizeof *a->replay_whole);
    a->replay_plan = neox_realloc(a->replay_plan, (at + 1) * sizeof *a->replay_plan);
    // (A whole-gradient line is one choice that every bucket takes.)
    a->replay_iter[at] = json_integer_value(it), a->replay_whole[at] = plan == NULL;
    a->replay_plan[at] = neox_calloc((size_t)n, sizeof **a->replay_plan);
    a->nreplay++;
    for (int i = 0; i < n; i++) {
        json_t *c = plan ? json_array_get(plan, (size_t)i) : sc;
        if (!json_is_string(c) || parse_choice(json_string_value(c), max_rank, &a->replay_plan[at][i]) != 0)
            return replay_fail(err, path, lineno, expected);
    }
    return 0;
}

static int read_replay(neox_adaptive *a, const char *path, int max_rank, neox_error *err) {
    FILE *f = fopen(path, "r");
    if (!f) return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: cannot open %s", path);
    char *line = NULL;  // (a decision with its inputs is a line of about 200 bytes per bucket)
    size_t cap = 0;
    int rc = 0;
    for (int lineno = 1; rc == 0 && getline(&line, &cap, f) >= 0; lineno++) {
        json_error_t je;
        json_t *d = json_loads(line, 0, &je);
        rc = read_replay_line(a, d, max_rank, path, lineno, err);
        json_decref(d);
    }
    free(line);
    fclose(f);
    a->replay_path = path;
    return rc;
}

// The replayed plan at this iteration (bucket i's choice: plan[i * stride], stride 0 for a
// whole-gradient line), or NULL when the file has none there.
static const neox_bucket_choice *replayed(const neox_adaptive *a, int64_t iteration, int *stride) {
    for (int i = 0; i < a->nreplay; i++)
        if (a->replay_iter[i] == iteration) {
            *stride = a->replay_whole[i] ? 0 : 1;
            return a->replay_plan[i];
        }
    return NULL;
}

// ---- measurements from a file (NEOX_ADAPTIVE_MEASUREMENTS) ----------------------------------
// Tests and reproductions of a decision: one JSON line per decision iteration, {"iteration": N,
// "probe_s": [small, large], "backward_s": s, "step_s": s, "exposed_s": s, "slack_s": [per bucket],
// "onebit_s_per_element": s, "powersgd_s_per_madd": s}, taken in place of what the group measured
// (the probes still run, so the communication is the same).
static int read_fixed(neox_adaptive *a, const char *path, neox_error *err) {
    json_error_t je;
    FILE *f = fopen(path, "r");
    if (!f) return neox_fail(err, NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: cannot open %s", path);
    a->fixed = json_array();
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int lineno = 1; rc == 0 && getline(&line, &cap, f) >= 0; lineno++) {
        json_t *d = json_loads(line, 0, &je);
        if (!json_is_object(d) || !json_is_integer(json_object_get(d, "iteration")))
            rc = neox_fail(err, NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: %s line %d: expected {\"iteration\": N, "
                           "\"probe_s\": [s, s], ...}", path, lineno);
        if (d) json_array_append_new(a->fixed, d);
    }
    free(line);
    fclose(f);
    a->fixed_path = path;
    return rc;
}

static double fixed_number(const neox_adaptive *a, json_t *d, const char *key, int index, int64_t iteration) {
    json_t *v = json_object_get(d, key);
    if (index >= 0) v = json_array_get(v, (size_t)index);
    if (!json_is_number(v))
        neox_die(NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: %s: iteration %lld: expected a number for %s%s",
                 a->fixed_path, (long long)iteration, key, index >= 0 ? " (one per element)" : "");
    return json_number_value(v);
}

// The file's measurements at this iteration over v (measure's layout: the probes, backward, step,
// the negated exposure, the schemes' unit costs, each bucket's slack).
static void apply_fixed(const neox_trainer *t, double *v) {
    const neox_adaptive *a = t->adaptive;
    int64_t it = t->state.iteration;
    json_t *d = NULL, *x;
    size_t k;
    json_array_foreach(a->fixed, k, x) if (json_integer_value(json_object_get(x, "iteration")) == it) d = x;
    if (!d)
        neox_die(NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: %s has no line for iteration %lld, where this run "
                 "decides", a->fixed_path, (long long)it);
    v[0] = fixed_number(a, d, "probe_s", 0, it), v[1] = fixed_number(a, d, "probe_s", 1, it);
    v[2] = fixed_number(a, d, "backward_s", -1, it), v[3] = fixed_number(a, d, "step_s", -1, it);
    if (a->exposed_steps) v[4] = -fixed_number(a, d, "exposed_s", -1, it);
    v[5 + NEOX_SCHEME_ONEBIT] = fixed_number(a, d, "onebit_s_per_element", -1, it);
    v[5 + NEOX_SCHEME_POWERSGD] = fixed_number(a, d, "powersgd_s_per_madd", -1, it);
    for (int i = 0; i < a->nbuckets; i++) v[5 + NEOX_SCHEME_COUNT + i] = fixed_number(a, d, "slack_s", i, it);
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

// PowerSGD's candidates: gradient_compression_rank, then every power of two below it, largest first
// (MAX_RANKS at most); returns how many.
static int candidate_ranks(int max_rank, int *ranks) {
    int n = 0, p = 1;
    ranks[n++] = max_rank;
    while (p * 2 < max_rank) p *= 2;
    for (; p >= 1 && n < MAX_RANKS; p /= 2)
        if (p < max_rank) ranks[n++] = p;
    return n;
}

int neox_train_adaptive_min_rank(int max_rank) {
    int ranks[MAX_RANKS];
    return ranks[candidate_ranks(max_rank, ranks) - 1];
}

// Bucket i of the reducer as a range of the model's parameters (the compressors' segments).
static void map_buckets(neox_trainer *t, neox_adaptive *a) {
    const neox_model *m = t->model;
    size_t base = m->params[t->reducer_first].offset;
    a->nbuckets = neox_grad_reducer_bucket_count(t->reducer);
    a->bucket = neox_calloc((size_t)a->nbuckets, sizeof *a->bucket);
    for (int i = 0; i < a->nbuckets; i++) {
        bucket_state *b = &a->bucket[i];
        size_t begin, end;
        neox_grad_reducer_bucket_range(t->reducer, i, &begin, &end, NULL);
        b->first = -1;
        for (int p = t->reducer_first; p < m->nparams; p++)
            if (m->params[p].offset >= base + begin && m->params[p].offset < base + end) {
                if (b->first < 0) b->first = p;
                b->count = p - b->first + 1;
            }
        b->elements = (double)(end - begin);
        b->use = (neox_bucket_choice){NEOX_SCHEME_DENSE, a->ranks[0]};
    }
}

static int check_replay_buckets(const neox_adaptive *a, neox_error *err) {
    if (!a->nreplay_buckets || a->nreplay_buckets == a->nbuckets) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: %s plans %d buckets; this run's gradients "
                     "are in %d (reduce_bucket_size and the model decide)", a->replay_path, a->nreplay_buckets, a->nbuckets);
}

int neox_train_setup_adaptive(neox_trainer *t, int adaptive, neox_error *err) {
    if (check_own_keys(t->cfg, adaptive, err) != 0) return -1;
    if (!adaptive) return 0;
    if (t->be->on_device)
        return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression: adaptive switches between host compressors; "
                         "these gradients are on the GPU (compute_backend: cuda)");
    neox_adaptive *a = t->adaptive = neox_calloc(1, sizeof *a);
    a->decided_at = -1, a->trial_end = -1;
    a->interval = neox_config_int_or(t->cfg, gradient_compression_interval, 20);
    int max_rank = (int)neox_config_int(t->cfg, gradient_compression_rank);
    a->nranks = candidate_ranks(max_rank, a->ranks);
    const char *replay = neox_config_str(t->cfg, gradient_compression_replay);
    if (replay && read_replay(a, replay, max_rank, err) != 0) return -1;
    const char *fixed = getenv("NEOX_ADAPTIVE_MEASUREMENTS");
    if (fixed && *fixed && read_fixed(a, fixed, err) != 0) return -1;
    if (t->grid->data_size <= 1) return 0;
    map_buckets(t, a);
    if (check_replay_buckets(a, err) != 0) return -1;
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
    if (a->log) fclose(a->log);
    for (int m = 0; m < REMEMBERED; m++) free(a->remembered[m].use);
    free(a->bucket);
    free(a->probe);
    free(a->replay_iter);
    for (int i = 0; i < a->nreplay; i++) free(a->replay_plan[i]);
    free(a->replay_plan);
    free(a->replay_whole);
    json_decref(a->fixed);
    free(a);
    t->adaptive = NULL;
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

// Bucket b's options in order of fidelity: the configured all-reduce, bf16 (unless that is the
// configured wire), PowerSGD at each candidate rank from the largest, 1-bit.
static void bucket_options(const neox_trainer *t, const bucket_state *b, neox_bucket_inputs *in) {
    const neox_adaptive *a = t->adaptive;
    double width = t->wire == NEOX_F32 ? 4.0 : 2.0;
    int n = 0;
    in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_DENSE, b->use.rank}, ring_bytes(t, b->elements * width), 1,
                                           t->overlap_comm, 0};
    if (t->wire != NEOX_BF16)
        in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_BF16, b->use.rank}, ring_bytes(t, b->elements * 2.0), 1,
                                               t->overlap_comm, 0};
    for (int k = 0; k < a->nranks; k++) {
        int r = a->ranks[k];
        in->option[n++] = (neox_bucket_option){
            {NEOX_SCHEME_POWERSGD, r}, neox_powersgd_wire_bytes_at(t->grad_powersgd, b->first, b->count, r), 2, 0,
            a->unit_cost[NEOX_SCHEME_POWERSGD] * neox_powersgd_work_at(t->grad_powersgd, b->first, b->count, r)};
    }
    in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_ONEBIT, b->use.rank},
                                           neox_onebit_wire_bytes_range(t->grad_onebit, b->first, b->count), 2, 0,
                                           a->unit_cost[NEOX_SCHEME_ONEBIT] * b->elements};
    in->noptions = n;
}

static int option_of(const neox_bucket_inputs *in, neox_bucket_choice c) {
    for (int k = 0; k < in->noptions; k++)
        if (same_choice(in->option[k].choice, c)) return k;
    return 0;
}

// The group's measurements: the link probes, then this rank's step, costs and buckets' slack; the
// maximum over the ranks of each, identical everywhere afterwards.
// Keeps the plan in use with its measured exposure (replacing its older measurement, or the
// oldest plan), and forgets plans not run for REMEMBER_INTERVALS intervals or measured on a link
// more than REMEMBER_LINK times faster or slower than the one just probed: the link moves on, and
// an uncompressed plan measured on a fast link must not stand for itself on a slow one.
static int still_valid(const neox_adaptive *a, const remembered_plan *r, int64_t iteration) {
    if (iteration - r->at > REMEMBER_INTERVALS * a->interval) return 0;
    if (a->bytes_per_s <= 0 || r->bytes_per_s <= 0) return 1;  // (no link model to compare)
    double ratio = r->bytes_per_s / a->bytes_per_s;
    return ratio <= REMEMBER_LINK && ratio >= 1.0 / REMEMBER_LINK;
}

static void forget_stale(neox_adaptive *a, int64_t iteration) {
    for (int m = 0; m < a->nremembered;) {
        if (still_valid(a, &a->remembered[m], iteration)) {
            m++;
            continue;
        }
        free(a->remembered[m].use);
        a->remembered[m] = a->remembered[--a->nremembered];
        a->remembered[a->nremembered].use = NULL;
    }
}

static void remember(neox_trainer *t, double exposed_s) {
    neox_adaptive *a = t->adaptive;
    int slot = -1;
    for (int m = 0; m < a->nremembered && slot < 0; m++) {
        int same = 1;
        for (int i = 0; i < a->nbuckets; i++) same &= same_choice(a->remembered[m].use[i], a->bucket[i].use);
        if (same) slot = m;
    }
    if (slot < 0 && a->nremembered < REMEMBERED) slot = a->nremembered++;
    if (slot < 0) {  // the oldest makes room
        slot = 0;
        for (int m = 1; m < a->nremembered; m++)
            if (a->remembered[m].at < a->remembered[slot].at) slot = m;
    }
    remembered_plan *r = &a->remembered[slot];
    if (!r->use) r->use = neox_calloc((size_t)a->nbuckets, sizeof *r->use);
    for (int i = 0; i < a->nbuckets; i++) r->use[i] = a->bucket[i].use;
    r->exposed_s = exposed_s, r->at = t->state.iteration, r->bytes_per_s = a->bytes_per_s;
}

static void measure(neox_trainer *t, neox_adaptive_inputs *in, neox_bucket_inputs *bucket, int *measured_idx,
                    const int **measured_plan, double *measured_s) {
    neox_adaptive *a = t->adaptive;
    size_t large = t->model->num_floats < PROBE_LARGE_FLOATS ? t->model->num_floats : PROBE_LARGE_FLOATS;
    if (large < 2 * PROBE_SMALL_FLOATS) large = 2 * PROBE_SMALL_FLOATS;
    // The plan in use, as real steps exposed it: the least over the ranks (the last rank to reach
    // the reduction waits only for it), as a maximum of negated values.
    double negated_exposed = a->exposed_steps ? -a->exposed_sum / (double)a->exposed_steps : -INFINITY;
    enum { FIXED = 5 + NEOX_SCHEME_COUNT };
    size_t nv = FIXED + (size_t)a->nbuckets;
    double *v = neox_calloc(nv, sizeof *v);
    v[0] = timed_allreduce(t, PROBE_SMALL_FLOATS), v[1] = timed_allreduce(t, large), v[2] = a->backward_s;
    v[3] = a->step_s, v[4] = negated_exposed;
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) v[5 + s] = a->unit_cost[s];
    for (int i = 0; i < a->nbuckets; i++) v[FIXED + i] = a->bucket[i].slack_s;
    neox_allreduce_max(&t->grid->data, v, nv, NEOX_F64);
    if (a->fixed) apply_fixed(t, v);
    memset(in, 0, sizeof *in);
    neox_adaptive_fit_link(ring_bytes(t, PROBE_SMALL_FLOATS * 4.0), v[0], ring_bytes(t, (double)large * 4.0), v[1],
                           &in->latency_s, &in->bytes_per_s);
    a->latency_s = in->latency_s, a->bytes_per_s = in->bytes_per_s, a->backward_s = v[2];
    in->step_s = v[3], in->margin = MARGIN;
    forget_stale(a, t->state.iteration);
    if (isfinite(v[4])) remember(t, -v[4]);
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) a->unit_cost[s] = v[5 + s];  // every rank plans with the same costs
    double total = 0;
    for (int i = 0; i < a->nbuckets; i++) total += a->bucket[i].elements;
    for (int i = 0; i < a->nbuckets; i++) {
        // Slack is measured from the ready call to the reduction; backward_s bounds it.
        bucket[i].hide_s = t->overlap_comm ? fmin(v[FIXED + i], v[2]) : 0.0;
        bucket[i].share = a->bucket[i].elements / total;
        bucket_options(t, &a->bucket[i], &bucket[i]);
    }
    int order[REMEMBERED];  // most recent first (the policy calibrates on the newest it can)
    for (int m = 0; m < a->nremembered; m++) {
        int at = m;
        for (; at > 0 && a->remembered[order[at - 1]].at < a->remembered[m].at; at--) order[at] = order[at - 1];
        order[at] = m;
    }
    for (int k = 0; k < a->nremembered; k++) {
        const remembered_plan *r = &a->remembered[order[k]];
        int *idx = measured_idx + (size_t)k * (size_t)a->nbuckets;
        for (int i = 0; i < a->nbuckets; i++) idx[i] = option_of(&bucket[i], r->use[i]);
        measured_plan[k] = idx, measured_s[k] = r->exposed_s;
    }
    in->nbuckets = a->nbuckets, in->bucket = bucket;
    in->nmeasured = a->nremembered, in->measured_plan = measured_plan, in->measured_s = measured_s;
    in->overlap_scale = neox_adaptive_calibration(in);  // (what the plan uses, for the log)
    in->overlap_efficiency = neox_adaptive_overlap_efficiency(in);
    free(v);
}

// A plan's summary name: the scheme every bucket uses, or "mixed".
static const char *plan_summary(const neox_adaptive *a) {
    for (int i = 1; i < a->nbuckets; i++)
        if (a->bucket[i].use.scheme != a->bucket[0].use.scheme) return "mixed";
    return a->nbuckets ? neox_scheme_name(a->bucket[0].use.scheme) : "dense";
}

static json_t *plan_json(const neox_adaptive *a) {
    json_t *plan = json_array();
    for (int i = 0; i < a->nbuckets; i++) {
        char text[32];
        choice_text(a->bucket[i].use, text, sizeof text);
        json_array_append_new(plan, json_string(text));
    }
    return plan;
}

// Per bucket: its size, its slack, and the plan's predicted exposed seconds were it to take each option.
static json_t *bucket_inputs_json(const neox_adaptive_inputs *in, const int *plan) {
    json_t *list = json_array();
    int *alt = neox_malloc((size_t)in->nbuckets * sizeof *alt);
    for (int i = 0; i < in->nbuckets; i++) {
        const neox_bucket_inputs *b = &in->bucket[i];
        json_t *pred = json_object();
        memcpy(alt, plan, (size_t)in->nbuckets * sizeof *alt);
        for (int k = 0; k < b->noptions; k++) {
            char text[32];
            choice_text(b->option[k].choice, text, sizeof text);
            alt[i] = k;
            json_object_set_new(pred, text, json_real(neox_adaptive_plan_cost(in, alt, NULL)));
        }
        json_t *opts = json_object();  // each option as the policy saw it: [wire bytes, messages, own seconds]
        for (int k = 0; k < b->noptions; k++) {
            char text[32];
            choice_text(b->option[k].choice, text, sizeof text);
            json_object_set_new(opts, text, json_pack("[f, i, f]", b->option[k].wire_bytes, b->option[k].messages,
                                                      b->option[k].compute_s));
        }
        json_array_append_new(list, json_pack("{s:f, s:f, s:f, s:o, s:o}", "share", b->share, "hide_s", b->hide_s,
                                              "wire_bytes_dense", b->option[0].wire_bytes, "options", opts,
                                              "predicted_exposed_s", pred));
    }
    free(alt);
    return list;
}

// The plans the decision knew measured: each with its exposed seconds and when it was measured.
static json_t *measured_plans_json(const neox_adaptive *a) {
    json_t *list = json_array();
    for (int m = 0; m < a->nremembered; m++) {
        json_t *plan = json_array();
        for (int i = 0; i < a->nbuckets; i++) {
            char text[32];
            choice_text(a->remembered[m].use[i], text, sizeof text);
            json_array_append_new(plan, json_string(text));
        }
        json_array_append_new(list, json_pack("{s:o, s:f, s:I, s:f}", "buckets", plan, "exposed_s", a->remembered[m].exposed_s,
                                              "iteration", (json_int_t)a->remembered[m].at, "bytes_per_s",
                                              a->remembered[m].bytes_per_s));
    }
    return list;
}

static void log_decision(neox_trainer *t, const char *from, json_t *from_plan, const neox_adaptive_inputs *in,
                         const int *plan, double predicted) {
    neox_adaptive *a = t->adaptive;
    if (!a->log) {
        json_decref(from_plan);
        return;
    }
    json_t *d = json_pack("{s:I, s:s, s:s, s:o, s:o}", "iteration", (json_int_t)t->state.iteration, "scheme",
                          plan_summary(a), "previous", from, "buckets", plan_json(a), "previous_buckets", from_plan);
    if (in) {
        json_object_set_new(d, "latency_s", json_real(in->latency_s));
        json_object_set_new(d, "bytes_per_s", json_real(in->bytes_per_s));
        json_object_set_new(d, "backward_s", json_real(a->backward_s));
        json_object_set_new(d, "step_s", json_real(in->step_s));
        json_object_set_new(d, "measured_plans", measured_plans_json(a));
        json_object_set_new(d, "expected_exposed_s", json_real(predicted));
        json_object_set_new(d, "overlap_scale", json_real(in->overlap_scale));
        json_object_set_new(d, "overlap_efficiency", json_real(in->overlap_efficiency));
        json_object_set_new(d, "onebit_s_per_element", json_real(a->unit_cost[NEOX_SCHEME_ONEBIT]));
        json_object_set_new(d, "powersgd_s_per_madd", json_real(a->unit_cost[NEOX_SCHEME_POWERSGD]));
        json_object_set_new(d, "bucket_inputs", bucket_inputs_json(in, plan));
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
// Bucket i moves to choice c. What a compressor it leaves owes goes into these gradients (before
// backward adds to them, so the next reduction carries it); PowerSGD keeps its error across a rank
// change (set_rank hands back only what a matrix no longer compressed owes).
static void use_choice(neox_trainer *t, int i, neox_bucket_choice c, float *grads) {
    neox_adaptive *a = t->adaptive;
    bucket_state *b = &a->bucket[i];
    if (b->use.scheme == NEOX_SCHEME_POWERSGD && c.scheme != NEOX_SCHEME_POWERSGD)
        neox_powersgd_flush_range(t->grad_powersgd, grads, b->first, b->count);
    if (b->use.scheme == NEOX_SCHEME_ONEBIT && c.scheme != NEOX_SCHEME_ONEBIT)
        neox_onebit_flush_range(t->grad_onebit, grads, b->first, b->count);
    if (c.scheme != NEOX_SCHEME_POWERSGD) c.rank = b->use.rank;  // the Q keeps its rank
    else if (c.rank != b->use.rank) neox_powersgd_set_rank(t->grad_powersgd, b->first, b->count, c.rank, grads);
    b->use = c;
    int compressed = c.scheme == NEOX_SCHEME_POWERSGD || c.scheme == NEOX_SCHEME_ONEBIT;
    neox_grad_reducer_set_bucket(t->reducer, i, compressed, c.scheme == NEOX_SCHEME_BF16 ? NEOX_BF16 : t->wire);
}

static void note_change(neox_trainer *t, const char *from, const neox_adaptive_inputs *in) {
    neox_adaptive *a = t->adaptive;
    if (!t->rank0 || t->opts.quiet) return;
    json_t *plan = plan_json(a);
    char *text = json_dumps(plan, JSON_COMPACT);
    neox_info("iteration %lld: gradient compression %s -> %s %s (link %.3g Gbit/s, latency %.3g ms)",
              (long long)t->state.iteration, from, plan_summary(a), text, in->bytes_per_s * 8e-9, in->latency_s * 1e3);
    free(text);
    json_decref(plan);
}

// Every rank must reduce each bucket the same way, or the collectives pair up wrongly: the plan's
// fingerprint is compared over the data group after every decision (one small all-reduce).
static void check_ranks_agree(neox_trainer *t) {
    const neox_adaptive *a = t->adaptive;
    double fingerprint = 0;
    for (int i = 0; i < a->nbuckets; i++)
        fingerprint = fmod(fingerprint * 131.0 + a->bucket[i].use.scheme * 1024.0 + a->bucket[i].use.rank, 1e15);
    double v[2] = {fingerprint, -fingerprint};
    neox_allreduce_max(&t->grid->data, v, 2, NEOX_F64);
    if (v[0] != -v[1])
        neox_die(NEOX_EXIT_FAILURE, "gradient_compression: adaptive: the data-parallel ranks planned different schemes "
                 "at iteration %lld (their measurements were not shared)", (long long)t->state.iteration);
}

static void decide(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    char from[16];
    snprintf(from, sizeof from, "%s", plan_summary(a));
    json_t *from_plan = plan_json(a);
    int stride = 0;
    const neox_bucket_choice *forced = a->nreplay ? replayed(a, t->state.iteration, &stride) : NULL;
    if (a->nreplay && !forced) {  // replaying: only the file's iterations decide
        json_decref(from_plan);
        return;
    }
    a->decided_at = t->state.iteration;
    if (forced) {
        for (int i = 0; i < a->nbuckets; i++) {
            neox_bucket_choice c = forced[i * stride];
            if (c.scheme == NEOX_SCHEME_BF16 && t->wire == NEOX_BF16) c.scheme = NEOX_SCHEME_DENSE;
            use_choice(t, i, c, t->model->grad_buf);
        }
        check_ranks_agree(t);
        log_decision(t, from, from_plan, NULL, NULL, 0);
        return;
    }
    neox_adaptive_inputs in;
    neox_bucket_inputs *bucket = neox_calloc((size_t)a->nbuckets, sizeof *bucket);
    int *plan = neox_calloc((size_t)a->nbuckets, sizeof *plan);
    int *measured_idx = neox_calloc((size_t)REMEMBERED * (size_t)a->nbuckets, sizeof *measured_idx);
    const int *measured_plan[REMEMBERED];
    double measured_s[REMEMBERED];
    measure(t, &in, bucket, measured_idx, measured_plan, measured_s);
    a->exposed_sum = 0, a->exposed_steps = 0;
    double predicted = neox_adaptive_plan(&in, plan);
    int changed = 0, untried = 0;
    for (int i = 0; i < a->nbuckets; i++) {
        neox_bucket_choice c = bucket[i].option[plan[i]].choice;
        changed |= !same_choice(c, a->bucket[i].use);
        untried |= !a->tried[c.scheme];
        use_choice(t, i, c, t->model->grad_buf);
    }
    // A plan using a scheme never run runs a few steps, then is judged on what they measured.
    a->trial_end = untried && TRIAL_STEPS < a->interval ? t->state.iteration + TRIAL_STEPS : -1;
    check_ranks_agree(t);
    log_decision(t, from, from_plan, &in, plan, predicted);
    if (changed) note_change(t, from, &in);
    free(bucket), free(measured_idx), free(plan);
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
    a->at_start[3] = neox_grad_reducer_progress_seconds(t->reducer);
}

// After the reducer's finish: every bucket the plan compresses, on its own parameters, neighbours
// with the same choice in one call (bucket i + 1 holds the tensors just before bucket i's), timed;
// what a call took beyond the link model is the compressor's own cost, per unit of its work.
void neox_train_adaptive_compress(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    double extra[NEOX_SCHEME_COUNT] = {0}, units[NEOX_SCHEME_COUNT] = {0};
    for (int i = 0, j; i < a->nbuckets; i = j) {
        neox_bucket_choice c = a->bucket[i].use;
        double elements = a->bucket[i].elements;
        for (j = i + 1; j < a->nbuckets && same_choice(a->bucket[j].use, c); j++) elements += a->bucket[j].elements;
        if (c.scheme != NEOX_SCHEME_POWERSGD && c.scheme != NEOX_SCHEME_ONEBIT) continue;
        int first = a->bucket[j - 1].first, count = a->bucket[i].first + a->bucket[i].count - first;
        double start = neox_now(), wire;
        if (c.scheme == NEOX_SCHEME_POWERSGD) {
            neox_powersgd_allreduce_range(t->grad_powersgd, t->model->grad_buf, first, count);
            wire = neox_powersgd_wire_bytes_at(t->grad_powersgd, first, count, c.rank);
            units[c.scheme] += neox_powersgd_work_at(t->grad_powersgd, first, count, c.rank);
        } else {
            neox_onebit_allreduce_range(t->grad_onebit, t->model->grad_buf, first, count);
            wire = neox_onebit_wire_bytes_range(t->grad_onebit, first, count);
            units[c.scheme] += elements;
        }
        double link = a->bytes_per_s > 0 ? 2 * a->latency_s + wire / a->bytes_per_s : 0.0;
        extra[c.scheme] += fmax(0.0, neox_now() - start - link);
    }
    if (a->bytes_per_s <= 0) return;  // (replaying: no link model to measure against)
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
        if (units[s] <= 0) continue;
        double *cost = &a->unit_cost[s], now = extra[s] / units[s];
        *cost = *cost > 0 ? COST_SMOOTHING * now + (1 - COST_SMOOTHING) * *cost : now;
    }
}

// After the step: this rank's backward and compute time, the plan's exposed time, each bucket's
// slack, and the step's share of elements per scheme for metrics.jsonl and TensorBoard.
void neox_train_adaptive_end_step(neox_trainer *t) {
    neox_adaptive *a = t->adaptive;
    if (!a || t->grid->data_size <= 1) return;
    double backward = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD)) - a->at_start[0];
    // A plan's cost is the reduction backward waited for plus the calls backward made to start
    // and progress its overlapped buckets: on a fast link those calls, not the wait, are what an
    // overlapped all-reduce costs (bench/comm.sh at 10 Gbit/s: overlapped 388.6 ms per step
    // against 352.9 serial), and only measuring them lets a plan sending fewer bytes show it.
    double exposed = neox_timer_seconds(neox_metrics_timer(t->metrics, NEOX_TIMER_BACKWARD_ALLREDUCE)) - a->at_start[1]
                   + neox_grad_reducer_progress_seconds(t->reducer) - a->at_start[3];
    double wall = neox_now() - a->at_start[2];
    a->backward_s = backward, a->step_s = fmax(0.0, wall - exposed);
    a->exposed_sum += exposed, a->exposed_steps++;
    double share[NEOX_SCHEME_COUNT] = {0}, total = 0, compressed = 0;
    for (int i = 0; i < a->nbuckets; i++) {
        bucket_state *b = &a->bucket[i];
        neox_grad_reducer_bucket_range(t->reducer, i, &(size_t){0}, &(size_t){0}, &b->slack_s);
        a->tried[b->use.scheme] = 1;
        share[b->use.scheme] += b->elements, total += b->elements;
        compressed += b->use.scheme == NEOX_SCHEME_POWERSGD || b->use.scheme == NEOX_SCHEME_ONEBIT;
        neox_bucket_inputs in;
        bucket_options(t, b, &in);
        b->steps[option_of(&in, b->use)]++;
    }
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
        char tag[64];
        snprintf(tag, sizeof tag, "comm/adaptive/%s", neox_scheme_name(s));
        neox_metrics_add(t->metrics, tag, total > 0 ? share[s] / total : 0.0);
    }
    neox_metrics_add(t->metrics, "comm/adaptive/compressed_buckets", compressed);
    neox_metrics_add(t->metrics, "comm/adaptive/link_gbit_per_s", a->bytes_per_s * 8e-9);
}

// The comms summary's part: per bucket, the steps reduced with each option.
json_t *neox_train_adaptive_summary(const neox_trainer *t) {
    const neox_adaptive *a = t->adaptive;
    if (!a || !a->nbuckets) return NULL;
    json_t *list = json_array();
    for (int i = 0; i < a->nbuckets; i++) {
        neox_bucket_inputs in;
        bucket_options(t, &a->bucket[i], &in);
        json_t *steps = json_object();
        for (int k = 0; k < in.noptions; k++) {
            if (!a->bucket[i].steps[k]) continue;
            char text[32];
            choice_text(in.option[k].choice, text, sizeof text);
            json_object_set_new(steps, text, json_integer(a->bucket[i].steps[k]));
        }
        json_array_append_new(list, json_pack("{s:I, s:o}", "elements", (json_int_t)a->bucket[i].elements, "steps", steps));
    }
    return list;
}

// ---- checkpoints -----------------------------------------------------------------------------
// What the next decisions build on, so a resumed run decides as the straight one would: the plans
// measured and their exposure, the link and step as last measured, the compressors' unit costs,
// each bucket's slack and the exposure summed since the last decision. (Doubles are written with
// 17 digits: they read back exactly.)
static json_t *measurements_json(const neox_adaptive *a) {
    json_t *slack = json_array();
    for (int i = 0; i < a->nbuckets; i++) json_array_append_new(slack, json_real(a->bucket[i].slack_s));
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:o, s:o}", "latency_s", a->latency_s, "bytes_per_s",
                     a->bytes_per_s, "backward_s", a->backward_s, "step_s", a->step_s, "onebit_s_per_element",
                     a->unit_cost[NEOX_SCHEME_ONEBIT], "powersgd_s_per_madd", a->unit_cost[NEOX_SCHEME_POWERSGD],
                     "exposed_sum_s", a->exposed_sum, "exposed_steps", (json_int_t)a->exposed_steps, "slack_s", slack,
                     "plans", measured_plans_json(a));
}

json_t *neox_train_adaptive_state(const neox_trainer *t) {
    const neox_adaptive *a = t->adaptive;
    if (!a) return NULL;
    json_t *tried = json_array(), *ranks = json_array();
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++)
        if (a->tried[s]) json_array_append_new(tried, json_string(neox_scheme_name(s)));
    for (int i = 0; i < a->nbuckets; i++) json_array_append_new(ranks, json_integer(a->bucket[i].use.rank));
    return json_pack("{s:s, s:o, s:o, s:I, s:I, s:o, s:o}", "scheme", plan_summary(a), "buckets", plan_json(a),
                     "powersgd_ranks", ranks, "decided_at", (json_int_t)a->decided_at, "trial_end",
                     (json_int_t)a->trial_end, "tried", tried, "measurements", measurements_json(a));
}

static int restore_fail(neox_error *err, const char *dir, const char *what) {
    return neox_fail(err, NEOX_EXIT_FAILURE, "%s/state/train.json: gradient_compression: %s", dir, what);
}

// The plan of the checkpoint: "buckets" (and each bucket's Q rank), or a whole-gradient "scheme"
// from checkpoints written before plans were per bucket.
static int restore_plan(neox_trainer *t, json_t *state, const char *dir, neox_error *err) {
    neox_adaptive *a = t->adaptive;
    int max_rank = a->ranks[0];
    json_t *plan = json_object_get(state, "buckets"), *ranks = json_object_get(state, "powersgd_ranks");
    json_t *sc = json_object_get(state, "scheme");
    if (plan && (!json_is_array(plan) || (int)json_array_size(plan) != a->nbuckets))
        return restore_fail(err, dir, "\"buckets\" does not plan this run's buckets (reduce_bucket_size and the model "
                            "decide them)");
    for (int i = 0; i < a->nbuckets; i++) {
        json_t *c = plan ? json_array_get(plan, (size_t)i) : sc, *r = json_array_get(ranks, (size_t)i);
        neox_bucket_choice choice;
        if (!json_is_string(c) || parse_choice(json_string_value(c), max_rank, &choice) != 0)
            return restore_fail(err, dir, "expected {\"buckets\": [\"dense|bf16|powersgd:R|onebit\", ...]} or "
                                "{\"scheme\": \"dense|bf16|powersgd|onebit\"}");
        if (json_is_integer(r) && json_integer_value(r) >= 1 && json_integer_value(r) <= max_rank)
            choice.rank = (int)json_integer_value(r);
        if (choice.scheme == NEOX_SCHEME_BF16 && t->wire == NEOX_BF16) choice.scheme = NEOX_SCHEME_DENSE;
        // The compressors' state was restored with the optimizer: take the plan without moving it.
        bucket_state *b = &a->bucket[i];
        if (t->grad_powersgd) neox_powersgd_set_rank(t->grad_powersgd, b->first, b->count, choice.rank, NULL);
        b->use = choice;
        int compressed = choice.scheme == NEOX_SCHEME_POWERSGD || choice.scheme == NEOX_SCHEME_ONEBIT;
        neox_grad_reducer_set_bucket(t->reducer, i, compressed, choice.scheme == NEOX_SCHEME_BF16 ? NEOX_BF16 : t->wire);
    }
    return 0;
}

static int real_field(json_t *m, const char *key, double *out) {
    json_t *v = json_object_get(m, key);
    if (!json_is_number(v) || !isfinite(json_number_value(v)) || json_number_value(v) < 0) return -1;
    *out = json_number_value(v);
    return 0;
}

// One measured plan of the checkpoint into the next free slot.
static int restore_remembered(neox_adaptive *a, json_t *r) {
    json_t *plan = json_object_get(r, "buckets"), *at = json_object_get(r, "iteration");
    remembered_plan p = {0};
    if (!json_is_array(plan) || (int)json_array_size(plan) != a->nbuckets || !json_is_integer(at) ||
        real_field(r, "exposed_s", &p.exposed_s) != 0 || real_field(r, "bytes_per_s", &p.bytes_per_s) != 0 ||
        a->nremembered >= REMEMBERED)
        return -1;
    p.at = json_integer_value(at);
    p.use = neox_calloc((size_t)a->nbuckets, sizeof *p.use);
    for (int i = 0; i < a->nbuckets; i++) {
        json_t *c = json_array_get(plan, (size_t)i);
        if (!json_is_string(c) || parse_choice(json_string_value(c), a->ranks[0], &p.use[i]) != 0) {
            free(p.use);
            return -1;
        }
    }
    a->remembered[a->nremembered++] = p;
    return 0;
}

static int restore_measurements(neox_trainer *t, json_t *m, const char *dir, neox_error *err) {
    neox_adaptive *a = t->adaptive;
    json_t *steps = json_object_get(m, "exposed_steps"), *slack = json_object_get(m, "slack_s");
    json_t *plans = json_object_get(m, "plans");
    if (real_field(m, "latency_s", &a->latency_s) != 0 || real_field(m, "bytes_per_s", &a->bytes_per_s) != 0 ||
        real_field(m, "backward_s", &a->backward_s) != 0 || real_field(m, "step_s", &a->step_s) != 0 ||
        real_field(m, "onebit_s_per_element", &a->unit_cost[NEOX_SCHEME_ONEBIT]) != 0 ||
        real_field(m, "powersgd_s_per_madd", &a->unit_cost[NEOX_SCHEME_POWERSGD]) != 0 ||
        real_field(m, "exposed_sum_s", &a->exposed_sum) != 0 || !json_is_integer(steps) ||
        json_integer_value(steps) < 0 || !json_is_array(slack) || (int)json_array_size(slack) != a->nbuckets ||
        !json_is_array(plans))
        return restore_fail(err, dir, "measurements: expected {latency_s, bytes_per_s, backward_s, step_s, "
                            "onebit_s_per_element, powersgd_s_per_madd, exposed_sum_s: seconds >= 0, exposed_steps: "
                            "N >= 0, slack_s: [one per bucket], plans: [...]}");
    a->exposed_steps = json_integer_value(steps);
    for (int i = 0; i < a->nbuckets; i++) {
        json_t *v = json_array_get(slack, (size_t)i);
        if (!json_is_number(v)) return restore_fail(err, dir, "measurements: slack_s: expected seconds per bucket");
        a->bucket[i].slack_s = json_number_value(v);
    }
    size_t k;
    json_t *r;
    json_array_foreach(plans, k, r) {
        if (restore_remembered(a, r) != 0)
            return restore_fail(err, dir, "measurements: plans: expected at most 4 of {\"buckets\": [one choice per "
                                "bucket], \"exposed_s\": s, \"iteration\": N, \"bytes_per_s\": B}");
    }
    return 0;
}

int neox_train_adaptive_restore(neox_trainer *t, json_t *state, const char *dir, neox_error *err) {
    neox_adaptive *a = t->adaptive;
    if (!a || !state) return 0;  // a checkpoint from another mode: decide afresh
    json_t *at = json_object_get(state, "decided_at");
    if (!json_is_integer(at) || json_integer_value(at) < -1)
        return restore_fail(err, dir, "expected \"decided_at\": N >= -1");
    a->decided_at = json_integer_value(at);
    // (trial_end and tried are absent from checkpoints written before trials: no trial, none tried.)
    json_t *trial = json_object_get(state, "trial_end"), *tried = json_object_get(state, "tried");
    a->trial_end = json_is_integer(trial) ? json_integer_value(trial) : -1;
    size_t i;
    json_t *name;
    json_array_foreach(tried, i, name) {
        int s = json_is_string(name) ? neox_scheme_from_name(json_string_value(name)) : -1;
        if (s < 0) return restore_fail(err, dir, "tried: expected scheme names");
        a->tried[s] = 1;
    }
    if (t->grid->data_size <= 1) return 0;
    if (restore_plan(t, state, dir, err) != 0) return -1;
    json_t *m = json_object_get(state, "measurements");
    if (m) return restore_measurements(t, m, dir, err);
    if (t->rank0 && !t->opts.quiet)
        neox_notice("%s/state/train.json: gradient_compression has no measurements (written before they were "
                    "checkpointed): the decisions from here on start without the plans measured before it", dir);
    return 0;
}
