// grad_reducer.c: data-parallel gradient reduction in buckets that start while backward is still
// running (see gradient.h). A bucket is a contiguous range of the flat gradient buffer; under ZeRO
// stages 1 and 2 its reduce-scatter splits it at the partition boundaries, which are contiguous too,
// so every rank receives exactly the part of the bucket inside its own partition. Across nodes,
// stage 0 can sum each bucket with the hierarchical all-reduce instead (hierarchical.c).
//
// Under ZeRO-2 (options.partition_sum) every bucket starts when its parameters are ready, with or
// without overlap (without, it is waited for at once), and lands as soon as it completes: its part
// of this rank's partition is added to partition_sum and the bucket's range is cleared. On the host
// the cleared range's pages go back to the system, so gradient memory per rank is the partition
// plus the buckets in flight rather than the whole model. There the buckets are cut at exactly
// bucket_bytes across tensors, readiness is counted in elements (a large tensor made in pieces
// reports each piece), and one bucket is in flight at a time (its MPI temporaries too).
//
// On the host a collective's MPI temporaries (the size of its bucket) are touched while MPICH works
// on it, and MPICH works through the collectives in flight in turn: the memory plan counts the
// largest bucket's (neox_grad_reducer_scratch_bytes), and the reducer reports the most elements it
// had in flight at once. (Bounding the elements in flight instead, by waiting before a bucket
// starts, made backward wait on the link: up to 20% slower steps with overlap_comm at 1 Gbit/s.)
//
// With options.progress_interval a progress thread (lib/parallel/progress_thread.c) also tests the
// buckets in flight while backward computes, so a slow link keeps moving between backward's polls.
// It only tests (and starts the next step of a hierarchical chain); landing a completed bucket is
// compute, left to the main thread's next poll or finish. Everything the two threads share is
// guarded by the thread's mutex; finish disarms the thread before it waits.
//
// It also times its own communication calls for the benchmark (neox_grad_reducer_timing): per
// reduction (one finish), the seconds spent in finish's calls and in the calls made during backward.
// A rank that reaches finish before its peers waits there for them to finish their backward, which
// is load imbalance, not communication; the rank that arrives last waits only for communication,
// so the minimum over the data group of each reduction's finish time is its exposed communication.
//
// On the device (options.backend with on_device, the data group on NCCL) the same plan runs on
// device buffers: scaling and the 16-bit wire casts are the backend's ops, queued on its stream in
// order with the collectives (nccl.c), and the reduce-scatter reduces each rank's part in place
// instead of moving it to the bucket's start. The times above are then host time spent issuing
// and waiting (the host does not wait for the GPU), not the GPU's communication time.
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "kernels/kernels.h"
#include "gradient.h"

typedef struct bucket {
    size_t begin, end;   // range of the flat buffer
    int64_t pending;     // elements not yet reported ready this step
    int started;
    int landed;          // ZeRO-2: reduced, added to partition_sum and cleared this reduction
    int skip;            // reduced by the caller this step (set_bucket): never started here
    neox_dtype wire;     // its wire format: fp32, or a 16-bit copy in r->wire
    double ready_at;     // when its last parameter became ready this reduction (0: not reported)
    double slack_s;      // at the last finish: seconds between ready_at and the finish (0: not reported)
    int *counts;         // ZeRO: elements of the bucket in each rank's partition
    neox_request req;
    neox_hier_request hier;  // the hierarchical all-reduce's chain (stage 0 across nodes)
} bucket;

// Per-reduction times not yet combined over the data group, folded into totals when full.
enum { HISTORY = 1024 };

struct neox_grad_reducer {
    neox_comm *data;
    float *grads;
    size_t n;
    neox_grad_reducer_options opt;
    const neox_backend *be;      // where the gradients live: scaling and casts are its ops
    uint16_t *wire;      // 16-bit communication: the buckets' wire copies, parallel to grads (lazily)
    bucket *buckets;
    int nbuckets;
    size_t *param_begin, *param_end;  // parameter -> its range of the flat buffer
    double during;       // seconds in calls during backward (starts, progress) this reduction
    double history[2][HISTORY];  // per reduction: [0] finish's calls, [1] those + during
    int nhistory;
    neox_grad_reducer_timing timing;
    int eager;           // buckets start as they become ready (overlap, or ZeRO-2)
    // Hierarchical buckets in the order they started; chains run one at a time from hier_head, so
    // that every rank issues their node-group collectives in the same order.
    int *hier_order, hier_started, hier_head, hier_running;
    neox_progress_thread *thread;  // NULL without options.progress_interval
    int *flying, nflying;  // host: buckets started whose collective may still run, in start order
};

