// adaptive_run.c: the run-time half of gradient_compression: adaptive (gradient.h). Every interval
// steps (from compress_start on) the data group's measurements arrive through the share hook (the
// exchange times two all-reduces after a barrier and takes the maximum of every value over the
// group: the slowest rank's numbers win, so every rank decides on the same numbers), and the policy
// (adaptive.c) plans how the next steps reduce each gradient bucket: the configured all-reduce,
// bf16 on the wire (both in the reducer, overlapped with backward), PowerSGD at one of the
// candidate ranks, or 1-bit (both after backward, on the bucket's own parameters). Each bucket
// switches through the use hook; a bucket that leaves a compressor hands its error back to the
// next gradients, so what it owed is not lost. Each decision and its inputs go to the decisions log
// (log_dir/gradient_compression.jsonl); a replay file repeats such a log's decisions instead of
// measuring (the same run again, bit for bit). The plan in use and what the next decisions build on
// are checkpointed. Nothing here communicates.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"

#define COST_SMOOTHING 0.5   // weight of the newest measurement of a compressor's own cost
#define MARGIN 0.02          // a less faithful plan must save 2% of the step time
#define TRIAL_STEPS 3        // a scheme never run is decided on again after this many steps
#define MAX_RANKS NEOX_ADAPTIVE_MAX_RANKS
#define REMEMBERED 4         // plans whose measured exposure the policy keeps in reach...
#define REMEMBER_INTERVALS 4 // ...for this many intervals after they last ran,
#define REMEMBER_LINK 2.0     // ...and while the link's bandwidth stays within this factor of theirs

