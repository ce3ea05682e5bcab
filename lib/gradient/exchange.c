// exchange.c: the gradient exchange (gradient.h): the one owner of how this rank's gradients cross
// the data-parallel group. It builds the reducer over the dense parameters (the input embedding
// apart under sparse_gradients, the hierarchical all-reduce across nodes at stage 0 on the host)
// and the experts' reducer over the ranks holding them, ZeRO-2's partition sums, the compressors
// (1-bit Adam's momentum, gradient_compression onebit or powersgd) and the adaptive plan's run-time
// half (adaptive_run.c), whose probes, switches and agreement check it carries out. Per step it
// decides (begin_step) whether the gradients are reduced or left to the compressors, starts the
// buckets backward reports ready, finishes and compresses, and hands the plan the step's times.
// It answers for their memory, their report and their checkpoint state. The gradients arrive
// pre-scaled by 1 / data size, so every path reduces by sum (neox_grad_exchange_finish, gradient.h).
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "gradient.h"

#define PROBE_SMALL_FLOATS 256
#define PROBE_LARGE_FLOATS (256 * 1024)
#define PROBE_REPEATS 3

struct neox_grad_exchange {
    neox_grad_exchange_settings s;      // param_offset and param_size: its own copies; rows, cols: NULL after make
    neox_grad_reducer *reducer;         // NULL at data-parallel size 1
    neox_grad_reducer *expert_reducer;  // expert parallelism: the experts over expert_data
    int reducer_first;                  // first parameter in the reducer's buckets (1: sparse takes the embedding)
    int hierarchical;                   // the reducer sums over data_intra, then data_inter
    float *partition;                   // ZeRO-2 and 3: reduced gradients of the partition, summed over micro-batches
    size_t partition_elems;
    neox_sparse_rows *sparse;           // sparse_gradients: the input embedding's rows
    neox_onebit *momentum;              // 1-bit Adam's compressed momentum all-reduce
    neox_onebit *onebit;                // gradient_compression: onebit (or adaptive)
    neox_powersgd *powersgd;            // gradient_compression: powersgd (or adaptive)
    neox_adaptive_run *adaptive;        // gradient_compression: adaptive (at every data-parallel size)
    neox_adaptive_bucket *bucket;       // the adaptive plan's buckets (data-parallel size > 1)
    int nbuckets;
    float *probe;                       // the link probes' payload
    int reduce_now;                     // the current micro-batch's backward is followed by a reduction
    int local_grads;                    // this step leaves the gradients to the compressors
    double at_start[4];                 // backward's and the reduction's clock, the wall clock, the
                                        // reducer's progress seconds when the step began
};

// ---- the reducers ----------------------------------------------------------------------------
// A reducer over params [first, end) of the flat buffer and the group `over`, averaging over
// mean_over ranks (0: the group; 1: summing). NULL with *err filled when it cannot be made.
static neox_grad_reducer *make_reducer_over(neox_grad_exchange *x, int first, int end, neox_comm *over, int mean_over,
                                            neox_error *err) {
    const neox_grad_exchange_settings *s = &x->s;
    int n = end - first;
    size_t base = s->param_offset[first], stop = end < s->nparams ? s->param_offset[end] : s->n;
    size_t *offset = neox_malloc((size_t)n * sizeof *offset), *size = neox_malloc((size_t)n * sizeof *size);
    for (int p = 0; p < n; p++) offset[p] = s->param_offset[first + p] - base, size[p] = s->param_size[first + p];
    // Under expert parallelism ZeRO-1 partitions over the expert-data group after whole reductions
    // (the trainer's partition), so the reducers all-reduce.
    neox_grad_reducer_options ro = {.bucket_bytes = s->bucket_bytes, .zero_stage = s->expert_data ? 0 : s->zero_stage,
                                    .all_reduce = !s->reduce_scatter, .overlap = s->overlap,
                                    .predivide_factor = s->predivide, .wire = s->wire, .backend = s->backend,
                                    .partition_sum = x->partition, .progress_interval = s->progress_interval,
                                    .mean_over = mean_over, .fill_elems = s->fill_elems};
    if (x->hierarchical && over == s->data) ro.hier_intra = s->data_intra, ro.hier_inter = s->data_inter;
    neox_grad_reducer *r = neox_grad_reducer_make(over, s->grads + base, stop - base, offset, size, n, &ro, err);
    free(offset);
    free(size);
    return r;
}