static int hierarchical(const neox_grad_reducer *r) {
    return r->opt.zero_stage == 0 && r->opt.hier_intra && r->opt.hier_intra->size > 0;
}

void neox_grad_reducer_partition(const neox_grad_reducer *r, int rank, size_t *begin, size_t *end) {
    // As checkpoints cut flat buffers over data ranks (and neox-convert reshard --dp writes them).
    neox_even_share(r->n, rank, r->data->size, begin, end);
}

static void scale(neox_grad_reducer *r, float *x, size_t n, float factor) {
    if (factor != 1.0f) r->be->scale(x, n, factor);
}

// Device gradients need a device communicator on every group the reducer uses (MPI here cannot read
// device memory); the trainer's set-up gives every group one (neox_grid_enable_device, or
// neox_grid_enable_emulated) before it makes a reducer.
static void check_device_groups(const neox_grad_reducer *r) {
    const neox_comm *groups[] = {r->data, r->opt.hier_intra, r->opt.hier_inter};
    for (int i = 0; i < 3; i++)
        neox_assert(!groups[i] || groups[i]->size == 0 || groups[i]->device,
                    "gradient reducer: the gradients are device memory but group %s has no device communicator "
                    "(neox_grid_enable_device or neox_grid_enable_emulated makes them)", groups[i]->name);
}

static void hier_pump(neox_grad_reducer *r, int wait);

// The progress thread's poll (mutex held): test what is in flight, land nothing.
static void thread_poll(void *ctx) {
    neox_grad_reducer *r = ctx;
    double t0 = neox_now();
    if (hierarchical(r)) hier_pump(r, 0);
    for (int i = 0; i < r->nbuckets; i++)
        if (r->buckets[i].started && !r->buckets[i].landed) neox_test(&r->buckets[i].req);
    r->timing.thread_seconds += neox_now() - t0;
}

static void lock(neox_grad_reducer *r) {
    if (r->thread) neox_progress_thread_lock(r->thread);
}
static void unlock(neox_grad_reducer *r) {
    if (r->thread) neox_progress_thread_unlock(r->thread);
}

// Under ZeRO-2 and 3 on the host a bucket's pages are given back as soon as it lands, so no
// bucket may be larger than reduce_bucket_size elements: the buffer is cut into ranges of exactly
// that many from its end (backward's order), whatever the tensors, and a large tensor spans
// several. The other stages keep whole tensors per bucket: their buffer is whole anyway, and the
// compressors that take a bucket over (stage 0) work on whole tensors.
static int split_buckets(const neox_grad_reducer *r) {
    return r->opt.partition_sum && r->opt.bucket_bytes > 0 && !r->be->on_device;
}

static size_t largest_bucket(const neox_grad_reducer *r) {
    size_t largest = 0;
    for (int i = 0; i < r->nbuckets; i++)
        if (r->buckets[i].end - r->buckets[i].begin > largest) largest = r->buckets[i].end - r->buckets[i].begin;
    return largest;
}

static void make_split_buckets(neox_grad_reducer *r) {
    size_t limit = r->opt.bucket_bytes / sizeof(float) ? r->opt.bucket_bytes / sizeof(float) : 1;
    size_t count = r->n ? (r->n + limit - 1) / limit : 1;
    r->buckets = neox_calloc(count, sizeof(bucket));
    for (size_t hi = r->n; hi > 0; hi = r->buckets[r->nbuckets++].begin) {
        bucket *b = &r->buckets[r->nbuckets];
        b->end = hi, b->begin = hi > limit ? hi - limit : 0;
    }
}

