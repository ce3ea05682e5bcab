// gradient.h: the gradient-reduction layer, over the communication layer (parallel.h): the
// data-parallel gradient reducer (buckets in backward order, overlapped with backward, ZeRO's
// reduce-scatter into partitions, 16-bit wire formats), and the compressed all-reduces with error
// feedback that replace its plain all-reduce (1-bit signs, PowerSGD), plus sparse embedding rows;
// and the gradient exchange, the one owner of how a rank's gradients cross the data group, which
// composes them (neox_grad_exchange, at the end). Element work (scaling, casts, the compressors'
// compute, the sparse rows' sums) goes through the backend table the gradients live on, so the same
// code reduces host and device gradients. docs/parallel.md and docs/communication.md.
#ifndef NEOX_GRADIENT_H
#define NEOX_GRADIENT_H

#include <stdio.h>

#include "parallel.h"

struct json_t;  // (jansson's; only the exchange's state and report use it)

// ---- data-parallel gradient reduction ---------------------------------------------------------
// Gradients live in one flat buffer; parameters occupy [offset, offset + size) ranges of it.
// Buckets group parameters in the order backward finishes them (last parameter first) up to
// bucket_bytes; under ZeRO-2 and 3 on the host they are instead cut at exactly bucket_bytes from
// the end of the buffer, so a tensor larger than that spans several buckets and each starts as soon
// as its own range is final (ready_range), with one bucket in flight at a time. When every element
// of a bucket is marked ready, its reduction starts without blocking (overlap), so communication
// runs behind the rest of backward. ZeRO stage 0 all-reduces;
// stages 1 and 2 reduce-scatter, so each rank receives the reduced values of its own partition
// only: the flat buffer cut into data_size contiguous parts, [n*r/size, n*(r+1)/size) for rank r.
typedef struct neox_grad_reducer neox_grad_reducer;

typedef struct neox_grad_reducer_options {
    size_t bucket_bytes;      // reduce_bucket_size x 4; 0 = one bucket
    int zero_stage;           // 0: all-reduce; 1, 2, 3: reduce-scatter into partitions
    int overlap;              // start buckets as they complete (overlap_comm); else all at finish
    double predivide_factor;  // gradient_predivide_factor: scale by 1/f before, f/data_size after
    int all_reduce;           // stages 1, 2 with reduce_scatter false: all-reduce, keep the partition
    // communication_data_type: NEOX_F32 (0, the default), or NEOX_BF16 / NEOX_F16: each bucket is
    // cast into a 16-bit wire buffer, summed in fp32 by the collective, rounded, and cast back.
    neox_dtype wire;
    // Stage 0 only: when set (size > 0), each bucket is summed by the hierarchical all-reduce over
    // these groups (blocking, when the bucket starts) instead of the flat all-reduce.
    neox_comm *hier_intra, *hier_inter;
    // The backend the gradients live on; NULL or one with on_device 0: host memory (MPI). On the
    // device (NCCL on the data group): predivide scaling and the 16-bit wire casts run as the
    // backend's scale and cast ops on its stream, and ZeRO's reduce-scatter leaves each rank's
    // part where it belongs (no move).
    const struct neox_backend *backend;
    // ZeRO-2 and 3 (stages 2 and 3 only): this rank's partition of the summed gradients, part_end - part_begin
    // floats on the gradients' backend. Every bucket starts as soon as its parameters are ready
    // (waited for at once when overlap is off); as it completes, its reduced part inside the
    // partition is added here and the bucket's range of the flat buffer is cleared (on the host,
    // its pages are given back), so the flat buffer only holds the buckets in flight.
    float *partition_sum;
    // With overlap on the host: seconds between the polls of a progress thread that tests the
    // buckets in flight (and moves hierarchical chains on) while backward computes, besides
    // backward's own polls between operations; 0: no thread. Needs MPI_THREAD_MULTIPLE.
    double progress_interval;
    // The mean divides the sum by this many ranks (0: the group's size; 1: the sum, for gradients
    // that arrive pre-scaled, as a training run's do: neox_grad_exchange's).
    // Averaging expert parallelism's experts, reduced over the ranks holding them, takes the whole
    // data group's size.
    int mean_over;
    // ZeRO-2 and 3 on the host: the most gradient elements one product of backward writes at once
    // (the largest tensor computed whole); with the two buckets it sizes the resident gradients.
    size_t fill_elems;
} neox_grad_reducer_options;

// NULL with *err filled when the environment cannot give what opt asks for (a progress thread under
// an MPI library without MPI_THREAD_MULTIPLE).
neox_grad_reducer *neox_grad_reducer_make(neox_comm *data, float *grads, size_t n, const size_t *param_offset,
                                          const size_t *param_size, int nparams, const neox_grad_reducer_options *opt,
                                          neox_error *err);
