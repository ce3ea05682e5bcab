// op_profile.c: the reports of the per-op profile (kernels/op_profile.c records; formats in
// docs/metrics.md, "The per-op profile"): the table by op class printed with the wall_clock_breakdown
// lines, and op_profile.json. It sits above the layers beside lib/backend.c, reading the profile
// through kernels/backend.h and writing with lib/core's atomic files.
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/backend.h"

// The class sums at the last printed table, so each table shows its own interval.
static neox_op_stat printed[NEOX_CLASS_COUNT];
static int64_t printed_iterations;  // the iterations the tables so far covered

static void add_stat(neox_op_stat *to, neox_op_stat s) {
    to->calls += s.calls;
    to->seconds += s.seconds;
    to->flops += s.flops;
    to->bytes += s.bytes;
}

// Sums over one phase (or every phase when phase < 0) and one layer (every layer and outside them
// when layer < -1) by op.
static neox_op_stat sum_scope(neox_op_id op, int phase, int layer) {
    neox_op_stat sum = {0};
    int layers = neox_profile_layers();
    for (int p = 0; p < NEOX_PHASE_COUNT; p++) {
        if (phase >= 0 && p != phase) continue;
        for (int l = -1; l < layers; l++)
            if (layer < -1 || l == layer) add_stat(&sum, neox_profile_stat((neox_phase)p, l, op));
    }
    return sum;
}

static void class_sums(neox_op_stat sums[NEOX_CLASS_COUNT]) {
    memset(sums, 0, NEOX_CLASS_COUNT * sizeof *sums);
    for (int op = 0; op < NEOX_OP_COUNT; op++) add_stat(&sums[neox_op_class_of((neox_op_id)op)], sum_scope(op, -1, -2));
}

static void print_row(FILE *out, const char *name, neox_op_stat s, double per) {
    double ms = 1e3 * s.seconds / per;
    fprintf(out, "  %-12s %9.1f %10.3f %10.3f %9.4f %10.1f %9.2f\n", name, (double)s.calls / per, ms,
            s.flops / per * 1e-9, s.bytes / per * 1e-9, s.seconds > 0 ? s.flops / s.seconds * 1e-9 : 0.0,
            s.seconds > 0 ? s.bytes / s.seconds * 1e-9 : 0.0);
}

void neox_profile_print_table(FILE *out, int64_t iterations) {
    neox_profile_flush();
    neox_op_stat now[NEOX_CLASS_COUNT], total = {0};
    class_sums(now);
    double per = iterations > 0 ? (double)iterations : 1.0;
    printed_iterations += iterations;
    fprintf(out, "op profile per iteration over %lld (%s, %s):\n", (long long)iterations,
            neox_profile_inner() ? neox_profile_inner()->name : "?", neox_profile_timing());
    fprintf(out, "  %-12s %9s %10s %10s %9s %10s %9s\n", "class", "calls", "ms", "GFLOP", "GB", "GFLOP/s", "GB/s");
    for (int c = 0; c < NEOX_CLASS_COUNT; c++) {
        neox_op_stat d = {now[c].calls - printed[c].calls, now[c].seconds - printed[c].seconds,
                          now[c].flops - printed[c].flops, now[c].bytes - printed[c].bytes};
        printed[c] = now[c];
        if (d.calls == 0) continue;
        add_stat(&total, d);
        print_row(out, neox_op_class_name((neox_op_class)c), d, per);
    }
    print_row(out, "total", total, per);
    fflush(out);
}

static json_t *stat_json(neox_op_stat s) {
    json_t *o = json_object();
    json_object_set_new(o, "calls", json_integer((json_int_t)s.calls));
    json_object_set_new(o, "ms", json_real(1e3 * s.seconds));
    json_object_set_new(o, "flops", json_real(s.flops));
    json_object_set_new(o, "bytes", json_real(s.bytes));
    return o;
}