// ZeRO-2 and 3: the partition's sums (the reducer's partition, known before it exists).
static void make_partition(neox_grad_exchange *x) {
    const neox_grad_exchange_settings *s = &x->s;
    size_t lo, hi;
    neox_even_share(s->n - s->param_offset[x->reducer_first], s->data->rank, s->data->size, &lo, &hi);
    x->partition_elems = hi - lo;
    x->partition = s->backend->alloc((hi - lo + 1) * sizeof(float));
    s->backend->memset_zero(x->partition, (hi - lo + 1) * sizeof(float));
}

// The dense reducer (after the sparse rows and the partition), and the experts' one.
static int make_reducers(neox_grad_exchange *x, neox_error *err) {
    neox_grad_exchange_settings *s = &x->s;
    if (s->sparse)
        x->sparse = neox_sparse_rows_make(s->data, s->backend, s->sparse_rows, s->sparse_width, s->sparse_row_begin,
                                          s->predivide, 1);
    x->reducer_first = x->sparse ? 1 : 0;
    if (s->zero_stage >= 2) make_partition(x);
    // (On a GPU, NCCL's own rings and trees follow the node topology: no hierarchical layer on top.)
    if (s->zero_stage == 0 && !s->backend->on_device && neox_hier_make(s->data, s->data_intra, s->data_inter) > 0) {
        x->hierarchical = 1;
        if (s->verbose)
            neox_info("data-parallel all-reduce: hierarchical (%d ranks per node on this node)", s->data_intra->size);
    }
    x->reducer = make_reducer_over(x, x->reducer_first, s->dense_params, s->data, 1, err);
    if (!x->reducer) return -1;
    // Each expert already holds the sum over its expert group's tokens: summed over the ranks
    // holding it and divided by the whole data-parallel size (pre-scaled: already), it is the mean
    // over every micro-batch.
    if (!s->expert_data) return 0;
    x->expert_reducer = make_reducer_over(x, s->dense_params, s->nparams, s->expert_data, 1, err);
    return x->expert_reducer ? 0 : -1;
}

// ---- the compressors -------------------------------------------------------------------------
// One segment per parameter (the flat buffer in parameter order).
static neox_onebit *make_onebit(const neox_grad_exchange *x) {
    const neox_grad_exchange_settings *s = &x->s;
    for (int i = 0; i < s->nparams; i++)
        neox_assert(s->param_offset[i] == (i ? s->param_offset[i - 1] + s->param_size[i - 1] : 0),
                    "compressed all-reduce: parameter %d does not follow parameter %d", i, i - 1);
    return neox_onebit_make(s->data, s->backend, s->param_size, s->nparams);
}

// Adaptive runs choose the rank per bucket: state for every matrix that pays at the smallest candidate.
static neox_powersgd *make_powersgd(const neox_grad_exchange *x) {
    const neox_grad_exchange_settings *s = &x->s;
    int ranks[NEOX_ADAPTIVE_MAX_RANKS];
    int min_rank = s->compression == NEOX_COMPRESSION_ADAPTIVE
                       ? ranks[neox_adaptive_candidate_ranks(s->powersgd_rank, ranks) - 1] : s->powersgd_rank;
    return neox_powersgd_make_ranks(s->data, s->backend, s->rows, s->cols, s->nparams, min_rank,
                                    s->powersgd_rank);
}

static void make_compressors(neox_grad_exchange *x) {
    neox_grad_compression c = x->s.compression;
    if (x->s.onebit_adam) x->momentum = make_onebit(x);
    if (c == NEOX_COMPRESSION_ONEBIT || c == NEOX_COMPRESSION_ADAPTIVE) x->onebit = make_onebit(x);
    if (c == NEOX_COMPRESSION_POWERSGD || c == NEOX_COMPRESSION_ADAPTIVE) x->powersgd = make_powersgd(x);
}

