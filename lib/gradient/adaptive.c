// adaptive.c: the policy of gradient_compression: adaptive (gradient.h): from the measured link,
// the backward time left after each gradient bucket is ready and the compressors' costs, the
// exposed communication time of a plan (one way to reduce each bucket) and the plan to use. The
// run-time half (adaptive_run.c) decides when, with the measurements the gradient exchange
// (exchange.c) shares over the data group, and switches; this file only plans, so the plan can be
// tested on any numbers.
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gradient.h"

static const char *const scheme_names[NEOX_SCHEME_COUNT] = {"dense", "bf16", "powersgd", "onebit"};

const char *neox_scheme_name(neox_scheme s) { return s >= 0 && s < NEOX_SCHEME_COUNT ? scheme_names[s] : "?"; }

int neox_scheme_from_name(const char *name) {
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++)
        if (!strcmp(name, scheme_names[s])) return s;
    return -1;
}

// The dense reducer's queue on the link while the plan is costed: times relative to the end of
// backward, so what runs past 0 is exposed.
typedef struct link_queue {
    double free_at;  // when the link has sent every overlapped bucket so far
    double tail;     // max(0, free_at): the overlapped buckets' exposed time
} link_queue;

static double transfer_s(const neox_adaptive_inputs *in, const neox_bucket_option *o) {
    return o->messages * in->latency_s + o->wire_bytes / in->bytes_per_s;
}

static int same_choice(neox_bucket_choice a, neox_bucket_choice b) {
    return a.scheme == b.scheme && (a.scheme != NEOX_SCHEME_POWERSGD || a.rank == b.rank);
}

// A compressed option joins the call of the bucket before it when that one made the same choice:
// neighbouring buckets are neighbouring tensors, reduced in one call whose latency is paid once.
static int joins(const neox_bucket_option *before, const neox_bucket_option *o) {
    return before && !o->overlapped && !before->overlapped && same_choice(before->choice, o->choice);
}

// What option o of bucket b adds to the step's exposed time (before: the option of the bucket
// before it, or NULL); with commit, the queue moves on.
static double marginal_s(const neox_adaptive_inputs *in, const neox_bucket_inputs *b, const neox_bucket_option *o,
                         const neox_bucket_option *before, link_queue *q, int commit) {
    if (!o->overlapped)  // after backward, one call after the other
        return o->compute_s + transfer_s(in, o) - (joins(before, o) ? o->messages * in->latency_s : 0.0);
    double efficiency = in->overlap_efficiency > 0 ? in->overlap_efficiency : 1.0;
    double free_at = fmax(-efficiency * b->hide_s, q->free_at) + transfer_s(in, o), tail = fmax(0.0, free_at);
    double added = o->compute_s + (in->overlap_scale > 0 ? in->overlap_scale : 1.0) * (tail - q->tail);
    if (commit) q->free_at = free_at, q->tail = tail;
    return added;
}

double neox_adaptive_plan_cost(const neox_adaptive_inputs *in, const int *plan, double *marginal) {
    link_queue q = {-INFINITY, 0.0};
    double total = 0.0;
    for (int i = 0; i < in->nbuckets; i++) {
        const neox_bucket_inputs *b = &in->bucket[i];
        const neox_bucket_option *before = i ? &in->bucket[i - 1].option[plan[i - 1]] : NULL;
        double m = marginal_s(in, b, &b->option[plan[i]], before, &q, 1);
        if (marginal) marginal[i] = m;
        total += m;
    }
    return total;
}

// How far a plan is from the most faithful one: each bucket's option index, weighted by its share.
static double fidelity_loss(const neox_adaptive_inputs *in, const int *plan) {
    double loss = 0.0;
    for (int i = 0; i < in->nbuckets; i++) loss += in->bucket[i].share * plan[i];
    return loss;
}