// Buckets of whole tensors, filled from the last (backward finishes it first) until a bucket
// reaches bucket_bytes.
static void make_tensor_buckets(neox_grad_reducer *r, const size_t *param_offset, const size_t *param_size,
                                int nparams) {
    r->buckets = neox_calloc(nparams ? nparams : 1, sizeof(bucket));
    for (int p = nparams - 1; p >= 0; p--) {
        bucket *b = &r->buckets[r->nbuckets ? r->nbuckets - 1 : 0];
        int fresh = r->nbuckets == 0 ||
                    (r->opt.bucket_bytes > 0 && (b->end - b->begin) * sizeof(float) >= r->opt.bucket_bytes);
        if (fresh) {
            b = &r->buckets[r->nbuckets++];
            b->end = param_offset[p] + param_size[p];
        }
        b->begin = param_offset[p];
    }
}

// A progress thread calls MPI beside the main thread, which only MPI_THREAD_MULTIPLE allows; an MPI
// library that does not grant it is the environment's limit, refused before anything is made.
static int check_thread_level(neox_comm *data, const neox_grad_reducer_options *opt, neox_error *err) {
    int on_device = opt->backend && opt->backend->on_device;
    if (opt->progress_interval > 0 && opt->overlap && !on_device && data->size > 1 && !neox_parallel_thread_multiple())
        return neox_fail(err, NEOX_EXIT_FAILURE, "comm_progress_thread_us: the progress thread needs MPI_THREAD_MULTIPLE, "
                         "which this MPI library does not grant; set comm_progress_thread_us: 0");
    return 0;
}

neox_grad_reducer *neox_grad_reducer_make(neox_comm *data, float *grads, size_t n, const size_t *param_offset,
                                          const size_t *param_size, int nparams, const neox_grad_reducer_options *opt,
                                          neox_error *err) {
    for (int p = 0; p + 1 < nparams; p++)
        neox_assert(param_offset[p] + param_size[p] == param_offset[p + 1],
                    "gradient buffer: parameter %d does not follow parameter %d", p + 1, p);
    if (check_thread_level(data, opt, err) != 0) return NULL;
    neox_grad_reducer *r = neox_calloc(1, sizeof *r);
    r->data = data, r->grads = grads, r->n = n, r->opt = *opt;
    if (r->opt.predivide_factor <= 0) r->opt.predivide_factor = 1.0;
    if (r->opt.zero_stage == 0) r->opt.all_reduce = 1;
    if (r->opt.zero_stage < 2) r->opt.partition_sum = NULL;
    r->eager = r->opt.overlap || r->opt.partition_sum;
    r->be = opt->backend ? opt->backend : neox_backend_cpu();
    if (r->be->on_device) check_device_groups(r);
    if (r->opt.wire != NEOX_BF16 && r->opt.wire != NEOX_F16) r->opt.wire = NEOX_F32;
    else r->wire = r->be->alloc((n ? n : 1) * sizeof(uint16_t));
    r->param_begin = neox_calloc(nparams ? nparams : 1, sizeof(size_t));
    r->param_end = neox_calloc(nparams ? nparams : 1, sizeof(size_t));
    for (int p = 0; p < nparams; p++) r->param_begin[p] = param_offset[p], r->param_end[p] = param_offset[p] + param_size[p];
    r->hier_order = neox_calloc(nparams ? nparams : 1, sizeof(int));
    if (split_buckets(r)) make_split_buckets(r);
    else make_tensor_buckets(r, param_offset, param_size, nparams);
    r->flying = neox_calloc((size_t)r->nbuckets + 1, sizeof(int));
    for (int i = 0; i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        b->pending = (int64_t)(b->end - b->begin);
        b->wire = r->opt.wire;
        if (r->opt.all_reduce) continue;
        b->counts = neox_calloc(data->size, sizeof(int));
        for (int q = 0; q < data->size; q++) {
            size_t lo, hi;
            neox_grad_reducer_partition(r, q, &lo, &hi);
            b->counts[q] = neox_overlap(lo, hi, b->begin, b->end, &lo, &hi) ? (int)(hi - lo) : 0;
        }
    }
    if (opt->progress_interval > 0 && opt->overlap && !r->be->on_device && data->size > 1)
        r->thread = neox_progress_thread_start(thread_poll, r, opt->progress_interval);
    return r;
}