void neox_grad_reducer_free(neox_grad_reducer *r);
// The rank's partition of the flat buffer under ZeRO: [*begin, *end).
void neox_grad_reducer_partition(const neox_grad_reducer *r, int rank, size_t *begin, size_t *end);
// Parameter p's gradient is final for this step.
void neox_grad_reducer_ready(neox_grad_reducer *r, int p);
// Elements [begin, end) of the flat buffer are final for this step (a part of a large tensor
// computed in pieces; every element is reported once per step, by this or by ready).
void neox_grad_reducer_ready_range(neox_grad_reducer *r, size_t begin, size_t end);
// Lets MPI progress the buckets in flight (call now and then during backward).
void neox_grad_reducer_progress(neox_grad_reducer *r);
// Starts what has not started, waits for everything and averages (divides by mean_over).
// Afterwards the buffer holds the mean gradient over data-parallel ranks (stage 0), or this rank's
// partition does (stage 1 and stage 2 without partition_sum; the rest of the buffer is
// unspecified), or (partition_sum) the mean is added to partition_sum and the buffer is all zeros.
// Resets for the next step.
void neox_grad_reducer_finish(neox_grad_reducer *r);
int neox_grad_reducer_bucket_count(const neox_grad_reducer *r);
// Bucket i (0: the first backward finishes) from the next reduction on: skip 1, the reducer leaves
// it alone (the caller reduces its range itself: a compressor; ZeRO stage 0 only); else it is
// summed with this wire format (NEOX_F32, NEOX_BF16, NEOX_F16), whatever the options said.
void neox_grad_reducer_set_bucket(neox_grad_reducer *r, int i, int skip, neox_dtype wire);
// Bucket i's range [*begin, *end) of the flat buffer, and (slack_s, may be NULL) the seconds between
// its last parameter being reported ready and the last finish: the backward time its transfer could
// hide behind (0 when nothing was reported: overlap off).
void neox_grad_reducer_bucket_range(const neox_grad_reducer *r, int i, size_t *begin, size_t *end, double *slack_s);
// Elements of the flat buffer the reducer covers.
size_t neox_grad_reducer_size(const neox_grad_reducer *r);
// Bytes of the flat buffer that hold gradients at a time: all of it, except under ZeRO-2 and 3 on
// the host, where only the bucket being reduced and the one being filled do, plus fill_elems for
// the product writing past the bucket filling (2 x bucket_bytes + 4 fill_elems, at most the buffer).
size_t neox_grad_reducer_resident_bytes(const neox_grad_reducer *r);
// Bytes of the collective's own temporaries for the bucket in flight under split buckets (ZeRO-2
// and 3 on the host: two of the largest bucket in its wire format), else 0 (not planned).
size_t neox_grad_reducer_scratch_bytes(const neox_grad_reducer *r);
// Bytes of the 16-bit wire copy of the gradients (communication_data_type bf16/fp16), else 0.
size_t neox_grad_reducer_wire_bytes(const neox_grad_reducer *r);

// Seconds the reducer spent in its communication calls, summed over its reductions (finishes).
// finish_seconds: this rank's calls in finish (starting what had not started, waiting), which
// include waiting for peers still in backward; exposed_seconds: per reduction, the least finish
// time over the data group (the last rank to arrive waits only for the communication), summed;
// progress_seconds: this rank's calls during backward (starting buckets, progressing them);
// exposed_with_progress_seconds: as exposed_seconds with the calls during backward added;
// thread_polls, thread_seconds: the progress thread's polls and the time they took (its sleep not
// counted), on this rank; peak_inflight_elements (host): the most elements whose collectives were
// in flight at once, each holding MPI temporaries its size (bounded by the largest bucket);
// pending_at_backward_end: summed over reductions, the buckets whose collective backward had
// started and that were still running when finish began (the overlap achieved: on the host those a
// test did not find complete, on the device those issued and not yet waited for, since testing a
// device request would drain it).
typedef struct neox_grad_reducer_timing {
    int64_t reductions, thread_polls, peak_inflight_elements, pending_at_backward_end;
    double finish_seconds, exposed_seconds, progress_seconds, exposed_with_progress_seconds, thread_seconds;
} neox_grad_reducer_timing;
// Collective over the data group (every rank of it calls it after the same reductions).
neox_grad_reducer_timing neox_grad_reducer_timing_of(neox_grad_reducer *r);
// This rank's progress_seconds so far (not collective): what overlapping has cost its backward.
double neox_grad_reducer_progress_seconds(neox_grad_reducer *r);

// ---- ZeRO-3: parameters partitioned over the data group (param_gather.c) ---------------------
// Each rank keeps its partition [n*r/D, n*(r+1)/D) of the flat parameters (`master`, which the
// optimizer updates); the flat buffer `params` holds whole only the units (groups of parameters:
// the embedding, each layer, the head) in use or about to be. A pass (one micro-batch's forward
// and backward, or a forward) is run between begin, with the order in which it will use the
// units (its trace), and end; acquire gathers a unit (or waits for its prefetch) and starts the
// gathers of the next units, release gives its pages back unless it is used again soon. What is
// whole besides the partition never passes the whole model's elements: the persistent tensors take
// at most half of the elements outside the partition, and the units and pieces gathered at once at
// most the rest and at most max_live (the live bound; a single unit in use larger than it excepted).
typedef struct neox_param_gather neox_param_gather;