typedef struct bucket_state {
    neox_adaptive_bucket in;     // its parameters and what each option sends
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

struct neox_adaptive_run {
    neox_adaptive_settings s;         // (bucket: copied below)
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
    FILE *log;                        // rank 0, with log_dir
    // gradient_compression_replay: the decisions to repeat (a plan of nreplay_buckets per line;
    // a whole-gradient line has one entry for every bucket).
    int64_t *replay_iter;
    neox_bucket_choice **replay_plan;
    int *replay_whole, nreplay, nreplay_buckets;
    const char *replay_path;
    // What each decision measures, from a file instead of the group (measurements_path).
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
static int read_replay_line(neox_adaptive_run *a, json_t *d, int max_rank, const char *path, int lineno, neox_error *err) {
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

static int read_replay(neox_adaptive_run *a, const char *path, int max_rank, neox_error *err) {
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
static const neox_bucket_choice *replayed(const neox_adaptive_run *a, int64_t iteration, int *stride) {
    for (int i = 0; i < a->nreplay; i++)
        if (a->replay_iter[i] == iteration) {
            *stride = a->replay_whole[i] ? 0 : 1;
            return a->replay_plan[i];
        }
    return NULL;
}

// ---- measurements from a file ---------------------------------------------------------------
// Tests and reproductions of a decision: one JSON line per decision iteration, {"iteration": N,
// "probe_s": [small, large], "backward_s": s, "step_s": s, "exposed_s": s, "slack_s": [per bucket],
// "onebit_s_per_element": s, "powersgd_s_per_madd": s}, taken in place of what the group measured
// (the probes still run, so the communication is the same).
static int read_fixed(neox_adaptive_run *a, const char *path, neox_error *err) {
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

static int fixed_number(const neox_adaptive_run *a, json_t *d, const char *key, int index, int64_t iteration,
                        double *out, neox_error *err) {
    json_t *v = json_object_get(d, key);
    if (index >= 0) v = json_array_get(v, (size_t)index);
    if (!json_is_number(v))
        return neox_fail(err, NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: %s: iteration %lld: expected a number for "
                         "%s%s", a->fixed_path, (long long)iteration, key, index >= 0 ? " (one per element)" : "");
    *out = json_number_value(v);
    return 0;
}

// The file's measurements at this iteration over v (measure's layout: the probes, backward, step,
// the negated exposure, the schemes' unit costs, each bucket's slack).
static int apply_fixed(const neox_adaptive_run *a, int64_t it, double *v, neox_error *err) {
    json_t *d = NULL, *x;
    size_t k;
    json_array_foreach(a->fixed, k, x) if (json_integer_value(json_object_get(x, "iteration")) == it) d = x;
    if (!d)
        return neox_fail(err, NEOX_EXIT_USAGE, "NEOX_ADAPTIVE_MEASUREMENTS: %s has no line for iteration %lld, where "
                         "this run decides", a->fixed_path, (long long)it);
    double exposed = 0;
    int rc = fixed_number(a, d, "probe_s", 0, it, &v[0], err);
    if (rc == 0) rc = fixed_number(a, d, "probe_s", 1, it, &v[1], err);
    if (rc == 0) rc = fixed_number(a, d, "backward_s", -1, it, &v[2], err);
    if (rc == 0) rc = fixed_number(a, d, "step_s", -1, it, &v[3], err);
    if (rc == 0 && a->exposed_steps && (rc = fixed_number(a, d, "exposed_s", -1, it, &exposed, err)) == 0) v[4] = -exposed;
    if (rc == 0) rc = fixed_number(a, d, "onebit_s_per_element", -1, it, &v[5 + NEOX_SCHEME_ONEBIT], err);
    if (rc == 0) rc = fixed_number(a, d, "powersgd_s_per_madd", -1, it, &v[5 + NEOX_SCHEME_POWERSGD], err);
    for (int i = 0; rc == 0 && i < a->nbuckets; i++)
        rc = fixed_number(a, d, "slack_s", i, it, &v[5 + NEOX_SCHEME_COUNT + i], err);
    return rc;
}

// ---- set-up ----------------------------------------------------------------------------------
int neox_adaptive_candidate_ranks(int max_rank, int *ranks) {
    int n = 0, p = 1;
    ranks[n++] = max_rank;
    while (p * 2 < max_rank) p *= 2;
    for (; p >= 1 && n < MAX_RANKS; p /= 2)
        if (p < max_rank) ranks[n++] = p;
    return n;
}

static int check_replay_buckets(const neox_adaptive_run *a, neox_error *err) {
    if (!a->nreplay_buckets || a->nreplay_buckets == a->nbuckets) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "gradient_compression_replay: %s plans %d buckets; this run's gradients "
                     "are in %d (reduce_bucket_size and the model decide)", a->replay_path, a->nreplay_buckets, a->nbuckets);
}

neox_adaptive_run *neox_adaptive_run_make(const neox_adaptive_settings *s, neox_error *err) {
    neox_adaptive_run *a = neox_calloc(1, sizeof *a);
    a->s = *s, a->s.bucket = NULL;
    a->decided_at = -1, a->trial_end = -1;
    a->interval = s->interval;
    a->nranks = neox_adaptive_candidate_ranks(s->max_rank, a->ranks);
    if ((s->replay_path && read_replay(a, s->replay_path, s->max_rank, err) != 0) ||
        (s->measurements_path && read_fixed(a, s->measurements_path, err) != 0)) {
        neox_adaptive_run_free(a);
        return NULL;
    }
    a->nbuckets = s->nbuckets;
    a->bucket = neox_calloc((size_t)a->nbuckets + 1, sizeof *a->bucket);
    for (int i = 0; i < a->nbuckets; i++)
        a->bucket[i].in = s->bucket[i], a->bucket[i].use = (neox_bucket_choice){NEOX_SCHEME_DENSE, a->ranks[0]};
    if (a->nbuckets && check_replay_buckets(a, err) != 0) {
        neox_adaptive_run_free(a);
        return NULL;
    }
    return a;
}

void neox_adaptive_run_set_log(neox_adaptive_run *a, FILE *log) { a->log = log; }

void neox_adaptive_run_free(neox_adaptive_run *a) {
    if (!a) return;
    if (a->log) fclose(a->log);
    for (int m = 0; m < REMEMBERED; m++) free(a->remembered[m].use);
    free(a->bucket);
    free(a->replay_iter);
    for (int i = 0; i < a->nreplay; i++) free(a->replay_plan[i]);
    free(a->replay_plan);
    free(a->replay_whole);
    json_decref(a->fixed);
    free(a);
}

// ---- measuring -------------------------------------------------------------------------------
static double ring_bytes(const neox_adaptive_run *a, double bytes) {
    double p = a->s.data_size;
    return 2.0 * (p - 1) / p * bytes;
}

// Bucket b's options in order of fidelity: the configured all-reduce, bf16 (unless that is the
// configured wire), PowerSGD at each candidate rank from the largest, 1-bit.
static void bucket_options(const neox_adaptive_run *a, const bucket_state *b, neox_bucket_inputs *in) {
    double width = a->s.wire == NEOX_F32 ? 4.0 : 2.0;
    int n = 0;
    in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_DENSE, b->use.rank}, ring_bytes(a, b->in.elements * width), 1,
                                           a->s.overlap, 0};
    if (a->s.wire != NEOX_BF16)
        in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_BF16, b->use.rank}, ring_bytes(a, b->in.elements * 2.0), 1,
                                               a->s.overlap, 0};
    for (int k = 0; k < a->nranks; k++)
        in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_POWERSGD, a->ranks[k]}, b->in.powersgd_wire_bytes[k], 2, 0,
                                               a->unit_cost[NEOX_SCHEME_POWERSGD] * b->in.powersgd_work[k]};
    in->option[n++] = (neox_bucket_option){{NEOX_SCHEME_ONEBIT, b->use.rank}, b->in.onebit_wire_bytes, 2, 0,
                                           a->unit_cost[NEOX_SCHEME_ONEBIT] * b->in.elements};
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
static int still_valid(const neox_adaptive_run *a, const remembered_plan *r, int64_t iteration) {
    if (iteration - r->at > REMEMBER_INTERVALS * a->interval) return 0;
    if (a->bytes_per_s <= 0 || r->bytes_per_s <= 0) return 1;  // (no link model to compare)
    double ratio = r->bytes_per_s / a->bytes_per_s;
    return ratio <= REMEMBER_LINK && ratio >= 1.0 / REMEMBER_LINK;
}