// ---- the adaptive plan's hooks ---------------------------------------------------------------
// The fastest of PROBE_REPEATS timed all-reduces: a probe measures the link, and the noise of a
// busy host only ever adds time.
static double timed_allreduce(neox_grad_exchange *x, size_t floats) {
    double best = INFINITY;
    for (int k = 0; k < PROBE_REPEATS; k++) {
        neox_barrier(x->s.data);
        double start = neox_now();
        neox_allreduce_sum(x->s.data, x->probe, floats, NEOX_F32);
        best = fmin(best, neox_now() - start);
    }
    return best;
}

static size_t large_probe_floats(const neox_grad_exchange *x) {
    size_t large = x->s.n < PROBE_LARGE_FLOATS ? x->s.n : PROBE_LARGE_FLOATS;
    return large < 2 * PROBE_SMALL_FLOATS ? 2 * PROBE_SMALL_FLOATS : large;
}

// The probes, then every measurement's maximum over the group.
static void share_measurements(void *ctx, double *v, size_t nv) {
    neox_grad_exchange *x = ctx;
    v[0] = timed_allreduce(x, PROBE_SMALL_FLOATS), v[1] = timed_allreduce(x, large_probe_floats(x));
    neox_allreduce_max(x->s.data, v, nv, NEOX_F64);
}

// Bucket i moves from one choice to another: what a compressor it leaves owes goes into the
// gradients about to be computed; PowerSGD's rank change keeps its error (set_rank hands back only
// what a matrix no longer compressed owes). Restored plans take the checkpoint's state as it is.
static void use_choice(void *ctx, int i, neox_bucket_choice from, neox_bucket_choice to, int restore) {
    neox_grad_exchange *x = ctx;
    const neox_adaptive_bucket *b = &x->bucket[i];
    float *grads = x->s.grads;
    if (restore) {
        if (x->powersgd) neox_powersgd_set_rank(x->powersgd, b->first, b->count, to.rank, NULL);
    } else {
        if (from.scheme == NEOX_SCHEME_POWERSGD && to.scheme != NEOX_SCHEME_POWERSGD)
            neox_powersgd_flush_range(x->powersgd, grads, b->first, b->count);
        if (from.scheme == NEOX_SCHEME_ONEBIT && to.scheme != NEOX_SCHEME_ONEBIT)
            neox_onebit_flush_range(x->onebit, grads, b->first, b->count);
        if (to.scheme == NEOX_SCHEME_POWERSGD && to.rank != from.rank)
            neox_powersgd_set_rank(x->powersgd, b->first, b->count, to.rank, grads);
    }
    int compressed = to.scheme == NEOX_SCHEME_POWERSGD || to.scheme == NEOX_SCHEME_ONEBIT;
    neox_grad_reducer_set_bucket(x->reducer, i, compressed, to.scheme == NEOX_SCHEME_BF16 ? NEOX_BF16 : x->s.wire);
}

// Every rank must reduce each bucket the same way, or the collectives pair up wrongly: the plan's
// fingerprint is compared over the data group after every decision (one small all-reduce). The
// plan is made from measurements the ranks share, so a difference is a bug; every rank sees it
// from the same all-reduce and stops together.
static void check_agreement(void *ctx, double fingerprint, int64_t iteration) {
    neox_grad_exchange *x = ctx;
    double v[2] = {fingerprint, -fingerprint};
    neox_allreduce_max(x->s.data, v, 2, NEOX_F64);
    if (v[0] != -v[1])
        neox_bug("gradient_compression: adaptive: the data-parallel ranks planned different schemes at iteration %lld "
                 "(their measurements were not shared)", (long long)iteration);
}

// Bucket i of the reducer as a range of the parameters (the compressors' segments), with what
// each option would send for it.
static void map_bucket(const neox_grad_exchange *x, int i, const int *ranks, int nranks, neox_adaptive_bucket *b) {
    const neox_grad_exchange_settings *s = &x->s;
    size_t base = s->param_offset[x->reducer_first], begin, end;
    neox_grad_reducer_bucket_range(x->reducer, i, &begin, &end, NULL);
    b->first = -1;
    for (int p = x->reducer_first; p < s->nparams; p++)
        if (s->param_offset[p] >= base + begin && s->param_offset[p] < base + end) {
            if (b->first < 0) b->first = p;
            b->count = p - b->first + 1;
        }
    b->elements = (double)(end - begin);
    b->onebit_wire_bytes = neox_onebit_wire_bytes_range(x->onebit, b->first, b->count);
    for (int k = 0; k < nranks; k++) {
        b->powersgd_wire_bytes[k] = neox_powersgd_wire_bytes_at(x->powersgd, b->first, b->count, ranks[k]);
        b->powersgd_work[k] = neox_powersgd_work_at(x->powersgd, b->first, b->count, ranks[k]);
    }
}