typedef struct neox_param_gather_options {
    int64_t prefetch_elems;        // stage3_prefetch_bucket_size: elements gathered ahead at a time (0: none)
    int64_t max_live;              // stage3_max_live_parameters: at most this many gathered at once (< 0: no cap)
    int64_t max_reuse_distance;    // stage3_max_reuse_distance: keep a unit used again within this many elements
    int64_t persistence_threshold; // stage3_param_persistence_threshold: tensors this small stay whole
    int64_t model_persistence_threshold;  // stage3_model_persistence_threshold: at most this many persistent (-1: no cap)
    // [piece_begin[i], piece_end[i]): ranges (the output layer, the input embedding) left out of
    // their units and gathered piece by piece (neox_param_gather_piece), one piece of at most
    // piece_elems elements at a time (at most neox_param_gather_piece_limit); empty ranges: none.
    size_t piece_begin[2], piece_end[2], piece_elems;
    // Called for each range of the flat buffer that became whole (gathered) or was given back.
    void (*gathered)(void *ctx, size_t begin, size_t end);
    void (*released)(void *ctx, size_t begin, size_t end);
    void *ctx;
    // The backend whose memory the flat buffer and the partition are: every access to them goes
    // through its table (on a device, the host may not touch them).
    const struct neox_backend *be;
} neox_param_gather_options;

typedef struct neox_param_gather_stats {
    int64_t gathers;               // unit gathers started (each one all-gather per run of its tensors)
    int64_t prefetched;            // of those, started ahead of their use
    int64_t pieces_prefetched;     // pieces of the untied embedding or output layer gathered ahead (also in the two above)
    int64_t gathered_elements;     // elements gathered by them
    int64_t peak_live_elements;    // most elements of non-persistent units whole at once
    int64_t persistent_elements;   // elements of the persistent tensors (always whole)
} neox_param_gather_stats;

// Units: unit u holds parameters [unit_first[u], unit_first[u + 1]) (nunits + 1 entries), laid out
// back to back in the flat buffer of n elements as param_offset/param_size say.
neox_param_gather *neox_param_gather_make(neox_comm *data, float *params, size_t n, const float *master,
                                          const size_t *param_offset, const size_t *param_size,
                                          const int *unit_first, int nunits, const neox_param_gather_options *opt);
void neox_param_gather_free(neox_param_gather *g);
// A pass that will use the units in the order trace lists them (kept by the caller until end).
void neox_param_gather_begin(neox_param_gather *g, const int *trace, int len);
// Unit u is about to be used (it must be the trace's next): it is whole when this returns.
void neox_param_gather_acquire(neox_param_gather *g, int u);
// The use of unit u is over.
void neox_param_gather_release(neox_param_gather *g, int u);
// A piece [begin, end) of a piece-gathered range is about to be used (use 1: gathered, blocking)
// or its use is over (use 0: given back). Nothing while neox_param_gather_all holds it whole.
void neox_param_gather_piece(neox_param_gather *g, size_t begin, size_t end, int use);
// The pass is over: every non-persistent unit is released (prefetches in flight completed first).
void neox_param_gather_end(neox_param_gather *g);
// Every unit whole (outside passes: for readers of the whole model); end releases them.
void neox_param_gather_all(neox_param_gather *g);
// After an update of master (and at the start): the persistent tensors gathered, blocking.
void neox_param_gather_persistent(neox_param_gather *g);
// The peak of gathered non-persistent elements a pass with this trace reaches (no communication).
size_t neox_param_gather_plan(neox_param_gather *g, const int *trace, int len);
neox_param_gather_stats neox_param_gather_stats_of(const neox_param_gather *g);
// The live bound: the most elements of units and pieces gathered at once (persistent ones aside).
size_t neox_param_gather_live_limit(const neox_param_gather *g);
// The largest piece of an embedding gathered by pieces, for a flat buffer of n elements over
// `ranks` partitions and max_live (< 0: no cap): half the least live bound, so that one piece in
// use and the next gathered ahead fit it. (The bound counts the largest partition's outside
// elements on every rank: the ranks gather alike.)
size_t neox_param_gather_piece_limit(size_t n, int ranks, int64_t max_live);
// Bytes of the collective's temporaries for one unit's gather (or the persistent tensors'), the
// largest; a prefetched unit's gathered beside it is not counted.
size_t neox_param_gather_scratch_bytes(const neox_param_gather *g);

// ---- 1-bit compressed all-reduce with error feedback (onebit.c) ------------------------------
// DeepSpeed's compressed_allreduce (1-bit Adam), for a buffer made of segments (one per tensor)
// laid back to back. Each segment is padded with zeros to a multiple of p x lcm(p, 8) elements
// (p = ranks) and cut into p chunks. Worker phase: x + worker_error is sent as its signs (1 bit per
// element, >= 0 -> 1, most significant bit first) and one scale per segment (its L2 norm /
// sqrt(length)); the worker error keeps what that lost. Rank r is the server of chunk r of every
// segment: it receives the chunk's signs and scales from every rank (one all-to-all), averages
// them, adds its server error, and compresses again with one scale per chunk; an all-gather gives
// everyone every server's signs and scales, and the buffer becomes their decompression. Both
// messages are bytes: packed signs followed by the float scales.
typedef struct neox_onebit neox_onebit;

