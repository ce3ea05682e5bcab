// adaptive.c: the policy of gradient_compression: adaptive (gradient.h): from the measured link and
// compute, the exposed communication time each scheme would cost per step, and the choice. The
// trainer (lib/train/compression.c) measures, shares the measurements over the data group, and
// switches; this file only decides, so the decision can be tested on any numbers.
#include <math.h>
#include <string.h>

#include "gradient.h"

static const char *const scheme_names[NEOX_SCHEME_COUNT] = {"dense", "bf16", "powersgd", "onebit"};

const char *neox_scheme_name(neox_scheme s) { return s >= 0 && s < NEOX_SCHEME_COUNT ? scheme_names[s] : "?"; }

int neox_scheme_from_name(const char *name) {
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++)
        if (!strcmp(name, scheme_names[s])) return s;
    return -1;
}

// An overlapped reduction runs behind backward; the compressed ones run after it, their inputs
// being the finished gradients.
double neox_adaptive_exposed(const neox_adaptive_inputs *in, const neox_scheme_cost *c) {
    double transfer = c->messages * in->latency_s + c->wire_bytes / in->bytes_per_s;
    double hidden = c->overlapped ? in->backward_s : 0.0;
    return c->compute_s + fmax(0.0, transfer - hidden);
}

neox_scheme neox_adaptive_choose(const neox_adaptive_inputs *in, double *predicted) {
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++)
        predicted[s] = in->cost[s].available ? neox_adaptive_exposed(in, &in->cost[s]) : INFINITY;
    if (in->current_exposed_s >= 0 && in->current >= 0 && in->current < NEOX_SCHEME_COUNT && in->cost[in->current].available)
        predicted[in->current] = in->current_exposed_s;
    int best = -1;
    for (int s = 0; s < NEOX_SCHEME_COUNT; s++) {
        if (!in->cost[s].available) continue;
        if (best < 0) {
            best = s;
            continue;
        }
        // Fidelity first: a less faithful scheme must save a share of the step time, not just win.
        double saving = predicted[best] - predicted[s];
        if (saving > in->margin * (in->step_s + predicted[best])) best = s;
    }
    return best < 0 ? NEOX_SCHEME_DENSE : (neox_scheme)best;
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