static int make_adaptive(neox_grad_exchange *x, neox_error *err) {
    const neox_grad_exchange_settings *s = &x->s;
    int ranks[NEOX_ADAPTIVE_MAX_RANKS], nranks = neox_adaptive_candidate_ranks(s->powersgd_rank, ranks);
    if (x->reducer) {
        x->nbuckets = neox_grad_reducer_bucket_count(x->reducer);
        x->bucket = neox_calloc((size_t)x->nbuckets, sizeof *x->bucket);
        for (int i = 0; i < x->nbuckets; i++) map_bucket(x, i, ranks, nranks, &x->bucket[i]);
    }
    neox_adaptive_settings as = {.max_rank = s->powersgd_rank, .interval = s->adaptive_interval,
                                 .compress_start = s->compress_start, .wire = s->wire, .overlap = s->overlap,
                                 .data_size = s->data->size, .probe_floats = {PROBE_SMALL_FLOATS, large_probe_floats(x)},
                                 .nbuckets = x->nbuckets, .bucket = x->bucket, .replay_path = s->replay_path,
                                 .measurements_path = s->measurements_path, .verbose = s->verbose,
                                 .hooks = {share_measurements, use_choice, check_agreement, x}};
    x->adaptive = neox_adaptive_run_make(&as, err);
    if (!x->adaptive) return -1;
    if (x->reducer) x->probe = neox_calloc(PROBE_LARGE_FLOATS, sizeof(float));
    return 0;
}

// ---- making it -------------------------------------------------------------------------------
// The settings, with the parameter table the exchange reads after make copied.
static void take_settings(neox_grad_exchange *x, const neox_grad_exchange_settings *s) {
    size_t bytes = ((size_t)s->nparams + 1) * sizeof(size_t);
    size_t *offset = neox_calloc(1, bytes), *size = neox_calloc(1, bytes);
    memcpy(offset, s->param_offset, (size_t)s->nparams * sizeof(size_t));
    memcpy(size, s->param_size, (size_t)s->nparams * sizeof(size_t));
    x->s = *s;
    x->s.param_offset = offset, x->s.param_size = size;
}

neox_grad_exchange *neox_grad_exchange_make(const neox_grad_exchange_settings *s, neox_error *err) {
    neox_grad_exchange *x = neox_calloc(1, sizeof *x);
    take_settings(x, s);
    if (s->data->size > 1) {
        if (make_reducers(x, err) != 0) {
            neox_grad_exchange_free(x);
            return NULL;
        }
        make_compressors(x);
    }
    if (s->compression == NEOX_COMPRESSION_ADAPTIVE && make_adaptive(x, err) != 0) {
        neox_grad_exchange_free(x);
        return NULL;
    }
    x->s.rows = x->s.cols = NULL;  // (the caller's: only PowerSGD's make reads them)
    return x;
}

void neox_grad_exchange_free(neox_grad_exchange *x) {
    if (!x) return;
    neox_adaptive_run_free(x->adaptive);
    free(x->bucket);
    free(x->probe);
    neox_onebit_free(x->onebit);
    neox_powersgd_free(x->powersgd);
    if (x->reducer) neox_grad_reducer_free(x->reducer);
    if (x->expert_reducer) neox_grad_reducer_free(x->expert_reducer);
    neox_sparse_rows_free(x->sparse);
    neox_onebit_free(x->momentum);
    if (x->partition) x->s.backend->free(x->partition);
    free((size_t *)x->s.param_offset);
    free((size_t *)x->s.param_size);
    free(x);
}

int neox_grad_exchange_logs_decisions(const neox_grad_exchange *x) { return x->adaptive && x->reducer; }

void neox_grad_exchange_set_log(neox_grad_exchange *x, FILE *log) {
    if (x->adaptive) neox_adaptive_run_set_log(x->adaptive, log);
    else if (log) fclose(log);
}