// Its error buffers and messages live on be (NULL: the CPU table), whose ops do the compression; the
// buffers it reduces must be be's memory too.
neox_onebit *neox_onebit_make(neox_comm *c, const struct neox_backend *be, const size_t *seg_size, int nseg);
void neox_onebit_free(neox_onebit *o);
// buf (the sum of the segment sizes) becomes the compressed average over the ranks.
void neox_onebit_allreduce(neox_onebit *o, float *buf);
// The error buffers (be's memory): worker (padded segments back to back) and server (this rank's
// chunk of each).
float *neox_onebit_error(neox_onebit *o, int server, size_t *count);
void neox_onebit_reset(neox_onebit *o);
// Bytes this rank sends per call (the all-to-all's and the all-gather's p - 1 blocks each).
double neox_onebit_wire_bytes(const neox_onebit *o);
// Hands the error back to the next uncompressed average and clears it: buf (this rank's next
// gradients, before they are averaged over the p ranks) gains the worker error and p x the server
// error of the chunks this rank serves, so the average gains exactly what the compression owed.
void neox_onebit_flush(neox_onebit *o, float *buf);
// The same three on segments [first, first + count) only (buf: the whole buffer, as above): their
// own message, their own error; the other segments are left as they are.
void neox_onebit_allreduce_range(neox_onebit *o, float *buf, int first, int count);
void neox_onebit_flush_range(neox_onebit *o, float *buf, int first, int count);
double neox_onebit_wire_bytes_range(const neox_onebit *o, int first, int count);

// ---- PowerSGD low-rank compressed all-reduce with error feedback (powersgd.c) ----------------
// A buffer of segments back to back, segment s a rows[s] x cols[s] row-major matrix (a vector:
// rows 1). Matrices are approximated with the given rank (one power iteration per call, warm
// started from the last call's Q; error feedback per rank); vectors and matrices too small for the
// rank to pay are averaged exactly. Two all-reduces per call. The rank can change per range of
// segments (set_rank) between min_rank and rank: the state has room for every matrix that pays at
// min_rank, with Q at the largest rank (min_rank = rank: the fixed-rank layout).
typedef struct neox_powersgd neox_powersgd;

// Its error, Q and messages live on be (NULL: the CPU table), whose ops (gemm_ex, the Gram-Schmidt,
// the error-feedback adds) do the work; the buffers it reduces must be be's memory too.
neox_powersgd *neox_powersgd_make(neox_comm *c, const struct neox_backend *be, const int *rows, const int *cols,
                                  int nseg, int rank);
neox_powersgd *neox_powersgd_make_ranks(neox_comm *c, const struct neox_backend *be, const int *rows, const int *cols,
                                        int nseg, int min_rank, int rank);
// Segments [first, first + count) use rank r (min_rank <= r <= rank) from the next call. A matrix
// that keeps a rank keeps its error and Q; one whose rank changes keeps its error (error feedback
// carries) and gets a new Q: the old Q's leading columns, the others drawn afresh (the same on every
// rank); one that no longer pays at r hands its error to buf (the next gradients, as flush does).
void neox_powersgd_set_rank(neox_powersgd *o, int first, int count, int r, float *buf);
// The rank segments [first, first + count) use (their largest), and the bytes a call on them at
// rank r would send and the multiply-adds it would do (r x the compressed matrices' elements).
int neox_powersgd_rank_of(const neox_powersgd *o, int first, int count);
double neox_powersgd_wire_bytes_at(const neox_powersgd *o, int first, int count, int r);
double neox_powersgd_work_at(const neox_powersgd *o, int first, int count, int r);
void neox_powersgd_allreduce_range(neox_powersgd *o, float *buf, int first, int count);
void neox_powersgd_flush_range(neox_powersgd *o, float *buf, int first, int count);
void neox_powersgd_free(neox_powersgd *o);
// buf becomes the compressed average over the ranks.
void neox_powersgd_allreduce(neox_powersgd *o, float *buf);
// The state (be's memory): which 0, this rank's error; 1, the shared Q factors.
float *neox_powersgd_state(neox_powersgd *o, int which, size_t *count);
// Bytes this rank sends per call (both all-reduces, ring-counted as 2 (p - 1) / p of each).
double neox_powersgd_wire_bytes(const neox_powersgd *o);
// Adds this rank's error to buf (its next gradients, before an uncompressed average) and clears it;
// Q is kept for a later warm start.
void neox_powersgd_flush(neox_powersgd *o, float *buf);

// ---- adaptive gradient compression: how each bucket is reduced (adaptive.c) -----------------
// gradient_compression: adaptive. From what was measured — the link (latency and bandwidth of the
// data group's all-reduce), how much of backward was left when each gradient bucket was ready (the
// time its overlapped transfer can hide behind), and each compressor's own cost per element when it
// last ran — predict the exposed communication time of each way to reduce each bucket and plan the
// step: per bucket the most faithful option that the time saved justifies. Pure: the same inputs
// give the same plan, so ranks that share their measurements agree.
typedef enum {
    NEOX_SCHEME_DENSE,     // the configured all-reduce (communication_data_type)
    NEOX_SCHEME_BF16,      // the same in bfloat16 on the wire
    NEOX_SCHEME_POWERSGD,  // low rank, error feedback
    NEOX_SCHEME_ONEBIT,    // signs, error feedback
    NEOX_SCHEME_COUNT      // (schemes are in order of fidelity: a later one loses more)
} neox_scheme;

const char *neox_scheme_name(neox_scheme s);
// The scheme of a name, or -1.
int neox_scheme_from_name(const char *name);

// One way to reduce one bucket: a scheme (and PowerSGD's rank).
typedef struct neox_bucket_choice {
    neox_scheme scheme;
    int rank;  // PowerSGD's rank (the bucket's Q keeps it while other schemes run)
} neox_bucket_choice;