void neox_grad_reducer_free(neox_grad_reducer *r) {
    if (!r) return;
    neox_progress_thread_stop(r->thread);
    for (int i = 0; i < r->nbuckets; i++) free(r->buckets[i].counts);
    free(r->buckets);
    free(r->flying);
    free(r->param_begin);
    free(r->param_end);
    free(r->hier_order);
    if (r->wire) r->be->free(r->wire);
    free(r);
}

int neox_grad_reducer_bucket_count(const neox_grad_reducer *r) { return r->nbuckets; }

size_t neox_grad_reducer_size(const neox_grad_reducer *r) { return r->n; }

size_t neox_grad_reducer_resident_bytes(const neox_grad_reducer *r) {
    if (!r->opt.partition_sum || r->be->on_device) return r->n * sizeof(float);
    size_t largest = largest_bucket(r);
    // Split buckets: the one in flight, the one filling (its finished part) and what the product
    // running meanwhile writes past it.
    size_t resident = split_buckets(r) ? 2 * largest + r->opt.fill_elems : 2 * largest;
    return (resident < r->n ? resident : r->n) * sizeof(float);
}

size_t neox_grad_reducer_scratch_bytes(const neox_grad_reducer *r) {
    if (r->be->on_device || r->data->size < 2) return 0;
    // MPICH works through the collectives in flight in turn, and the one it works on holds two
    // temporaries the size of its bucket in the wire format (its recursive-halving reduce-scatter
    // receives into one and sums into another; the all-reduce's first phase likewise). Measured
    // within this at every stage, whole-tensor buckets all started at once included:
    // tests/mpi/memory.sh, bench/memory.sh (a).
    return 2 * largest_bucket(r) * neox_dtype_size(r->opt.wire);
}

size_t neox_grad_reducer_wire_bytes(const neox_grad_reducer *r) { return r->wire ? (r->n ? r->n : 1) * sizeof(uint16_t) : 0; }

void neox_grad_reducer_set_bucket(neox_grad_reducer *r, int i, int skip, neox_dtype wire) {
    neox_assert(i >= 0 && i < r->nbuckets, "gradient reducer: no bucket %d (of %d)", i, r->nbuckets);
    // (The trainer's set-up refuses compression above ZeRO stage 0.)
    neox_assert(!skip || r->opt.zero_stage == 0, "gradient reducer: a bucket reduced elsewhere needs whole replicas (ZeRO stage 0)");
    if (wire != NEOX_BF16 && wire != NEOX_F16) wire = NEOX_F32;
    if (wire != NEOX_F32 && !r->wire) r->wire = r->be->alloc((r->n ? r->n : 1) * sizeof(uint16_t));
    r->buckets[i].skip = skip, r->buckets[i].wire = wire;
}

void neox_grad_reducer_bucket_range(const neox_grad_reducer *r, int i, size_t *begin, size_t *end, double *slack_s) {
    *begin = r->buckets[i].begin, *end = r->buckets[i].end;
    if (slack_s) *slack_s = r->buckets[i].slack_s;
}

// The buffer the collective works on: the gradients themselves (fp32), or their 16-bit wire copy.
static void *wire_of(neox_grad_reducer *r, const bucket *b, size_t at) {
    return b->wire != NEOX_F32 ? (void *)(r->wire + at) : (void *)(r->grads + at);
}

// fp32 gradients into the 16-bit wire copy and back, on the host or the device.
static void to_wire(neox_grad_reducer *r, const bucket *b, size_t at, size_t count) {
    uint16_t *w = r->wire + at;
    const float *x = r->grads + at;
    if (b->wire == NEOX_BF16) r->be->cast_f32_to_bf16(w, x, count);
    if (b->wire == NEOX_F16) r->be->cast_f32_to_f16(w, x, count);
}
static void from_wire(neox_grad_reducer *r, const bucket *b, size_t to, size_t from, size_t count) {
    float *x = r->grads + to;
    const uint16_t *w = r->wire + from;
    if (b->wire == NEOX_BF16) r->be->cast_bf16_to_f32(x, w, count);
    if (b->wire == NEOX_F16) r->be->cast_f16_to_f32(x, w, count);
}