// {"forward": stat, ...} of one layer (-1: outside the layers), phases with calls only.
static json_t *phases_json(int layer) {
    json_t *o = json_object();
    for (int p = 0; p < NEOX_PHASE_COUNT; p++) {
        neox_op_stat sum = {0};
        for (int op = 0; op < NEOX_OP_COUNT; op++) add_stat(&sum, sum_scope(op, p, layer));
        if (sum.calls) json_object_set_new(o, neox_phase_name((neox_phase)p), stat_json(sum));
    }
    return o;
}

// The blocking host waits inside each training step so far (neox_profile_note_step_host_waits).
static int64_t *step_waits;
static size_t nstep_waits, step_waits_cap;

void neox_profile_note_step_host_waits(int64_t waits) {
    if (nstep_waits == step_waits_cap) {
        step_waits_cap = step_waits_cap ? 2 * step_waits_cap : 64;
        step_waits = neox_realloc(step_waits, step_waits_cap * sizeof *step_waits);
    }
    step_waits[nstep_waits++] = waits;
}

static json_t *host_waits_json(void) {
    json_t *o = json_object(), *per_step = json_array();
    int64_t total = 0;
    for (size_t i = 0; i < nstep_waits; i++) {
        total += step_waits[i];
        json_array_append_new(per_step, json_integer((json_int_t)step_waits[i]));
    }
    json_object_set_new(o, "all", json_integer((json_int_t)neox_host_waits()));
    json_object_set_new(o, "in_steps", json_integer((json_int_t)total));
    json_object_set_new(o, "per_step", per_step);
    return o;
}

static json_t *profile_json(void) {
    json_t *root = json_object(), *by_class = json_object(), *by_op = json_object(), *by_phase = json_object();
    json_t *by_layer = json_array();
    neox_op_stat classes[NEOX_CLASS_COUNT], total = {0};
    class_sums(classes);
    json_object_set_new(root, "backend", json_string(neox_profile_inner() ? neox_profile_inner()->name : "?"));
    json_object_set_new(root, "timing", json_string(neox_profile_timing()));
    json_object_set_new(root, "iterations", json_integer((json_int_t)printed_iterations));
    for (int c = 0; c < NEOX_CLASS_COUNT; c++) {
        add_stat(&total, classes[c]);
        if (classes[c].calls) json_object_set_new(by_class, neox_op_class_name((neox_op_class)c), stat_json(classes[c]));
    }
    json_object_set_new(root, "total", stat_json(total));
    for (int op = 0; op < NEOX_OP_COUNT; op++) {
        neox_op_stat s = sum_scope(op, -1, -2);
        if (!s.calls) continue;
        json_t *o = stat_json(s);
        json_object_set_new(o, "class", json_string(neox_op_class_name(neox_op_class_of((neox_op_id)op))));
        json_object_set_new(by_op, neox_op_name((neox_op_id)op), o);
    }
    json_t *all = phases_json(-2);  // (every layer and outside them)
    json_object_update(by_phase, all);
    json_decref(all);
    for (int l = 0; l < neox_profile_layers(); l++) {
        json_t *o = phases_json(l);
        json_object_set_new(o, "layer", json_integer(l));
        json_array_append_new(by_layer, o);
    }
    json_object_set_new(root, "by_class", by_class);
    json_object_set_new(root, "by_op", by_op);
    json_object_set_new(root, "by_phase", by_phase);
    json_object_set_new(root, "by_layer", by_layer);
    json_object_set_new(root, "outside_layers", phases_json(-1));
    json_object_set_new(root, "host_waits", host_waits_json());
    return root;
}

int neox_profile_write_json(const char *path, char *err, size_t errlen) {
    neox_profile_flush();
    json_t *root = profile_json();
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    neox_error e = {0};
    int rc = text ? neox_atomic_write(path, text, strlen(text), &e) : neox_fail(&e, NEOX_EXIT_FAILURE, "%s: out of memory", path);
    free(text);
    if (rc != 0) snprintf(err, errlen, "%s", e.message);
    return rc;
}