enum { NEOX_BUCKET_OPTIONS = 12 };

typedef struct neox_bucket_option {
    neox_bucket_choice choice;
    double wire_bytes;  // bytes a rank sends for the bucket per step
    int messages;       // collectives (each pays the latency)
    int overlapped;     // summed during backward, in the dense reducer's queue (else after backward)
    double compute_s;   // seconds of its own work per step (measured per element; 0 unknown)
} neox_bucket_option;

typedef struct neox_bucket_inputs {
    double hide_s;      // backward seconds left after the bucket was ready (0: overlap off)
    double share;       // the bucket's part of the gradient's elements (the margin is shared so)
    int noptions;       // option[0] is the most faithful (the configured all-reduce), then in order of fidelity
    neox_bucket_option option[NEOX_BUCKET_OPTIONS];
} neox_bucket_inputs;

typedef struct neox_adaptive_inputs {
    double latency_s;      // per collective
    double bytes_per_s;    // link bandwidth as the all-reduce sees it (> 0)
    double step_s;         // compute time of a step (forward, backward, optimizer)
    double margin;         // a less faithful option must save this fraction of the step time
    int nbuckets;          // in the order backward finishes them
    const neox_bucket_inputs *bucket;
    // Plans run recently (an option index per bucket) with the exposed seconds per step measured
    // on real steps with each (the least over the ranks), the plan in use among them. Measured
    // beats predicted: a plan's measurement stands in for its prediction, so probes that a busy
    // host slows cannot talk the run out of a reduction that really does hide behind backward, and
    // a plan that really was faster stays in reach after a trial of another.
    // Most recent first: the first plan whose buckets all go through the reducer calibrates the
    // link model (neox_adaptive_calibration).
    int nmeasured;
    const int *const *measured_plan;
    const double *measured_s;
    // Measured over predicted exposure of the overlapped reductions; what the reducer's queue
    // exposes is multiplied by it (0 is taken as 1). neox_adaptive_plan sets its own.
    double overlap_scale;
    // The share of each bucket's hide_s that its overlapped transfer really runs in (0 is taken
    // as 1): below 1 where transfers measured slower than the model has them, as when a rank
    // progresses them only between backward's ops. neox_adaptive_plan sets its own.
    double overlap_efficiency;
} neox_adaptive_inputs;

// Predicted exposed seconds per step of a plan (an option index per bucket): the dense buckets
// queue on the link in ready order, each starting when it is ready and the one before has gone,
// and expose what runs past the end of backward; the compressed ones run after that, one call
// after the other, each exposing its work, latencies and bytes, and a bucket that makes the same
// compressed choice as the one before it joins its call (no latency of its own). Per bucket,
// *marginal (may be NULL) gets what it added.
double neox_adaptive_plan_cost(const neox_adaptive_inputs *in, const int *plan, double *marginal);
// The plan (an option index per bucket into plan[]); returns its exposed seconds per step
// (measured, for a plan with a measurement). Buckets are decided in ready order, each taking a
// less faithful option only if it saves more than margin x (its share of the step + the best so
// far). Then that plan and the measured ones are taken in order of fidelity (the share-weighted
// sum of option indices), a less faithful one only if it saves more than margin x (step + the
// best so far). Predictions are calibrated (neox_adaptive_calibration) before any of this.
double neox_adaptive_plan(const neox_adaptive_inputs *in, int *plan);
// The link model's correction for the overlapped reductions: the most recent measured plan that
// sends every bucket through the reducer (dense or bf16), its measured exposed seconds over the
// model's, at most 1 (1 when there is none, or the model says it hides completely). Short probes
// on a busy host can read a link several times slower than bucket-sized transfers get (measured:
// 0.17 Gbit/s on a 1 Gbit/s link), which overstates every overlapped option alike, while the
// compressors' small messages are costed from their own measured work and stay right.
double neox_adaptive_calibration(const neox_adaptive_inputs *in);
// The other side of the same measurement: where that plan measured more exposed time than the
// model gives it, the overlap efficiency (in (0, 1]) at which the model gives what was measured
// (1 when it measured no more; the least, 1e-9, when even no overlap at all gives less): the
// transfers did not run during backward as the link would let them.
double neox_adaptive_overlap_efficiency(const neox_adaptive_inputs *in);
// The link from two timed all-reduces of small and large payloads (their ring wire bytes per rank
// and seconds): latency and bandwidth of the straight line through both, kept positive.
void neox_adaptive_fit_link(double small_bytes, double small_s, double large_bytes, double large_s, double *latency_s,
                            double *bytes_per_s);

// ---- adaptive gradient compression: the run-time half (adaptive_run.c) ----------------------
// What the policy above is run with: every interval steps (from compress_start on) the group's
// measurements (shared through a hook: the exchange probes the link and takes the maximum of
// every value over the data group, so every rank plans on the same numbers) are turned into a plan
// and each bucket switches to its choice through another hook; the plans run and their measured
// exposure are remembered, a scheme never run is tried for a few steps, the compressors' own
// costs are learnt from their calls, and the whole state goes to a checkpoint's train.json and
// back. A replay file (a decisions log) repeats its decisions instead of measuring; a measurements
// file (one JSON line per decision: "probe_s", "backward_s", "step_s", "exposed_s", "slack_s",
// "onebit_s_per_element", "powersgd_s_per_madd") stands in for what the group measured. Nothing
// here communicates: the unit tests drive it with recorded measurements.
typedef struct neox_adaptive_run neox_adaptive_run;