// Where this rank's part of bucket b starts, relative to the bucket (its length is b->counts[rank]).
static size_t own_offset(const neox_grad_reducer *r, const bucket *b) {
    size_t lo, hi;
    neox_grad_reducer_partition(r, r->data->rank, &lo, &hi);
    lo = lo < b->begin ? b->begin : lo > b->end ? b->end : lo;
    return lo - b->begin;
}

// ---- collectives in flight (the report's peak_inflight_elements) ------------------------------
// Elements of the buckets whose collective still runs (tested now: a test completes it when it can);
// the completed leave the list, so each call costs what is in flight, not the bucket count.
static size_t running_elems(neox_grad_reducer *r) {
    size_t n = 0;
    int kept = 0;
    for (int k = 0; k < r->nflying; k++) {
        bucket *b = &r->buckets[r->flying[k]];
        if (neox_test(&b->req)) continue;
        r->flying[kept++] = r->flying[k];
        n += b->end - b->begin;
    }
    r->nflying = kept;
    return n;
}

// Moves the hierarchical chains on as far as they go without waiting: the running one is tested,
// and when it completes the next started bucket's chain begins (wait: until all have completed).
static void hier_pump(neox_grad_reducer *r, int wait) {
    while (r->hier_head < r->hier_started) {
        bucket *b = &r->buckets[r->hier_order[r->hier_head]];
        if (!r->hier_running) {
            neox_hier_iallreduce_sum(r->opt.hier_intra, r->opt.hier_inter, wire_of(r, b, b->begin), b->end - b->begin,
                                     b->wire, &b->hier);
            r->hier_running = 1;
        }
        if (wait) neox_hier_wait(&b->hier);
        else if (!neox_hier_test(&b->hier)) return;
        r->hier_running = 0, r->hier_head++;
    }
}

// Returns the seconds spent in the communication call.
static double start_bucket(neox_grad_reducer *r, bucket *b) {
    float *x = r->grads + b->begin;
    size_t len = b->end - b->begin;
    if (!r->be->on_device && !hierarchical(r)) {  // (device collectives run in stream order; chains one at a time)
        int64_t inflight = (int64_t)(running_elems(r) + len);
        if (inflight > r->timing.peak_inflight_elements) r->timing.peak_inflight_elements = inflight;
        r->flying[r->nflying++] = (int)(b - r->buckets);
    }
    scale(r, x, len, (float)(1.0 / r->opt.predivide_factor));
    if (b->wire != NEOX_F32) to_wire(r, b, b->begin, len);
    void *w = wire_of(r, b, b->begin);
    double t0 = neox_now();
    if (hierarchical(r) && r->be->on_device)  // NCCL's calls are queued on the stream: no chain to pump
        neox_hier_allreduce_sum(r->opt.hier_intra, r->opt.hier_inter, w, len, b->wire);
    else if (hierarchical(r)) r->hier_order[r->hier_started++] = (int)(b - r->buckets), hier_pump(r, 0);
    else if (r->opt.all_reduce) neox_iallreduce_sum(r->data, w, len, b->wire, &b->req);
    // On the device each rank's sum lands where it belongs (NCCL reduces in place); on the host
    // (MPI_IN_PLACE) at the start of the bucket, and finish moves it home.
    else if (r->be->on_device)
        neox_ireduce_scatterv_sum(r->data, w, (char *)w + own_offset(r, b) * neox_dtype_size(b->wire), b->counts,
                                  b->wire, &b->req);
    else neox_ireduce_scatterv_sum(r->data, MPI_IN_PLACE, w, b->counts, b->wire, &b->req);
    b->started = 1;
    return neox_now() - t0;
}

// After the wait: count reduced elements at wire position `from` become fp32 gradients at `to`.
static void land(neox_grad_reducer *r, const bucket *b, size_t to, size_t from, size_t count) {
    if (b->wire != NEOX_F32) from_wire(r, b, to, from, count);
    else if (to != from) memmove(r->grads + to, r->grads + from, count * sizeof(float));  // host only: device parts are home
    scale(r, r->grads + to, count, (float)(r->opt.predivide_factor / (r->opt.mean_over > 0 ? r->opt.mean_over : r->data->size)));
}

