// comm_log.c: communication accounting of a training run. Per step, the difference of every
// group's communicator statistics (lib/parallel/collectives.c) before and after the step goes to
// the metrics (metrics.jsonl, TensorBoard, and under wall_clock_breakdown the log): calls, payload
// bytes, bytes sent and seconds blocked per group and operation, and their totals. At the end of a
// run, with `comms_logger.enabled`, a summary in the form of DeepSpeed's comms_logger
// (deepspeed.comm.log_summary) per group, operation and message size: count, total and average
// latency, algorithmic and bus bandwidth; rank 0 prints its own, log_dir/comms_summary.txt holds
// every rank's. docs/communication.md ("Accounting") describes the numbers. A trainer part
// (parts.c): set-up, free, and the step's start and end.
#include <stdlib.h>
#include <string.h>

#include "internal.h"

// comms_logger (DeepSpeed's keys): the end-of-run summary, per-step verbose lines, the operations shown.
typedef struct neox_comms_logger {
    int enabled, verbose, prof_all, debug;
    unsigned prof_ops;             // bit per neox_comm_op, used when prof_all is false
} neox_comms_logger;

// The part's state: the keys, and each group's statistics when the step began.
typedef struct neox_comm_log {
    neox_comms_logger keys;
    neox_comm_stats before[NEOX_TRAIN_COMM_GROUPS];
} neox_comm_log;

extern const neox_train_part neox_train_comm_log_part;

static neox_comm_log *comm_log_of(const neox_trainer *t) { return *neox_train_part_slot(t, &neox_train_comm_log_part); }

// expert and expert_data: expert parallelism's groups (the exchange's all-to-alls; the experts' reducer);
// context: context parallelism's (the keys' and values' all-gathers, their gradients' reduce-scatters,
// the loss's sums).
static const char *group_names[NEOX_TRAIN_COMM_GROUPS] = {"world", "pipe", "data", "model", "embed", "data_intra",
                                                          "data_inter", "expert", "expert_data", "context"};

neox_comm *neox_train_comm_group(neox_grid *g, int i, const char **name) {
    neox_comm *groups[NEOX_TRAIN_COMM_GROUPS] = {&g->world, &g->pipe, &g->data, &g->model, &g->embed, &g->data_intra,
                                                 &g->data_inter, &g->expert, &g->expert_data, &g->context};
    if (name) *name = group_names[i];
    return groups[i];
}

// ---- configuration ----------------------------------------------------------------------------

// DeepSpeed's op names (deepspeed.comm) for ours, so prof_ops lists written for DeepSpeed work.
static int op_of_name(const char *name) {
    static const struct { const char *name; neox_comm_op op; } aliases[] = {
        {"all_to_all_single", NEOX_COMM_ALLTOALL}, {"all_gather_into_tensor", NEOX_COMM_ALLGATHER},
        {"all_gather_base", NEOX_COMM_ALLGATHER},  {"reduce_scatter_tensor", NEOX_COMM_REDUCE_SCATTER},
        {"reduce_scatter_base", NEOX_COMM_REDUCE_SCATTER}, {"isend", NEOX_COMM_SEND}, {"irecv", NEOX_COMM_RECV},
        {"all_reduce_coalesced", NEOX_COMM_ALLREDUCE}};
    for (int op = 0; op < NEOX_COMM_OP_COUNT; op++)
        if (strcmp(name, neox_comm_op_name(op)) == 0) return op;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (strcmp(name, aliases[i].name) == 0) return (int)aliases[i].op;
    return -1;
}

// base.key as a bool (type checked by the schema), or fallback when unset.
static int flag(const neox_config *cfg, const char *base, const char *key, int fallback) {
    char path[96];
    snprintf(path, sizeof path, "%s.%s", base, key);
    const neox_value *v = neox_config_sub_id(cfg, neox_subkey_id_of(path));
    return v && v->kind == NEOX_VALUE_BOOL ? v->boolean : fallback;
}

// comms_logger: {enabled, verbose, prof_all, prof_ops, debug} with DeepSpeed's defaults (false,
// false, true, [], false). prof_all false limits the summary to the operations named in prof_ops.
static int read_comms_logger(const neox_config *cfg, neox_comms_logger *out, neox_error *err) {
    memset(out, 0, sizeof *out);
    out->prof_all = 1;
    // GPT-NeoX's own configs pass it inside deepspeed_extra_args (configs/19M.yml); the top-level key wins.
    const char *base = "comms_logger";
    if (!neox_config_has(cfg, comms_logger)) {
        const neox_value *extra = neox_config_sub(cfg, deepspeed_extra_args__comms_logger);
        if (!extra || extra->kind != NEOX_VALUE_MAP) return 0;
        base = "deepspeed_extra_args.comms_logger";
    }
    out->enabled = flag(cfg, base, "enabled", 0);
    out->verbose = flag(cfg, base, "verbose", 0);
    out->prof_all = flag(cfg, base, "prof_all", 1);
    out->debug = flag(cfg, base, "debug", 0);
    char path[96];
    snprintf(path, sizeof path, "%s.prof_ops", base);
    const neox_value *ops = neox_config_sub_id(cfg, neox_subkey_id_of(path));
    for (int i = 0; ops && ops->kind == NEOX_VALUE_LIST && i < ops->count; i++) {
        int op = ops->items[i]->kind == NEOX_VALUE_STRING ? op_of_name(ops->items[i]->string) : -1;
        if (op < 0)
            return neox_fail(err, NEOX_EXIT_USAGE,
                             "%s: item %d is not an operation (all_reduce, reduce_scatter, "
                             "all_gather, broadcast, send, recv, barrier, all_to_all or DeepSpeed's names for them)", path, i);
        out->prof_ops |= 1u << op;
    }
    return 0;
}