static int same_plan(const int *a, const int *b, int n) {
    for (int i = 0; i < n; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

// Bucket by bucket in ready order: a less faithful option must save a share of the step time, not
// just win (the margin is shared out by the buckets' sizes, so one bucket holding everything is
// judged as the whole gradient would be).
static void greedy_plan(const neox_adaptive_inputs *in, int *plan) {
    link_queue q = {-INFINITY, 0.0};
    for (int i = 0; i < in->nbuckets; i++) {
        const neox_bucket_inputs *b = &in->bucket[i];
        const neox_bucket_option *before = i ? &in->bucket[i - 1].option[plan[i - 1]] : NULL;
        int best = 0;
        double best_s = marginal_s(in, b, &b->option[0], before, &q, 0);
        for (int k = 1; k < b->noptions; k++) {
            double s = marginal_s(in, b, &b->option[k], before, &q, 0);
            if (best_s - s > in->margin * (b->share * in->step_s + best_s)) best = k, best_s = s;
        }
        plan[i] = best;
        marginal_s(in, b, &b->option[best], before, &q, 1);
    }
}

// The plan's measurement, if it has one, else its prediction.
static double known_cost(const neox_adaptive_inputs *in, const int *plan) {
    for (int m = 0; m < in->nmeasured; m++)
        if (same_plan(plan, in->measured_plan[m], in->nbuckets)) return in->measured_s[m];
    return neox_adaptive_plan_cost(in, plan, NULL);
}

// Every bucket's option making choice c into plan; 0 if a bucket has none.
static int uniform_plan(const neox_adaptive_inputs *in, neox_bucket_choice c, int *plan) {
    for (int i = 0; i < in->nbuckets; i++) {
        const neox_bucket_inputs *b = &in->bucket[i];
        plan[i] = -1;
        for (int k = 0; k < b->noptions && plan[i] < 0; k++)
            if (same_choice(b->option[k].choice, c)) plan[i] = k;
        if (plan[i] < 0) return 0;
    }
    return 1;
}

static int all_overlapped(const neox_adaptive_inputs *in, const int *plan) {
    for (int i = 0; i < in->nbuckets; i++)
        if (!in->bucket[i].option[plan[i]].overlapped) return 0;
    return 1;
}

// The most recent measured plan whose buckets all go through the reducer, or -1.
static int overlapped_measurement(const neox_adaptive_inputs *in) {
    for (int m = 0; m < in->nmeasured; m++)
        if (all_overlapped(in, in->measured_plan[m])) return m;
    return -1;
}

double neox_adaptive_calibration(const neox_adaptive_inputs *in) {
    int m = overlapped_measurement(in);
    if (m < 0) return 1.0;
    neox_adaptive_inputs raw = *in;
    raw.overlap_scale = raw.overlap_efficiency = 1.0;
    double predicted = neox_adaptive_plan_cost(&raw, in->measured_plan[m], NULL);
    // Only ever down: a busy host adds time to the probes, never removes it; a measurement above
    // the model is the overlap's own shortfall (neox_adaptive_overlap_efficiency). (0 would read
    // as unset.)
    return predicted > 0 ? fmin(1.0, fmax(in->measured_s[m] / predicted, 1e-9)) : 1.0;
}

enum { EFFICIENCY_STEPS = 50 };  // bisection halvings of (0, 1]

double neox_adaptive_overlap_efficiency(const neox_adaptive_inputs *in) {
    int m = overlapped_measurement(in);
    if (m < 0) return 1.0;
    neox_adaptive_inputs at = *in;
    at.overlap_scale = 1.0;
    const int *plan = in->measured_plan[m];
    double target = in->measured_s[m];
    at.overlap_efficiency = 1.0;
    if (neox_adaptive_plan_cost(&at, plan, NULL) >= target) return 1.0;
    at.overlap_efficiency = 1e-9;
    if (neox_adaptive_plan_cost(&at, plan, NULL) <= target) return 1e-9;
    // The exposed time falls as the efficiency rises (each bucket's transfer may start earlier).
    double lo = 1e-9, hi = 1.0;
    for (int k = 0; k < EFFICIENCY_STEPS; k++) {
        at.overlap_efficiency = 0.5 * (lo + hi);
        if (neox_adaptive_plan_cost(&at, plan, NULL) > target) lo = at.overlap_efficiency;
        else hi = at.overlap_efficiency;
    }
    return hi;
}

enum { MAX_CANDIDATES = 1 + NEOX_BUCKET_OPTIONS + 16 };

double neox_adaptive_plan(const neox_adaptive_inputs *given, int *plan) {
    neox_adaptive_inputs calibrated = *given, *in = &calibrated;
    calibrated.overlap_scale = neox_adaptive_calibration(given);
    calibrated.overlap_efficiency = neox_adaptive_overlap_efficiency(given);
    greedy_plan(in, plan);
    // The candidates: the greedy plan, every static compressed scheme (each bucket making the same
    // choice: bf16, PowerSGD at each rank, 1-bit), then the measured plans, in order of fidelity
    // (stable). Bucket by bucket the greedy plan weighs each option against the rest of its own
    // plan, trusting the overlap model for the buckets before; a static scheme is costed on its
    // own, so where that model is wrong (overlapped transfers that do not really hide) the scheme
    // is still tried. (All-dense is not one: the greedy plan starts from it and leaves it only to
    // save a bucket's share of the margin.)
    int nuniform = in->nbuckets ? in->bucket[0].noptions : 0;
    int *uniform = neox_malloc((size_t)(nuniform ? nuniform : 1) * (size_t)(in->nbuckets ? in->nbuckets : 1) * sizeof *uniform);
    const int *cand[MAX_CANDIDATES];
    double cost[MAX_CANDIDATES], loss[MAX_CANDIDATES];
    int n = 0;
    for (int m = -1 - nuniform; m < in->nmeasured && n < MAX_CANDIDATES; m++) {
        const int *p = plan;
        if (m >= 0) p = in->measured_plan[m];
        else if (m > -1 - nuniform) {  // the static scheme of bucket 0's option k
            int k = m + nuniform, *u = uniform + (size_t)k * (size_t)in->nbuckets;
            if (k == 0 || !uniform_plan(in, in->bucket[0].option[k].choice, u)) continue;
            p = u;
        }
        double c = m < 0 ? known_cost(in, p) : in->measured_s[m], l = fidelity_loss(in, p);
        int at = n++;
        for (; at > 0 && loss[at - 1] > l; at--) cand[at] = cand[at - 1], cost[at] = cost[at - 1], loss[at] = loss[at - 1];
        cand[at] = p, cost[at] = c, loss[at] = l;
    }
    // Fidelity first: a less faithful plan must save a share of the step time, not just win.
    int best = 0;
    for (int k = 1; k < n; k++)
        if (cost[best] - cost[k] > in->margin * (in->step_s + cost[best])) best = k;
    if (cand[best] != plan) memcpy(plan, cand[best], (size_t)in->nbuckets * sizeof *plan);
    free(uniform);
    return cost[best];
}

void neox_adaptive_fit_link(double small_bytes, double small_s, double large_bytes, double large_s, double *latency_s,
                            double *bytes_per_s) {
    double dbytes = large_bytes - small_bytes, dt = large_s - small_s;
    // A large probe no slower than the small one (noise, or a link this fast): bandwidth from the
    // large probe alone, latency from the small one.
    if (dbytes <= 0 || dt <= 0) {
        *bytes_per_s = large_s > 0 ? large_bytes / large_s : INFINITY;
        *latency_s = fmax(0.0, small_s);
        return;
    }
    *bytes_per_s = dbytes / dt;
    *latency_s = fmax(0.0, small_s - small_bytes / *bytes_per_s);
}