// This rank's part of a reduced bucket becomes fp32 mean gradients: where the reduce-scatter left
// it (the bucket's start on the host, in place on the device), or in place after an all-reduce
// (reduce_scatter false). Under ZeRO-2 it is then added to partition_sum and the bucket cleared.
static void land_own_part(neox_grad_reducer *r, bucket *b) {
    size_t mine_lo, mine_hi, lo, hi;
    neox_grad_reducer_partition(r, r->data->rank, &mine_lo, &mine_hi);
    int mine = neox_overlap(mine_lo, mine_hi, b->begin, b->end, &lo, &hi);
    if (mine) land(r, b, lo, r->opt.all_reduce || r->be->on_device ? lo : b->begin, hi - lo);
    if (!r->opt.partition_sum) return;
    if (mine) r->be->add_inplace(r->opt.partition_sum + (lo - mine_lo), r->grads + lo, hi - lo);
    if (r->be->on_device) r->be->memset_zero(r->grads + b->begin, (b->end - b->begin) * sizeof(float));
    else r->be->release(r->grads + b->begin, (b->end - b->begin) * sizeof(float));
    b->landed = 1;
}

// Under split buckets on the host, one bucket in flight at a time: a bucket that becomes ready
// first lands the one before it, so the gradient memory is the bucket in flight and the one filling,
// and so is MPI's scratch for the reduce-scatter (its temporaries are the size of the bucket).
// Returns the seconds spent waiting.
static double land_in_flight(neox_grad_reducer *r) {
    double seconds = 0.0;
    for (int i = 0; split_buckets(r) && i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        if (!b->started || b->landed || b->skip) continue;
        double t0 = neox_now();
        neox_wait(&b->req);
        seconds += neox_now() - t0;
        land_own_part(r, b);
    }
    return seconds;
}

// Every element of bucket b is final: its reduction starts (eager) or waits for finish.
static void bucket_ready(neox_grad_reducer *r, bucket *b) {
    b->ready_at = neox_now();
    if (!r->eager || b->started || b->skip) return;
    lock(r);
    r->during += land_in_flight(r);
    r->during += start_bucket(r, b);
    if (r->thread) neox_progress_thread_arm(r->thread);
    unlock(r);
    if (r->opt.overlap) return;
    // ZeRO-2 without overlap: reduce now, so the bucket's memory is free before the next one fills.
    double t0 = neox_now();
    neox_wait(&b->req);
    r->during += neox_now() - t0;
    land_own_part(r, b);
}

void neox_grad_reducer_ready_range(neox_grad_reducer *r, size_t begin, size_t end) {
    if (begin >= end) return;
    // Buckets run from the end of the buffer down: the first whose start is below `end` holds end - 1.
    int lo = 0, hi = r->nbuckets;
    while (lo < hi) {
        int mid = (lo + hi) / 2;
        if (r->buckets[mid].begin < end) hi = mid;
        else lo = mid + 1;
    }
    for (int i = lo; i < r->nbuckets && r->buckets[i].end > begin; i++) {
        bucket *b = &r->buckets[i];
        size_t a, z;
        if (!neox_overlap(begin, end, b->begin, b->end, &a, &z)) continue;
        b->pending -= (int64_t)(z - a);
        if (b->pending == 0) bucket_ready(r, b);
    }
}

void neox_grad_reducer_ready(neox_grad_reducer *r, int p) {
    neox_grad_reducer_ready_range(r, r->param_begin[p], r->param_end[p]);
}

void neox_grad_reducer_progress(neox_grad_reducer *r) {
    // A device's collectives progress on their own stream; testing one would make the emulated
    // device run it now, ahead of the compute it overlaps (and, landing it, ahead of its wait).
    if (r->be->on_device) return;
    lock(r);
    double t0 = neox_now();
    if (hierarchical(r)) hier_pump(r, 0);
    for (int i = 0; i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        if (!b->started || b->landed) continue;
        if (neox_test(&b->req) && r->opt.partition_sum) land_own_part(r, b);
    }
    r->during += neox_now() - t0;
    unlock(r);
}