enum { NEOX_ADAPTIVE_MAX_RANKS = NEOX_BUCKET_OPTIONS - 3 };  // PowerSGD's candidates (besides dense, bf16, 1-bit)

// One gradient bucket as the compressors see it, with what each option would send.
typedef struct neox_adaptive_bucket {
    int first, count;          // its parameters: the compressors' segments [first, first + count)
    double elements;
    double onebit_wire_bytes;  // bytes a rank sends for it under 1-bit
    // Under PowerSGD at candidate rank k (neox_adaptive_candidate_ranks' order): bytes sent, multiply-adds.
    double powersgd_wire_bytes[NEOX_ADAPTIVE_MAX_RANKS], powersgd_work[NEOX_ADAPTIVE_MAX_RANKS];
} neox_adaptive_bucket;

typedef struct neox_adaptive_hooks {
    // The group's measurements: v[0] and v[1] get the seconds of the small and the large probe
    // (probe_floats), then every entry of v (nv) becomes its maximum over the group. NULL: v as it is.
    void (*share)(void *ctx, double *v, size_t nv);
    // Bucket i moves from one choice to another: the compressor it leaves hands its error to the
    // next gradients, the reducer leaves it to the compressors or sums it with its wire. restore:
    // taken from a checkpoint (the compressors' state is the checkpoint's: nothing is handed back).
    void (*use)(void *ctx, int bucket, neox_bucket_choice from, neox_bucket_choice to, int restore);
    // After each decision: the plan's fingerprint, the same on every rank of the group or the
    // collectives would pair up wrongly (the exchange compares it over the group). NULL: none.
    void (*agree)(void *ctx, double fingerprint, int64_t iteration);
    void *ctx;
} neox_adaptive_hooks;

typedef struct neox_adaptive_settings {
    int max_rank;                 // gradient_compression_rank
    int64_t interval;             // gradient_compression_interval: steps between decisions
    int64_t compress_start;       // gradient_compression_start: no decision before this many updates
    neox_dtype wire;              // the configured reducer's wire (bf16 there: the bf16 option is dense)
    int overlap;                  // the reducer overlaps its buckets with backward
    int data_size;                // ranks of the data group (the ring's bytes)
    size_t probe_floats[2];       // the small and the large probe's floats
    int nbuckets;                 // 0: nothing to plan (data-parallel size 1)
    const neox_adaptive_bucket *bucket;
    const char *replay_path;      // gradient_compression_replay, or NULL
    const char *measurements_path;  // measurements from a file instead of the group, or NULL
    int verbose;                  // notices and the plan's changes in the log
    neox_adaptive_hooks hooks;
} neox_adaptive_settings;

// PowerSGD's candidate ranks under max_rank: max_rank, then every power of two below it, largest
// first (NEOX_ADAPTIVE_MAX_RANKS at most); returns how many.
int neox_adaptive_candidate_ranks(int max_rank, int *ranks);
// A user-input error (an unreadable replay or measurements file, a replay planning other buckets): NULL.
neox_adaptive_run *neox_adaptive_run_make(const neox_adaptive_settings *s, neox_error *err);
void neox_adaptive_run_free(neox_adaptive_run *a);
// The decisions log (rank 0's log_dir/gradient_compression.jsonl): one JSON line per decision;
// the run closes it.
void neox_adaptive_run_set_log(neox_adaptive_run *a, FILE *log);
// Whether the step about to run (iteration, after optimizer_steps updates) decides.
int neox_adaptive_run_due(const neox_adaptive_run *a, int64_t iteration, int64_t optimizer_steps);
// Decides for iteration (measuring through the share hook, or replaying) and switches the buckets
// through the use hook. -1: the measurements file cannot serve this decision.
int neox_adaptive_run_decide(neox_adaptive_run *a, int64_t iteration, neox_error *err);
neox_bucket_choice neox_adaptive_run_choice(const neox_adaptive_run *a, int bucket);
// Seconds the link model gives a compressed call of wire_bytes (0: no link measured yet).
double neox_adaptive_run_link_seconds(const neox_adaptive_run *a, double wire_bytes);
// The compressors' calls of a step: per scheme, seconds beyond the link model and units of work
// (1-bit: elements; PowerSGD: multiply-adds); their own cost per unit is learnt from them.
void neox_adaptive_run_add_costs(neox_adaptive_run *a, const double *extra_s, const double *units);
// What a step measured on this rank: backward's seconds, the reduction's exposed seconds, the
// step's wall seconds and each bucket's slack (backward seconds after it was ready).
typedef struct neox_adaptive_step {
    double backward_s, exposed_s, wall_s;
    const double *slack_s;
} neox_adaptive_step;
// Takes the step's measurements; gauges (NEOX_ADAPTIVE_GAUGES, named by neox_adaptive_gauge_name)
// get the step's share of elements per scheme, the compressed buckets and the link in Gbit/s.
enum { NEOX_ADAPTIVE_GAUGES = NEOX_SCHEME_COUNT + 2 };
const char *neox_adaptive_gauge_name(int i);
void neox_adaptive_run_end_step(neox_adaptive_run *a, const neox_adaptive_step *step, double *gauges);
// Per bucket, the steps reduced with each option (NULL with no buckets).
struct json_t *neox_adaptive_run_summary(const neox_adaptive_run *a);
// The plan in use and what the next decisions build on (train.json's "gradient_compression"), and
// its restore (state NULL: a checkpoint of another mode, decide afresh; dir names the checkpoint
// in errors).
struct json_t *neox_adaptive_run_state(const neox_adaptive_run *a);
int neox_adaptive_run_restore(neox_adaptive_run *a, struct json_t *state, const char *dir, neox_error *err);