int neox_grad_exchange_reduces(const neox_grad_exchange *x) { return x->reducer != NULL; }
int neox_grad_exchange_wants_ready(const neox_grad_exchange *x) {
    return x->reducer && (x->s.overlap || x->partition);
}
int neox_grad_exchange_hierarchical(const neox_grad_exchange *x) { return x->hierarchical; }
int neox_grad_exchange_overlapped(const neox_grad_exchange *x) { return x->reducer && x->s.overlap; }

void neox_grad_exchange_partition(const neox_grad_exchange *x, int r, size_t *begin, size_t *end) {
    // (Stage 0 only, where the share only cuts checkpoints: they cut the whole buffer.)
    if (x->reducer_first > 0) neox_even_share(x->s.n, r, x->s.data->size, begin, end);
    else neox_grad_reducer_partition(x->reducer, r, begin, end);
}

float *neox_grad_exchange_partition_grads(const neox_grad_exchange *x) { return x->partition; }
neox_onebit *neox_grad_exchange_momentum_compressor(const neox_grad_exchange *x) { return x->momentum; }

// ---- per step --------------------------------------------------------------------------------
// Whether the step leaves the gradients unreduced: 1-bit Adam's compression phase, or
// gradient_compression from gradient_compression_start on. Under adaptive the reducer always
// runs: it leaves the buckets the plan compresses alone, and finish compresses those after it.
static int leaves_grads_local(const neox_grad_exchange *x, int64_t optimizer_steps) {
    if (x->adaptive) return 0;
    if (x->onebit || x->powersgd) return optimizer_steps >= x->s.compress_start;
    return x->s.onebit_adam && optimizer_steps >= x->s.freeze_step;
}

int neox_grad_exchange_begin_step(neox_grad_exchange *x, int64_t iteration, int64_t optimizer_steps, neox_error *err) {
    // (ZeRO-2: every reduction leaves the flat buffer all zeros; only the partition's sum starts again.)
    if (x->partition) x->s.backend->memset_zero(x->partition, x->partition_elems * sizeof(float));
    if (x->adaptive && x->reducer) {
        if (neox_adaptive_run_due(x->adaptive, iteration, optimizer_steps) &&
            neox_adaptive_run_decide(x->adaptive, iteration, err) != 0)
            return -1;
        x->s.clock(x->s.clock_ctx, &x->at_start[0], &x->at_start[1]);
        x->at_start[2] = neox_now();
        x->at_start[3] = neox_grad_reducer_progress_seconds(x->reducer);
    }
    x->local_grads = leaves_grads_local(x, optimizer_steps);
    return 0;
}

int neox_grad_exchange_micro_batch(neox_grad_exchange *x, int last) {
    x->reduce_now = x->s.zero_stage >= 2 || last;
    return x->reduce_now;
}

int neox_grad_exchange_reduce_now(const neox_grad_exchange *x) { return x->reduce_now; }

static int starts_buckets(const neox_grad_exchange *x) {
    return neox_grad_exchange_wants_ready(x) && x->reduce_now && !x->local_grads;
}

void neox_grad_exchange_ready(neox_grad_exchange *x, int begin, int end) {
    if (!starts_buckets(x)) return;
    int experts = x->s.dense_params;
    for (int p = begin; p < end; p++)
        if (p >= experts) neox_grad_reducer_ready(x->expert_reducer, p - experts);
        else if (p != x->s.held_param && p >= x->reducer_first) neox_grad_reducer_ready(x->reducer, p - x->reducer_first);
    neox_grad_reducer_progress(x->reducer);
    if (x->expert_reducer) neox_grad_reducer_progress(x->expert_reducer);
}

void neox_grad_exchange_ready_range(neox_grad_exchange *x, size_t begin, size_t end) {
    if (!starts_buckets(x)) return;
    const neox_grad_exchange_settings *s = &x->s;
    int held = s->held_param;
    if (held >= 0 && begin >= s->param_offset[held] && end <= s->param_offset[held] + s->param_size[held]) return;
    size_t base = s->param_offset[x->reducer_first];
    neox_grad_reducer_ready_range(x->reducer, begin - base, end - base);
    neox_grad_reducer_progress(x->reducer);
}

void neox_grad_exchange_ready_held(neox_grad_exchange *x) {
    if (neox_grad_exchange_wants_ready(x)) neox_grad_reducer_ready(x->reducer, x->s.held_param - x->reducer_first);
}