static int profiled(const neox_comms_logger *l, int op) { return l->prof_all || (l->prof_ops >> op & 1u); }

static int setup_comm_log(neox_trainer *t, neox_error *err) {
    neox_comm_log *l = neox_calloc(1, sizeof *l);
    *neox_train_part_slot(t, &neox_train_comm_log_part) = l;
    return read_comms_logger(t->cfg, &l->keys, err);
}

static void free_comm_log(neox_trainer *t) {
    free(comm_log_of(t));
    *neox_train_part_slot(t, &neox_train_comm_log_part) = NULL;
}

// ---- per step ---------------------------------------------------------------------------------

static void comm_step_begin(neox_trainer *t) {
    neox_comm_log *l = comm_log_of(t);
    for (int i = 0; i < NEOX_TRAIN_COMM_GROUPS; i++) l->before[i] = neox_train_comm_group(t->grid, i, NULL)->stats;
}

// DeepSpeed's calc_bw_log: algorithmic and bus bandwidth in Gbit/s of `bytes` moved in `seconds`
// over a group of n (bytes: our payload, the full buffer of a reduce-scatter or all-gather).
static void bandwidth(neox_comm_op op, double bytes, double seconds, int n, double *algbw, double *busbw) {
    double rate = seconds > 0 ? bytes * 8 / seconds / 1e9 : 0.0, share = n > 1 ? (double)(n - 1) / n : 0.0;
    switch (op) {
    case NEOX_COMM_ALLREDUCE: *algbw = 2 * rate, *busbw = rate * 2 * share; break;
    case NEOX_COMM_ALLGATHER:
    case NEOX_COMM_REDUCE_SCATTER:
    case NEOX_COMM_ALLTOALL: *algbw = rate, *busbw = rate * share; break;
    default: *algbw = *busbw = rate;
    }
}

static void add_step_op(neox_trainer *t, const char *group, int n, int op, const neox_comm_stats *d) {
    char tag[96];
    static const char *fields[] = {"calls", "bytes", "sent", "seconds"};
    double values[] = {(double)d->calls[op], (double)d->bytes[op], (double)d->sent[op], d->seconds[op]};
    for (int f = 0; f < 4; f++) {
        snprintf(tag, sizeof tag, "comm/%s/%s/%s", group, neox_comm_op_name(op), fields[f]);
        neox_metrics_add(t->metrics, tag, values[f]);
    }
    if (comm_log_of(t)->keys.verbose && t->rank0) {
        double algbw, busbw;
        bandwidth(op, (double)d->bytes[op], d->seconds[op], n, &algbw, &busbw);
        neox_info("comm op: %s | group: %s | iteration %lld | calls: %lld | bytes: %lld | time (ms): %.3f | "
                  "algbw (Gbps): %.2f | busbw (Gbps): %.2f", neox_comm_op_name(op), group, (long long)t->state.iteration,
                  (long long)d->calls[op], (long long)d->bytes[op], d->seconds[op] * 1e3, algbw, busbw);
    }
}

// After a step: what each group moved during it, into the metrics (only with more than one rank).
static void comm_step_end(neox_trainer *t) {
    if (t->grid->world_size < 2) return;
    neox_comm_log *l = comm_log_of(t);
    double bytes = 0, sent = 0, seconds = 0;
    for (int i = 0; i < NEOX_TRAIN_COMM_GROUPS; i++) {
        const char *name;
        neox_comm *c = neox_train_comm_group(t->grid, i, &name);
        neox_comm_stats d;
        neox_comm_stats_delta(&d, &c->stats, &l->before[i]);
        for (int op = 0; op < NEOX_COMM_OP_COUNT; op++) {
            if (d.calls[op] == 0) continue;
            add_step_op(t, name, c->size, op, &d);
            bytes += (double)d.bytes[op], sent += (double)d.sent[op], seconds += d.seconds[op];
        }
    }
    neox_metrics_add(t->metrics, "comm/bytes", bytes);
    neox_metrics_add(t->metrics, "comm/sent", sent);
    neox_metrics_add(t->metrics, "comm/exposed_seconds", seconds);
}

// ---- the summary at the end -------------------------------------------------------------------