// Folds the per-reduction history into the totals: the minimum over the data group of each
// reduction's times (an allreduce of the history, not counted in the communication statistics:
// it measures, it is not training traffic; bounded by comm_timeout_seconds like the rest).
static void fold_history(neox_grad_reducer *r) {
    if (r->nhistory == 0) return;
    int n = r->nhistory;
    double least[2 * HISTORY];  // both histories in one call: [0, n) then [n, 2n)
    memcpy(least, r->history[0], (size_t)n * sizeof *least);
    memcpy(least + n, r->history[1], (size_t)n * sizeof *least);
    neox_allreduce_min_uncounted(r->data, least, 2 * n);
    for (int i = 0; i < n; i++) {
        r->timing.exposed_seconds += least[i];
        r->timing.exposed_with_progress_seconds += least[n + i];
    }
    r->nhistory = 0;
}

static void record(neox_grad_reducer *r, double finish_seconds) {
    r->timing.reductions++;
    r->timing.finish_seconds += finish_seconds;
    r->timing.progress_seconds += r->during;
    r->history[0][r->nhistory] = finish_seconds;
    r->history[1][r->nhistory] = finish_seconds + r->during;
    r->during = 0.0;
    if (++r->nhistory == HISTORY) fold_history(r);
}

neox_grad_reducer_timing neox_grad_reducer_timing_of(neox_grad_reducer *r) {
    fold_history(r);
    lock(r);
    if (r->thread) r->timing.thread_polls = neox_progress_thread_polls(r->thread);
    neox_grad_reducer_timing timing = r->timing;
    unlock(r);
    return timing;
}

double neox_grad_reducer_progress_seconds(neox_grad_reducer *r) {
    lock(r);
    double seconds = r->timing.progress_seconds;
    unlock(r);
    return seconds;
}

// The buckets backward started whose collective still runs as it ends (see the timing's
// pending_at_backward_end). A device request is not tested (that would drain it): issued and not
// waited for is running. Hierarchical chains on the host: those not yet pumped past; on the device
// they are blocking calls, which the compute stream waits for (none overlaps).
static int64_t still_running(neox_grad_reducer *r) {
    if (hierarchical(r)) return r->be->on_device ? 0 : r->hier_started - r->hier_head;
    int64_t n = 0;
    for (int i = 0; i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        if (b->started && !b->landed) n += r->be->on_device || !neox_test(&b->req);
    }
    return n;
}

void neox_grad_reducer_finish(neox_grad_reducer *r) {
    if (r->thread) {  // from here on the main thread alone touches the buckets
        neox_progress_thread_lock(r->thread);
        neox_progress_thread_disarm(r->thread);
        neox_progress_thread_unlock(r->thread);
    }
    r->timing.pending_at_backward_end += still_running(r);
    double seconds = 0.0, finish_at = neox_now();
    for (int i = 0; i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        // What backward had left to run when the bucket was ready: the time its transfer could hide in.
        b->slack_s = b->ready_at > 0 ? finish_at - b->ready_at : 0.0;
        b->ready_at = 0;
        // With overlap every parameter is reported ready exactly once per reduction (a bucket
        // reported too often would have started before its gradients were final): the caller's
        // promise, so a miss is a bug.
        neox_assert(!r->eager || b->pending == 0, "gradient reducer: bucket %d (elements %zu-%zu) had %lld element(s) %s ready",
                    i, b->begin, b->end, (long long)llabs(b->pending),
                    b->pending > 0 ? "never reported" : "reported more than once");
        if (b->started || b->skip) continue;
        seconds += land_in_flight(r);
        seconds += start_bucket(r, b);
    }
    if (hierarchical(r)) {  // the chains complete in the order they started
        double t0 = neox_now();
        hier_pump(r, 1);
        seconds += neox_now() - t0;
        r->hier_started = r->hier_head = 0;
    }
    for (int i = 0; i < r->nbuckets; i++) {
        bucket *b = &r->buckets[i];
        if (!b->landed && !b->skip) {
            double t0 = neox_now();
            neox_wait(&b->req);
            seconds += neox_now() - t0;
            if (r->opt.zero_stage == 0) land(r, b, b->begin, b->begin, b->end - b->begin);
            else land_own_part(r, b);
        }
        b->started = b->landed = 0;
        b->pending = (int64_t)(b->end - b->begin);
    }
    r->nflying = 0;  // (every collective waited for above)
    record(r, seconds);
}