void neox_grad_exchange_touch_rows(neox_grad_exchange *x, const int32_t *tokens, size_t n) {
    if (x->sparse) neox_sparse_rows_touch(x->sparse, tokens, n);
}

// Parameters [first, + count) after a compressor's average: pre-scaled gradients' sum is the group's
// size times it. The error feedback stays whole: the compressors' errors are in the units of the
// gradients they were given, and what they hand back is summed.
static void compressed_to_sum(neox_grad_exchange *x, int first, int count) {
    const neox_grad_exchange_settings *s = &x->s;
    if (count == 0 || s->data->size == 1) return;
    int last = first + count - 1;
    size_t begin = s->param_offset[first], end = s->param_offset[last] + s->param_size[last];
    s->backend->scale(s->grads + begin, end - begin, (float)s->data->size);
}

// After the reducer's finish: every bucket the plan compresses, on its own parameters, neighbours
// with the same choice in one call (bucket i + 1 holds the tensors just before bucket i's), timed;
// what a call took beyond the link model is the compressor's own cost, per unit of its work.
static void compress_planned(neox_grad_exchange *x) {
    double extra[NEOX_SCHEME_COUNT] = {0}, units[NEOX_SCHEME_COUNT] = {0};
    const neox_adaptive_bucket *b = x->bucket;
    for (int i = 0, j; i < x->nbuckets; i = j) {
        neox_bucket_choice c = neox_adaptive_run_choice(x->adaptive, i);
        double elements = b[i].elements;
        for (j = i + 1; j < x->nbuckets; j++) {
            neox_bucket_choice next = neox_adaptive_run_choice(x->adaptive, j);
            if (next.scheme != c.scheme || (c.scheme == NEOX_SCHEME_POWERSGD && next.rank != c.rank)) break;
            elements += b[j].elements;
        }
        if (c.scheme != NEOX_SCHEME_POWERSGD && c.scheme != NEOX_SCHEME_ONEBIT) continue;
        int first = b[j - 1].first, count = b[i].first + b[i].count - first;
        double start = neox_now(), wire;
        if (c.scheme == NEOX_SCHEME_POWERSGD) {
            neox_powersgd_allreduce_range(x->powersgd, x->s.grads, first, count);
            compressed_to_sum(x, first, count);
            wire = neox_powersgd_wire_bytes_at(x->powersgd, first, count, c.rank);
            units[c.scheme] += neox_powersgd_work_at(x->powersgd, first, count, c.rank);
        } else {
            neox_onebit_allreduce_range(x->onebit, x->s.grads, first, count);
            compressed_to_sum(x, first, count);
            wire = neox_onebit_wire_bytes_range(x->onebit, first, count);
            units[c.scheme] += elements;
        }
        // A device queues the compressor's ops and returns: its cost is known once they have run.
        if (x->s.backend->on_device) x->s.backend->synchronize();
        extra[c.scheme] += fmax(0.0, neox_now() - start - neox_adaptive_run_link_seconds(x->adaptive, wire));
    }
    neox_adaptive_run_add_costs(x->adaptive, extra, units);
}

// The compressed gradients: all of them (the step leaves them local), or under adaptive the
// buckets the reducer left. A step that leaves them local without a compressor (1-bit Adam's
// compression phase, whose optimizer reads this rank's own mean gradient) undoes the pre-scaling.
static void compress(neox_grad_exchange *x) {
    if (x->adaptive) {
        compress_planned(x);
        return;
    }
    if (x->onebit) neox_onebit_allreduce(x->onebit, x->s.grads);
    if (x->powersgd) neox_powersgd_allreduce(x->powersgd, x->s.grads);
    if (x->s.nparams > 0) compressed_to_sum(x, 0, x->s.nparams);
}

void neox_grad_exchange_finish(neox_grad_exchange *x) {
    if (!x->local_grads) {
        // sparse_gradients: the embedding, outside the buckets
        if (x->sparse) neox_sparse_rows_reduce(x->sparse, x->s.grads + x->s.param_offset[0]);
        neox_grad_reducer_finish(x->reducer);
        if (x->expert_reducer) neox_grad_reducer_finish(x->expert_reducer);
    }
    if (x->local_grads || x->adaptive) compress(x);
}