// DeepSpeed's convert_size: "0B", "531.46 KB" (powers of 1024, two decimals).
static const char *format_size(int64_t bytes, char *buf, size_t size) {
    static const char *units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
    if (bytes < 0) return snprintf(buf, size, "other sizes"), buf;
    if (bytes == 0) return snprintf(buf, size, "0B"), buf;
    if (bytes < 1024) return snprintf(buf, size, "%lld B", (long long)bytes), buf;
    double v = (double)bytes;
    int u = 0;
    while (v >= 1024 && u < 5) v /= 1024, u++;
    snprintf(buf, size, "%.2f %s", v, units[u]);
    return buf;
}

static void summary_rows(FILE *f, const neox_comm_stats *stats, const int *sizes, const neox_comms_logger *l) {
    fprintf(f, "%-28s%-20s%-12s%-20s%-20s%-20s%-20s\n", "Comm. Op", "Message Size", "Count", "Total Latency(ms)",
            "Avg Latency(ms)", "tput_avg (Gbps)", "busbw_avg (Gbps)");
    for (int g = 0; g < NEOX_TRAIN_COMM_GROUPS; g++)
        for (int op = 0; op < NEOX_COMM_OP_COUNT; op++) {
            if (stats[g].calls[op] == 0 || !profiled(l, op)) continue;
            char label[64], sz[32];
            snprintf(label, sizeof label, "%s/%s", group_names[g], neox_comm_op_name(op));
            fprintf(f, "%s\n", label);
            for (int r = 0; r < NEOX_COMM_SIZES; r++) {
                const neox_comm_size_row *row = &stats[g].sizes[op][r];
                if (row->calls == 0) continue;
                double algbw = 0, busbw = 0;
                if (row->bytes > 0) bandwidth(op, (double)row->bytes * (double)row->calls, row->seconds, sizes[g], &algbw, &busbw);
                fprintf(f, "%-28s%-20s%-12lld%-20.3f%-20.3f%-20.2f%-20.2f\n", "", format_size(row->bytes, sz, sizeof sz),
                        (long long)row->calls, row->seconds * 1e3, row->seconds * 1e3 / (double)row->calls, algbw, busbw);
            }
        }
}

// stats: every rank's groups (NEOX_TRAIN_COMM_GROUPS per rank, rank-major), gathered to rank 0.
// gradient_compression: adaptive: per gradient bucket (in the order backward finishes them), the
// steps reduced with each scheme.
static void adaptive_rows(FILE *fp, const neox_trainer *t) {
    json_t *buckets = neox_grad_exchange_report(t->exchange);
    if (!buckets) return;
    fprintf(fp, "adaptive gradient compression: steps per scheme, per bucket\n");
    size_t i;
    json_t *b;
    json_array_foreach(buckets, i, b) {
        fprintf(fp, "  bucket %zu (%lld elements):", i, (long long)json_integer_value(json_object_get(b, "elements")));
        const char *name;
        json_t *steps;
        json_object_foreach(json_object_get(b, "steps"), name, steps) fprintf(fp, " %s %lld", name, (long long)json_integer_value(steps));
        fprintf(fp, "\n");
    }
    json_decref(buckets);
}

int neox_train_write_comms_summary(neox_trainer *t, const neox_comm_stats *stats, neox_error *err) {
    const neox_comm_log *l = comm_log_of(t);
    if (!l || !l->keys.enabled || !t->rank0) return 0;
    int sizes[NEOX_TRAIN_COMM_GROUPS];
    for (int g = 0; g < NEOX_TRAIN_COMM_GROUPS; g++) sizes[g] = neox_train_comm_group(t->grid, g, NULL)->size;
    if (!t->opts.quiet) {
        neox_info("communication summary of rank 0 (comms_logger):");
        summary_rows(stdout, stats, sizes, &l->keys);
        fflush(stdout);
    }
    const char *dir = neox_config_str(t->cfg, log_dir);
    if (!dir) return 0;
    char *path = neox_asprintf("%s/comms_summary.txt", dir);
    neox_atomic_file *af = neox_atomic_open(path, err);
    free(path);
    if (!af) return -1;
    // Group sizes are the same on every rank except embed (size 0 on middle pipe stages, where it has no
    // calls) and the node groups (data_intra, data_inter), whose sizes may differ by node.
    for (int r = 0; r < t->grid->world_size; r++) {
        fprintf(af->fp, "rank %d\n", r);
        summary_rows(af->fp, stats + (size_t)r * NEOX_TRAIN_COMM_GROUPS, sizes, &l->keys);
    }
    adaptive_rows(af->fp, t);
    return neox_atomic_commit(af, err);
}

const neox_train_part neox_train_comm_log_part = {
    .name = "communication log",
    .stage = NEOX_PART_AFTER_LOAD,
    .setup = setup_comm_log,
    .free = free_comm_log,
    .begin_step = comm_step_begin,
    .end_step = comm_step_end,
};