static void forget_stale(neox_adaptive_run *a, int64_t iteration) {
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

static void remember(neox_adaptive_run *a, int64_t iteration, double exposed_s) {
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
    r->exposed_s = exposed_s, r->at = iteration, r->bytes_per_s = a->bytes_per_s;
}

static int measure(neox_adaptive_run *a, int64_t iteration, neox_adaptive_inputs *in, neox_bucket_inputs *bucket,
                   int *measured_idx, const int **measured_plan, double *measured_s, neox_error *err) {
    // The plan in use, as real steps exposed it: the least over the ranks (the last rank to reach
    // the reduction waits only for it), as a maximum of negated values.
    double negated_exposed = a->exposed_steps ? -a->exposed_sum / (double)a->exposed_steps : -INFINITY;
    enum { FIXED = 5 + NEOX_SCHEME_COUNT };
    size_t nv = FIXED + (size_t)a->nbuckets;
    double *v = neox_calloc(nv, sizeof *v);
    v[2] = a->backward_s, v[3] = a->step_s, v[4] = negated_exposed;
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) v[5 + s] = a->unit_cost[s];
    for (int i = 0; i < a->nbuckets; i++) v[FIXED + i] = a->bucket[i].slack_s;
    if (a->s.hooks.share) a->s.hooks.share(a->s.hooks.ctx, v, nv);
    if (a->fixed && apply_fixed(a, iteration, v, err) != 0) {
        free(v);
        return -1;
    }
    memset(in, 0, sizeof *in);
    neox_adaptive_fit_link(ring_bytes(a, (double)a->s.probe_floats[0] * 4.0), v[0],
                           ring_bytes(a, (double)a->s.probe_floats[1] * 4.0), v[1], &in->latency_s, &in->bytes_per_s);
    a->latency_s = in->latency_s, a->bytes_per_s = in->bytes_per_s, a->backward_s = v[2];
    in->step_s = v[3], in->margin = MARGIN;
    forget_stale(a, iteration);
    if (isfinite(v[4])) remember(a, iteration, -v[4]);
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) a->unit_cost[s] = v[5 + s];  // every rank plans with the same costs
    double total = 0;
    for (int i = 0; i < a->nbuckets; i++) total += a->bucket[i].in.elements;
    for (int i = 0; i < a->nbuckets; i++) {
        // Slack is measured from the ready call to the reduction; backward_s bounds it.
        bucket[i].hide_s = a->s.overlap ? fmin(v[FIXED + i], v[2]) : 0.0;
        bucket[i].share = a->bucket[i].in.elements / total;
        bucket_options(a, &a->bucket[i], &bucket[i]);
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
    return 0;
}