// ---- sparse embedding gradients (sparse_grad.c) ----------------------------------------------
// sparse_gradients: a (rows x width) gradient block holding global rows [row_begin, row_begin +
// rows) averaged over the group as (row ids, rows) for the rows touched on some rank: an all-gather
// of counts, of ids and of rows (variable counts), summed in rank order. Untouched rows must be
// zero on every rank (they are left as they are). Equal to the dense all-reduce (bit for bit at 2
// ranks; see the file). predivide as gradient_predivide_factor; mean_over as the reducer's (0: the
// group's size; 1: the rows are summed). The gradient and the gathered rows live on be (NULL: the
// CPU table); the marks and the row ids are the host's.
typedef struct neox_sparse_rows neox_sparse_rows;
neox_sparse_rows *neox_sparse_rows_make(neox_comm *c, const struct neox_backend *be, int64_t rows, int64_t width,
                                        int64_t row_begin, double predivide, int mean_over);
void neox_sparse_rows_free(neox_sparse_rows *s);
// Marks the rows of these global token ids (ids outside the block are ignored).
void neox_sparse_rows_touch(neox_sparse_rows *s, const int32_t *ids, size_t n);
// grad (rows x width, be's memory) becomes the mean over the group; the touched marks are cleared.
void neox_sparse_rows_reduce(neox_sparse_rows *s, float *grad);

// ---- the gradient exchange (exchange.c) ---------------------------------------------------------
// The one owner of how this rank's gradients cross the data-parallel group: the reducer (buckets,
// overlap, ZeRO partitions, wire types, the hierarchical all-reduce) and the expert reducer, the
// sparse embedding rows, 1-bit and PowerSGD gradient compression and 1-bit Adam's momentum
// compressor, the adaptive plan (the run-time half above), their memory, their report and their
// checkpoint state. The trainer reads the config into the settings, calls begin_step, tells it per
// micro-batch whether a reduction follows (micro_batch) and which parameters backward finished
// (ready), then finish and end_step. Time comes from the caller's clock (no metrics here).
typedef struct neox_grad_exchange neox_grad_exchange;

typedef enum {
    NEOX_COMPRESSION_NONE,
    NEOX_COMPRESSION_ONEBIT,    // gradient_compression: onebit
    NEOX_COMPRESSION_POWERSGD,  // gradient_compression: powersgd
    NEOX_COMPRESSION_ADAPTIVE   // gradient_compression: adaptive (both compressors, a plan per bucket)
} neox_grad_compression;

typedef struct neox_grad_exchange_settings {
    // The gradients: a flat buffer of n floats on backend, parameter p a rows[p] x cols[p] matrix
    // (a vector: rows 1) at [param_offset[p], + param_size[p]), back to back in parameter order; the
    // experts from dense_params on. held_param (-1: none): left out of ready, reported by
    // ready_held once summed elsewhere (the tied embedding's copies across pipe stages).
    float *grads;
    size_t n, fill_elems;    // fill_elems: neox_grad_reducer_options'
    int nparams, dense_params, held_param;
    const size_t *param_offset, *param_size;
    const int *rows, *cols;
    const struct neox_backend *backend;
    // The groups: data (size 1: nothing is reduced), its node split for the hierarchical all-reduce
    // (made here when it pays: stage 0 on the host), expert_data for the experts (NULL: none).
    neox_comm *data, *data_intra, *data_inter, *expert_data;
    // The reducer: neox_grad_reducer_options' (zero_stage applies to the dense reducer; reduce_scatter
    // false all-reduces under stages 1 and 2).
    size_t bucket_bytes;
    int zero_stage, reduce_scatter, overlap;
    double predivide, progress_interval;
    neox_dtype wire;
    // sparse_gradients: parameter 0 (rows x width, global rows from row_begin) as touched rows.
    int sparse;
    int64_t sparse_rows, sparse_width, sparse_row_begin;
    // 1-bit Adam: its momentum compressor, and gradients left unreduced from freeze_step updates on.
    int onebit_adam;
    int64_t freeze_step;
    neox_grad_compression compression;
    int powersgd_rank;       // gradient_compression_rank
    int64_t compress_start;  // gradient_compression_start
    int64_t adaptive_interval;
    const char *replay_path, *measurements_path;
    // Cumulative seconds so far of backward and of the reductions after it (the caller's timers).
    void (*clock)(void *ctx, double *backward_s, double *reduce_s);
    void *clock_ctx;
    int verbose;             // rank 0's notices
} neox_grad_exchange_settings;