int neox_grad_exchange_end_step(neox_grad_exchange *x, double *gauges) {
    if (!x->adaptive || !x->reducer) return 0;
    double backward, reduce;
    x->s.clock(x->s.clock_ctx, &backward, &reduce);
    // A plan's cost is the reduction backward waited for plus the calls backward made to start
    // and progress its overlapped buckets: on a fast link those calls, not the wait, are what an
    // overlapped all-reduce costs (bench/comm.sh at 10 Gbit/s: overlapped 388.6 ms per step
    // against 352.9 serial), and only measuring them lets a plan sending fewer bytes show it.
    double exposed = reduce - x->at_start[1] + neox_grad_reducer_progress_seconds(x->reducer) - x->at_start[3];
    double *slack = neox_calloc((size_t)x->nbuckets + 1, sizeof *slack);
    for (int i = 0; i < x->nbuckets; i++) neox_grad_reducer_bucket_range(x->reducer, i, &(size_t){0}, &(size_t){0}, &slack[i]);
    neox_adaptive_step step = {backward - x->at_start[0], exposed, neox_now() - x->at_start[2], slack};
    neox_adaptive_run_end_step(x->adaptive, &step, gauges);
    free(slack);
    return 1;
}

// ---- memory, report, state -------------------------------------------------------------------
neox_grad_exchange_memory neox_grad_exchange_memory_of(const neox_grad_exchange *x) {
    neox_grad_exchange_memory m = {x->s.n * 4, 0};
    if (x->reducer) {
        m.grads = neox_grad_reducer_resident_bytes(x->reducer) + (x->s.n - neox_grad_reducer_size(x->reducer)) * 4;
        m.comm = neox_grad_reducer_wire_bytes(x->reducer) + neox_grad_reducer_scratch_bytes(x->reducer);
        // Adaptive compression may put any bucket on a bf16 wire, whose copy is allocated when first used.
        if (x->adaptive && !neox_grad_reducer_wire_bytes(x->reducer)) m.comm += neox_grad_reducer_size(x->reducer) * 2;
    }
    m.grads += x->partition_elems * 4;
    if (x->expert_reducer) m.comm += neox_grad_reducer_wire_bytes(x->expert_reducer);
    const char *names[NEOX_EXCHANGE_BUFFERS];
    float *bufs[NEOX_EXCHANGE_BUFFERS];
    size_t counts[NEOX_EXCHANGE_BUFFERS];
    int n = neox_grad_exchange_buffers(x, names, bufs, counts);
    for (int i = 0; i < n; i++) m.comm += counts[i] * 4;
    return m;
}

neox_grad_reducer_timing neox_grad_exchange_timing_of(neox_grad_exchange *x) {
    return x->reducer ? neox_grad_reducer_timing_of(x->reducer) : (neox_grad_reducer_timing){0};
}

json_t *neox_grad_exchange_report(const neox_grad_exchange *x) { return neox_adaptive_run_summary(x->adaptive); }

int neox_grad_exchange_buffers(const neox_grad_exchange *x, const char **names, float **bufs, size_t *counts) {
    static const char *const what[NEOX_EXCHANGE_BUFFERS] = {
        "optimizer/onebit_worker_error", "optimizer/onebit_server_error", "optimizer/gradient_worker_error",
        "optimizer/gradient_server_error", "optimizer/powersgd_error", "optimizer/powersgd_q"};
    int n = 0;
    for (int k = 0; k < NEOX_EXCHANGE_BUFFERS; k++) {
        neox_onebit *o = k < 2 ? x->momentum : k < 4 ? x->onebit : NULL;
        if (o) bufs[n] = neox_onebit_error(o, k % 2, &counts[n]);
        else if (k >= 4 && x->powersgd) bufs[n] = neox_powersgd_state(x->powersgd, k % 2, &counts[n]);
        else continue;
        names[n++] = what[k];
    }
    return n;
}

json_t *neox_grad_exchange_state(const neox_grad_exchange *x) { return neox_adaptive_run_state(x->adaptive); }

int neox_grad_exchange_restore(neox_grad_exchange *x, json_t *state, const char *dir, neox_error *err) {
    return x->adaptive ? neox_adaptive_run_restore(x->adaptive, state, dir, err) : 0;
}
