// comm_report.c: what every rank's communicators moved over the run, gathered to rank 0 and
// written as log_dir/comm_stats.json (and summarised in the log): per rank, per group (data,
// model, pipe, embed, world; data_intra and data_inter under the
// hierarchical all-reduce; expert and expert_data under expert parallelism; context under context
// parallelism) and per operation, the calls, payload bytes, bytes sent and seconds
// blocked. With data parallelism each rank also reports its gradient reducer's timing (parallel.h).
// The registered parts add theirs (their report hooks): under ZeRO-3 each rank's parameter
// coordinator's gathers and the most parameters it held whole, under optimizer offload its copies
// between device and host, under gradient_compression: adaptive the steps each gradient bucket was
// reduced with each scheme. Tests derive the per-step volume of each layout from it;
// docs/parallel.md describes the file.
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

enum { NGROUPS = NEOX_TRAIN_COMM_GROUPS };

static json_t *reduction_json(const neox_grad_reducer_timing *t) {
    return json_pack("{s:I, s:f, s:f, s:f, s:f, s:I, s:f, s:I, s:I}", "reductions", (json_int_t)t->reductions, "finish_seconds",
                     t->finish_seconds, "exposed_seconds", t->exposed_seconds, "progress_seconds", t->progress_seconds,
                     "exposed_with_progress_seconds", t->exposed_with_progress_seconds, "thread_polls",
                     (json_int_t)t->thread_polls, "thread_seconds", t->thread_seconds, "peak_inflight_elements",
                     (json_int_t)t->peak_inflight_elements, "pending_at_backward_end",
                     (json_int_t)t->pending_at_backward_end);
}

static json_t *rank_json(neox_grid *g, const neox_comm_stats *stats, const neox_grad_reducer_timing *reduction,
                         const int *coords) {
    json_t *groups = json_object();
    for (int i = 0; i < NGROUPS; i++) {
        json_t *ops = json_object();
        for (int op = 0; op < NEOX_COMM_OP_COUNT; op++)
            if (stats[i].calls[op] > 0)
                json_object_set_new(ops, neox_comm_op_name(op),
                                    json_pack("{s:I, s:I, s:I, s:f}", "calls", (json_int_t)stats[i].calls[op], "bytes",
                                              (json_int_t)stats[i].bytes[op], "sent", (json_int_t)stats[i].sent[op],
                                              "seconds", stats[i].seconds[op]));
        const char *name;
        neox_train_comm_group(g, i, &name);
        json_object_set_new(groups, name, ops);
    }
    json_t *doc = json_pack("{s:i, s:i, s:i, s:i, s:o}", "rank", coords[0], "pipe", coords[1], "data", coords[2],
                            "model", coords[3], "groups", groups);
    if (reduction->reductions > 0) json_object_set_new(doc, "gradient_reduction", reduction_json(reduction));
    return doc;
}

int neox_train_write_comm_report(neox_trainer *t, neox_error *err) {
    neox_grid *g = t->grid;
    neox_comm_stats mine[NGROUPS];
    for (int i = 0; i < NGROUPS; i++) mine[i] = neox_train_comm_group(g, i, NULL)->stats;  // before the gather below counts
    int n = g->world_size;
    neox_comm_stats *all = neox_malloc((size_t)n * sizeof mine);
    neox_grad_reducer_timing timing = neox_grad_exchange_timing_of(t->exchange);
    neox_grad_reducer_timing *timings = neox_malloc((size_t)n * sizeof timing);
    // (Bookkeeping: under comm_timeout_seconds, so a stopped peer ends the job instead of hanging it.)
    neox_gather_bytes_uncounted(&g->world, mine, (int)sizeof mine, all);
    neox_gather_bytes_uncounted(&g->world, &timing, (int)sizeof timing, timings);
    const char *dir = neox_config_str(t->cfg, log_dir);
    json_t *doc = NULL;
    if (t->rank0 && dir) {
        json_t *ranks = json_array();
        for (int r = 0; r < n; r++) {
            int coords[4] = {r, r / (g->model_size * g->data_size), r / g->model_size % g->data_size, r % g->model_size};
            json_array_append_new(ranks, rank_json(g, all + (size_t)r * NGROUPS, &timings[r], coords));
        }
        doc = json_pack("{s:I, s:o}", "iterations", (json_int_t)t->state.iteration, "ranks", ranks);
    }
    // The parts' own numbers (a collective): ZeRO-3's gathers, the offload's copies, adaptive
    // compression's buckets.
    neox_train_parts_report(t, doc);
    int rc = 0;
    if (doc) {
        char *text = json_dumps(doc, JSON_INDENT(1) | JSON_SORT_KEYS);
        char *path = neox_asprintf("%s/comm_stats.json", dir);
        rc = neox_atomic_write(path, text, strlen(text), err);
        free(path);
        free(text);
        json_decref(doc);
    }
    if (rc == 0) rc = neox_train_write_comms_summary(t, all, err);
    if (t->rank0 && !t->opts.quiet && n > 1) {
        double bytes = 0, seconds = 0;
        for (int i = 0; i < NGROUPS; i++)
            for (int op = 0; op < NEOX_COMM_OP_COUNT; op++) bytes += (double)mine[i].bytes[op], seconds += mine[i].seconds[op];
        char b[16];
        neox_info("communication of rank 0: %s moved, %.2f s blocked", neox_format_bytes(bytes, b, sizeof b), seconds);
    }
    free(all);
    free(timings);
    return rc;
}