// A user-input error (the adaptive plan's files): NULL. The settings' arrays are read during make
// only (it keeps its own copies); the groups, the gradients and the backend must outlive it.
neox_grad_exchange *neox_grad_exchange_make(const neox_grad_exchange_settings *s, neox_error *err);
void neox_grad_exchange_free(neox_grad_exchange *x);
// The adaptive plan's decisions log (rank 0, with log_dir); whether there is a plan to log.
int neox_grad_exchange_logs_decisions(const neox_grad_exchange *x);
void neox_grad_exchange_set_log(neox_grad_exchange *x, FILE *log);
// Whether gradients cross the group at all (data-parallel size > 1).
int neox_grad_exchange_reduces(const neox_grad_exchange *x);
// Whether backward must report its finished parameters (ready): overlap or ZeRO-2 partitions.
int neox_grad_exchange_wants_ready(const neox_grad_exchange *x);
int neox_grad_exchange_hierarchical(const neox_grad_exchange *x);
// Whether the reducer overlaps its buckets with backward (overlap_comm, data-parallel size > 1).
int neox_grad_exchange_overlapped(const neox_grad_exchange *x);
// Rank r's share of the flat buffer: ZeRO's partition (the reducer's), or with the input embedding
// apart (sparse rows, stage 0) the even share of the whole buffer.
void neox_grad_exchange_partition(const neox_grad_exchange *x, int r, size_t *begin, size_t *end);
// ZeRO-2 and 3: the partition's summed gradients (what the optimizer reads), else NULL.
float *neox_grad_exchange_partition_grads(const neox_grad_exchange *x);
// 1-bit Adam's momentum compressor (NULL unless onebit_adam over several ranks): the optimizer
// averages its momentum with it from freeze_step on.
neox_onebit *neox_grad_exchange_momentum_compressor(const neox_grad_exchange *x);

// Before a step's first backward, after the gradients were zeroed (iteration and the updates so
// far): the partition's sum zeroed, the adaptive plan's decision (which may hand a compressor's
// error to these gradients), whether this step leaves the gradients to the compressors. -1: the
// adaptive measurements file cannot serve the decision.
int neox_grad_exchange_begin_step(neox_grad_exchange *x, int64_t iteration, int64_t optimizer_steps, neox_error *err);
// Before a micro-batch's backward: whether a reduction follows it (every micro-batch under ZeRO-2
// and 3, else the step's last), which ready then acts on.
int neox_grad_exchange_micro_batch(neox_grad_exchange *x, int last);
int neox_grad_exchange_reduce_now(const neox_grad_exchange *x);
// Backward's hook: parameters [begin, end), or elements [begin, end) of the flat buffer, are final.
void neox_grad_exchange_ready(neox_grad_exchange *x, int begin, int end);
void neox_grad_exchange_ready_range(neox_grad_exchange *x, size_t begin, size_t end);
// The held parameter is final (summed).
void neox_grad_exchange_ready_held(neox_grad_exchange *x);
// Marks the rows of a micro-batch's input tokens (sparse_gradients).
void neox_grad_exchange_touch_rows(neox_grad_exchange *x, const int32_t *tokens, size_t n);
// After the backward a reduction follows. The gradients arrive scaled by 1 / data->size already (each
// rank's loss gradient divides by the global batch's tokens, as one rank's does over the same
// samples), so every path sums over the group: the reducers (mean_over 1, the experts' too), the
// sparse rows, and the compressors' averages multiplied by the group's size; a step that leaves the
// gradients local (1-bit Adam's compression phase) multiplies them by it, back to this rank's own
// mean. The sum is the mean over the group everywhere (or in the partition).
void neox_grad_exchange_finish(neox_grad_exchange *x);
// After the step: its measurements for the adaptive plan; gauges (NEOX_ADAPTIVE_GAUGES, named by
// neox_adaptive_gauge_name) filled, returns 1, when there is a plan to measure.
int neox_grad_exchange_end_step(neox_grad_exchange *x, double *gauges);

// Memory: bytes of gradients (the flat buffer's resident part, ZeRO-2's partition) and of
// communication (16-bit wire copies, the collectives' temporaries, the compressors' error buffers).
typedef struct neox_grad_exchange_memory {
    size_t grads, comm;
} neox_grad_exchange_memory;
neox_grad_exchange_memory neox_grad_exchange_memory_of(const neox_grad_exchange *x);
// The reducer's timing (collective over the data group; zeros without a reducer).
neox_grad_reducer_timing neox_grad_exchange_timing_of(neox_grad_exchange *x);
// comm_stats.json's "gradient_compression_buckets": per bucket the steps reduced with each
// option (NULL when not adaptive).
struct json_t *neox_grad_exchange_report(const neox_grad_exchange *x);
// Checkpointed state: this rank's compressor buffers (error buffers, PowerSGD's Q; the gradients'
// backend's memory) by checkpoint name; returns how many (at most NEOX_EXCHANGE_BUFFERS).
enum { NEOX_EXCHANGE_BUFFERS = 6 };
int neox_grad_exchange_buffers(const neox_grad_exchange *x, const char **names, float **bufs, size_t *counts);
// The adaptive plan's train.json object (NULL when not adaptive), and its restore.
struct json_t *neox_grad_exchange_state(const neox_grad_exchange *x);
int neox_grad_exchange_restore(neox_grad_exchange *x, struct json_t *state, const char *dir, neox_error *err);

#endif