// A plan's summary name: the scheme every bucket uses, or "mixed".
static const char *plan_summary(const neox_adaptive_run *a) {
    for (int i = 1; i < a->nbuckets; i++)
        if (a->bucket[i].use.scheme != a->bucket[0].use.scheme) return "mixed";
    return a->nbuckets ? neox_scheme_name(a->bucket[0].use.scheme) : "dense";
}

static json_t *plan_json(const neox_adaptive_run *a) {
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
static json_t *measured_plans_json(const neox_adaptive_run *a) {
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

static void log_decision(neox_adaptive_run *a, int64_t iteration, const char *from, json_t *from_plan,
                         const neox_adaptive_inputs *in, const int *plan, double predicted) {
    if (!a->log) {
        json_decref(from_plan);
        return;
    }
    json_t *d = json_pack("{s:I, s:s, s:s, s:o, s:o}", "iteration", (json_int_t)iteration, "scheme",
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
// Bucket i moves to choice c through the use hook: what a compressor it leaves owes goes into the
// next gradients (before backward adds to them, so the next reduction carries it); PowerSGD keeps
// its error across a rank change. A scheme other than PowerSGD leaves the bucket's Q at its rank.
static void use_choice(neox_adaptive_run *a, int i, neox_bucket_choice c, int restore) {
    bucket_state *b = &a->bucket[i];
    if (!restore && c.scheme != NEOX_SCHEME_POWERSGD) c.rank = b->use.rank;
    if (a->s.hooks.use) a->s.hooks.use(a->s.hooks.ctx, i, b->use, c, restore);
    b->use = c;
}

static void note_change(const neox_adaptive_run *a, int64_t iteration, const char *from, const neox_adaptive_inputs *in) {
    if (!a->s.verbose) return;
    json_t *plan = plan_json(a);
    char *text = json_dumps(plan, JSON_COMPACT);
    neox_info("iteration %lld: gradient compression %s -> %s %s (link %.3g Gbit/s, latency %.3g ms)",
              (long long)iteration, from, plan_summary(a), text, in->bytes_per_s * 8e-9, in->latency_s * 1e3);
    free(text);
    json_decref(plan);
}

// The plan's fingerprint, for the agree hook after every decision.
static void check_ranks_agree(const neox_adaptive_run *a, int64_t iteration) {
    double fingerprint = 0;
    for (int i = 0; i < a->nbuckets; i++)
        fingerprint = fmod(fingerprint * 131.0 + a->bucket[i].use.scheme * 1024.0 + a->bucket[i].use.rank, 1e15);
    if (a->s.hooks.agree) a->s.hooks.agree(a->s.hooks.ctx, fingerprint, iteration);
}

// The replay file's plan at this iteration (it has one: replayed says so).
static void replay_decision(neox_adaptive_run *a, int64_t iteration, const neox_bucket_choice *forced, int stride,
                            const char *from, json_t *from_plan) {
    for (int i = 0; i < a->nbuckets; i++) {
        neox_bucket_choice c = forced[i * stride];
        if (c.scheme == NEOX_SCHEME_BF16 && a->s.wire == NEOX_BF16) c.scheme = NEOX_SCHEME_DENSE;
        use_choice(a, i, c, 0);
    }
    check_ranks_agree(a, iteration);
    log_decision(a, iteration, from, from_plan, NULL, NULL, 0);
}

int neox_adaptive_run_decide(neox_adaptive_run *a, int64_t iteration, neox_error *err) {
    char from[16];
    snprintf(from, sizeof from, "%s", plan_summary(a));
    json_t *from_plan = plan_json(a);
    int stride = 0;
    const neox_bucket_choice *forced = a->nreplay ? replayed(a, iteration, &stride) : NULL;
    if (a->nreplay && !forced) {  // replaying: only the file's iterations decide
        json_decref(from_plan);
        return 0;
    }
    a->decided_at = iteration;
    if (forced) {
        replay_decision(a, iteration, forced, stride, from, from_plan);
        return 0;
    }
    neox_adaptive_inputs in;
    neox_bucket_inputs *bucket = neox_calloc((size_t)a->nbuckets + 1, sizeof *bucket);
    int *plan = neox_calloc((size_t)a->nbuckets + 1, sizeof *plan);
    int *measured_idx = neox_calloc((size_t)REMEMBERED * (size_t)a->nbuckets + 1, sizeof *measured_idx);
    const int *measured_plan[REMEMBERED];
    double measured_s[REMEMBERED];
    if (measure(a, iteration, &in, bucket, measured_idx, measured_plan, measured_s, err) != 0) {
        json_decref(from_plan);
        free(bucket), free(measured_idx), free(plan);
        return -1;
    }
    a->exposed_sum = 0, a->exposed_steps = 0;
    double predicted = neox_adaptive_plan(&in, plan);
    int changed = 0, untried = 0;
    for (int i = 0; i < a->nbuckets; i++) {
        neox_bucket_choice c = bucket[i].option[plan[i]].choice;
        changed |= !same_choice(c, a->bucket[i].use);
        untried |= !a->tried[c.scheme];
        use_choice(a, i, c, 0);
    }
    // A plan using a scheme never run runs a few steps, then is judged on what they measured.
    a->trial_end = untried && TRIAL_STEPS < a->interval ? iteration + TRIAL_STEPS : -1;
    check_ranks_agree(a, iteration);
    log_decision(a, iteration, from, from_plan, &in, plan, predicted);
    if (changed) note_change(a, iteration, from, &in);
    free(bucket), free(measured_idx), free(plan);
    return 0;
}

// ---- per step --------------------------------------------------------------------------------
int neox_adaptive_run_due(const neox_adaptive_run *a, int64_t iteration, int64_t optimizer_steps) {
    return optimizer_steps >= a->s.compress_start &&
           (a->decided_at < 0 || a->nreplay || iteration - a->decided_at >= a->interval ||
            (a->trial_end >= 0 && iteration >= a->trial_end));
}

neox_bucket_choice neox_adaptive_run_choice(const neox_adaptive_run *a, int bucket) { return a->bucket[bucket].use; }

double neox_adaptive_run_link_seconds(const neox_adaptive_run *a, double wire_bytes) {
    return a->bytes_per_s > 0 ? 2 * a->latency_s + wire_bytes / a->bytes_per_s : 0.0;
}

void neox_adaptive_run_add_costs(neox_adaptive_run *a, const double *extra_s, const double *units) {
    if (a->bytes_per_s <= 0) return;  // (replaying: no link model to measure against)
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
        if (units[s] <= 0) continue;
        double *cost = &a->unit_cost[s], now = extra_s[s] / units[s];
        *cost = *cost > 0 ? COST_SMOOTHING * now + (1 - COST_SMOOTHING) * *cost : now;
    }
}

const char *neox_adaptive_gauge_name(int i) {
    static const char *const names[NEOX_ADAPTIVE_GAUGES] = {
        "comm/adaptive/dense", "comm/adaptive/bf16", "comm/adaptive/powersgd", "comm/adaptive/onebit",
        "comm/adaptive/compressed_buckets", "comm/adaptive/link_gbit_per_s"};
    _Static_assert(NEOX_SCHEME_COUNT == 4, "a gauge for every scheme, in neox_scheme's order");
    return i >= 0 && i < NEOX_ADAPTIVE_GAUGES ? names[i] : "?";
}

// After the step: this rank's backward and compute time, the plan's exposed time, each bucket's
// slack, and the step's share of elements per scheme (the gauges).
void neox_adaptive_run_end_step(neox_adaptive_run *a, const neox_adaptive_step *step, double *gauges) {
    a->backward_s = step->backward_s, a->step_s = fmax(0.0, step->wall_s - step->exposed_s);
    a->exposed_sum += step->exposed_s, a->exposed_steps++;
    double share[NEOX_SCHEME_COUNT] = {0}, total = 0, compressed = 0;
    for (int i = 0; i < a->nbuckets; i++) {
        bucket_state *b = &a->bucket[i];
        b->slack_s = step->slack_s[i];
        a->tried[b->use.scheme] = 1;
        share[b->use.scheme] += b->in.elements, total += b->in.elements;
        compressed += b->use.scheme == NEOX_SCHEME_POWERSGD || b->use.scheme == NEOX_SCHEME_ONEBIT;
        neox_bucket_inputs in;
        bucket_options(a, b, &in);
        b->steps[option_of(&in, b->use)]++;
    }
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) gauges[s] = total > 0 ? share[s] / total : 0.0;
    gauges[NEOX_SCHEME_COUNT] = compressed;
    gauges[NEOX_SCHEME_COUNT + 1] = a->bytes_per_s * 8e-9;
}

// The comms summary's part: per bucket, the steps reduced with each option.
json_t *neox_adaptive_run_summary(const neox_adaptive_run *a) {
    if (!a || !a->nbuckets) return NULL;
    json_t *list = json_array();
    for (int i = 0; i < a->nbuckets; i++) {
        neox_bucket_inputs in;
        bucket_options(a, &a->bucket[i], &in);
        json_t *steps = json_object();
        for (int k = 0; k < in.noptions; k++) {
            if (!a->bucket[i].steps[k]) continue;
            char text[32];
            choice_text(in.option[k].choice, text, sizeof text);
            json_object_set_new(steps, text, json_integer(a->bucket[i].steps[k]));
        }
        json_array_append_new(list, json_pack("{s:I, s:o}", "elements", (json_int_t)a->bucket[i].in.elements, "steps", steps));
    }
    return list;
}

// ---- checkpoints -----------------------------------------------------------------------------
// What the next decisions build on, so a resumed run decides as the straight one would: the plans
// measured and their exposure, the link and step as last measured, the compressors' unit costs,
// each bucket's slack and the exposure summed since the last decision. (Doubles are written with
// 17 digits: they read back exactly.)
static json_t *measurements_json(const neox_adaptive_run *a) {
    json_t *slack = json_array();
    for (int i = 0; i < a->nbuckets; i++) json_array_append_new(slack, json_real(a->bucket[i].slack_s));
    return json_pack("{s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:I, s:o, s:o}", "latency_s", a->latency_s, "bytes_per_s",
                     a->bytes_per_s, "backward_s", a->backward_s, "step_s", a->step_s, "onebit_s_per_element",
                     a->unit_cost[NEOX_SCHEME_ONEBIT], "powersgd_s_per_madd", a->unit_cost[NEOX_SCHEME_POWERSGD],
                     "exposed_sum_s", a->exposed_sum, "exposed_steps", (json_int_t)a->exposed_steps, "slack_s", slack,
                     "plans", measured_plans_json(a));
}

json_t *neox_adaptive_run_state(const neox_adaptive_run *a) {
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
static int restore_plan(neox_adaptive_run *a, json_t *state, const char *dir, neox_error *err) {
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
        if (choice.scheme == NEOX_SCHEME_BF16 && a->s.wire == NEOX_BF16) choice.scheme = NEOX_SCHEME_DENSE;
        // The compressors' state was restored with the optimizer: take the plan without moving it.
        use_choice(a, i, choice, 1);
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
static int restore_remembered(neox_adaptive_run *a, json_t *r) {
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

static int restore_measurements(neox_adaptive_run *a, json_t *m, const char *dir, neox_error *err) {
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

int neox_adaptive_run_restore(neox_adaptive_run *a, json_t *state, const char *dir, neox_error *err) {
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
    if (a->s.data_size <= 1) return 0;
    if (restore_plan(a, state, dir, err) != 0) return -1;
    json_t *m = json_object_get(state, "measurements");
    if (m) return restore_measurements(a, m, dir, err);
    if (a->s.verbose)
        neox_notice("%s/state/train.json: gradient_compression has no measurements (written before they were "
                    "checkpointed): the decisions from here on start without the plans measured before it", dir);
    return 0;
}
