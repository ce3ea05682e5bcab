// param_gather.c: ZeRO-3's parameter coordinator (see gradient.h). Every data-parallel rank keeps
// only its partition of the flat fp32 parameters (the master weights the optimizer updates); the
// flat parameter buffer holds whole only the units (embedding, layers, head) that forward or
// backward is using or is about to use. A unit is all-gathered into the flat buffer before its
// use, each rank contributing its partition's part of it, and released after (its pages given
// back to the system), unless its next use in the pass comes within max_reuse_distance elements.
// Because the order in which a pass uses the units is known in advance (the model's trace), the
// units after the current one are gathered ahead with non-blocking all-gathers (prefetch), up to
// prefetch_elems elements at a time and as long as the gathered elements stay within the live
// bound; the untied embedding and output layer, used in pieces, get their next piece gathered the
// same way. Small tensors (at most persistence_threshold elements) are persistent: gathered once
// after every update and kept whole, as DeepSpeed keeps its persistent parameters.
//
// What a rank holds whole besides its partition is bounded so that stage 3 never holds more
// parameters than stage 0 (the whole model): the persistent tensors take at most half of the
// elements outside the partition, and the units and pieces gathered at once (in use, prefetched or
// kept for reuse) at most the rest, and at most max_live (the live bound). A unit kept for its
// reuse is released early when a gather needs its room (the one used again last goes first); only
// a single unit in use larger than the bound passes it. The embeddings' pieces are sized by
// neox_param_gather_piece_limit so that one in use and the next fit the bound.
//
// Every rank of the data group runs the same passes with the same traces, so the collectives start
// in the same order everywhere. A dry run of a trace (no communication) gives the peak of gathered
// elements that the start-up memory plan reports.
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "gradient.h"

enum { RELEASED, INFLIGHT, AVAILABLE };

typedef struct run {
    size_t begin, end;   // a range of the flat buffer
    int *counts, *displs;  // per rank: its part of the range (the all-gather's counts), where it starts
    neox_request req;
} run;

typedef struct unit {
    run *runs;           // its non-persistent parameters, adjacent ones merged
    int nruns;
    size_t gathered;     // elements in the runs
    size_t numel;        // all its elements (the reuse distance counts them)
    int state, active;
} unit;

struct neox_param_gather {
    neox_comm *data;
    float *params;
    const float *master;     // this rank's partition [part_begin, part_end) of the flat buffer
    size_t n, part_begin, part_end;
    neox_param_gather_options opt;
    unit *units;
    int nunits;
    run *persistent;         // the persistent parameters' runs
    int npersistent;
    size_t persistent_elems;
    const int *trace;        // the pass's units in order of use (NULL between passes)
    int trace_len, pos;
    size_t live;             // elements of the units gathered or in flight
    size_t live_limit;       // the live bound: max_live and the room the partition and persistent tensors leave
    int dry;                 // plan: change states and counts only, no communication
    int pinned;              // neox_param_gather_all: nothing is released before end
    int lazy_whole[2];       // a piece-gathered range is whole (gathered by neox_param_gather_all)
    int lazy_owner[2];       // the unit whose use a piece-gathered range's pieces are part of
    unsigned char *kept[2];  // per piece: whole since its last use (its unit is used again soon)
    run ahead[2];            // per piece-gathered range: the next piece, gathered while this one is used
    int ahead_active[2];
    neox_param_gather_stats stats;
};

// The elements outside a rank's partition, the same on every rank (that of the largest partition):
// the ranks must choose the same persistent tensors and make the same gathers in the same order.
static size_t outside_partition(size_t n, int ranks) { return n - (n + (size_t)ranks - 1) / (size_t)ranks; }

static void run_init(neox_param_gather *g, run *r, size_t begin, size_t end) {
    r->begin = begin, r->end = end;
    r->counts = neox_calloc((size_t)g->data->size, sizeof(int));
    r->displs = neox_calloc((size_t)g->data->size, sizeof(int));
    for (int q = 0; q < g->data->size; q++) {
        size_t lo, hi, a, b;
        neox_even_share(g->n, q, g->data->size, &lo, &hi);
        if (!neox_overlap(lo, hi, begin, end, &a, &b)) a = b = begin;
        r->counts[q] = (int)(b - a), r->displs[q] = (int)(a - begin);
    }
}

// Appends [begin, end) to the runs, merging it into the last one when they touch.
static void add_range(neox_param_gather *g, run **runs, int *count, size_t begin, size_t end) {
    if (*count > 0 && (*runs)[*count - 1].end == begin) {
        run *last = &(*runs)[*count - 1];
        free(last->counts), free(last->displs);
        run_init(g, last, last->begin, end);
        return;
    }
    *runs = neox_realloc(*runs, (size_t)(*count + 1) * sizeof **runs);
    run_init(g, &(*runs)[(*count)++], begin, end);
}

// Which piece-gathered range holds [lo, hi), or -1.
static int in_pieces(const neox_param_gather_options *o, size_t lo, size_t hi) {
    for (int i = 0; i < 2; i++)
        if (lo < hi && lo >= o->piece_begin[i] && hi <= o->piece_end[i]) return i;
    return -1;
}

neox_param_gather *neox_param_gather_make(neox_comm *data, float *params, size_t n, const float *master,
                                          const size_t *param_offset, const size_t *param_size,
                                          const int *unit_first, int nunits, const neox_param_gather_options *opt) {
    neox_param_gather *g = neox_calloc(1, sizeof *g);
    g->data = data, g->params = params, g->n = n, g->master = master, g->opt = *opt;
    neox_even_share(n, data->rank, data->size, &g->part_begin, &g->part_end);
    g->nunits = nunits;
    g->units = neox_calloc((size_t)nunits, sizeof *g->units);
    // Persistent tensors: those of at most persistence_threshold elements, taken in buffer order
    // while their total stays within model_persistence_threshold (< 0: no cap) and half the
    // elements outside the partition.
    size_t outside = outside_partition(n, data->size), persist_total = 0;
    int64_t persist_cap = (int64_t)(outside / 2);
    if (opt->model_persistence_threshold >= 0 && opt->model_persistence_threshold < persist_cap)
        persist_cap = opt->model_persistence_threshold;
    for (int u = 0; u < nunits; u++) {
        unit *x = &g->units[u];
        for (int p = unit_first[u]; p < unit_first[u + 1]; p++) {
            size_t lo = param_offset[p], hi = lo + param_size[p];
            x->numel += param_size[p];
            int r = in_pieces(opt, lo, hi);
            if (r >= 0) {  // gathered by pieces
                g->lazy_owner[r] = u;
                continue;
            }
            int persist = (int64_t)param_size[p] <= opt->persistence_threshold &&
                          (int64_t)(persist_total + param_size[p]) <= persist_cap;
            if (persist) {
                persist_total += param_size[p];
                add_range(g, &g->persistent, &g->npersistent, lo, hi);
            } else {
                x->gathered += param_size[p];
                add_range(g, &x->runs, &x->nruns, lo, hi);
            }
        }
    }
    for (int r = 0; r < 2; r++)
        if (opt->piece_begin[r] < opt->piece_end[r])
            g->kept[r] = neox_calloc((opt->piece_end[r] - opt->piece_begin[r]) / opt->piece_elems + 1, 1);
    g->persistent_elems = persist_total;
    g->stats.persistent_elements = (int64_t)persist_total;
    g->live_limit = outside - persist_total;
    if (opt->max_live >= 0 && (uint64_t)opt->max_live < g->live_limit) g->live_limit = (size_t)opt->max_live;
    return g;
}

static void free_runs(run *runs, int count) {
    for (int i = 0; i < count; i++) free(runs[i].counts), free(runs[i].displs);
    free(runs);
}

void neox_param_gather_free(neox_param_gather *g) {
    if (!g) return;
    for (int u = 0; u < g->nunits; u++) free_runs(g->units[u].runs, g->units[u].nruns);
    free_runs(g->persistent, g->npersistent);
    free(g->kept[0]), free(g->kept[1]);
    free(g->units);
    free(g);
}

// A run's all-gather starts: its range takes back the device memory a release gave away (a device
// cannot fault it in when the gather writes), then this rank's part goes from its partition to its
// place in the flat buffer (a copy on the backend: on a device, stream-ordered before the all-gather
// that reads it).
static void start_run_gather(neox_param_gather *g, run *r) {
    size_t lo, hi;
    g->opt.be->commit(g->params + r->begin, (r->end - r->begin) * sizeof(float));
    if (neox_overlap(g->part_begin, g->part_end, r->begin, r->end, &lo, &hi))
        g->opt.be->copy(g->params + lo, g->master + (lo - g->part_begin), (hi - lo) * sizeof(float));
    neox_iallgatherv_inplace(g->data, g->params + r->begin, r->counts, r->displs, NEOX_F32, &r->req);
}

// A released range gives its memory back through the backend (host pages, or the emulated device's;
// CUDA's cudaMalloc blocks cannot give part back), its contents undefined from now.
static void give_back(neox_param_gather *g, size_t begin, size_t end) {
    g->opt.be->release(g->params + begin, (end - begin) * sizeof(float));
}

static void start_gather(neox_param_gather *g, int u, int prefetch) {
    unit *x = &g->units[u];
    for (int i = 0; !g->dry && i < x->nruns; i++) {
        run *r = &x->runs[i];
        start_run_gather(g, r);
    }
    x->state = INFLIGHT;
    g->live += x->gathered;
    if (g->live > (size_t)g->stats.peak_live_elements) g->stats.peak_live_elements = (int64_t)g->live;
    if (g->dry) return;
    g->stats.gathers++;
    g->stats.prefetched += prefetch;
    g->stats.gathered_elements += (int64_t)x->gathered;
}

static void finish_gather(neox_param_gather *g, int u) {
    unit *x = &g->units[u];
    for (int i = 0; !g->dry && i < x->nruns; i++) {
        neox_wait(&x->runs[i].req);
        if (g->opt.gathered) g->opt.gathered(g->opt.ctx, x->runs[i].begin, x->runs[i].end);
    }
    x->state = AVAILABLE;
}

static void release_unit(neox_param_gather *g, int u) {
    unit *x = &g->units[u];
    if (x->state == INFLIGHT) finish_gather(g, u);  // (a prefetch the pass did not use)
    for (int i = 0; !g->dry && i < x->nruns; i++) {
        give_back(g, x->runs[i].begin, x->runs[i].end);
        if (g->opt.released) g->opt.released(g->opt.ctx, x->runs[i].begin, x->runs[i].end);
    }
    x->state = RELEASED;
    g->live -= x->gathered;
}

void neox_param_gather_begin(neox_param_gather *g, const int *trace, int len) {
    g->trace = trace, g->trace_len = len, g->pos = 0;
}

// Where the pass uses unit u next, from the current position on (trace_len: not again).
static int next_use(const neox_param_gather *g, int u) {
    for (int j = g->pos; g->trace && j < g->trace_len; j++)
        if (g->trace[j] == u) return j;
    return g->trace_len;
}

static void drop_range(neox_param_gather *g, size_t begin, size_t end);

// The last kept piece of range i (the one a pass reaches last: pieces are used in ascending
// order), or -1.
static long last_kept_piece(const neox_param_gather *g, int i) {
    if (!g->kept[i]) return -1;
    size_t count = (g->opt.piece_end[i] - g->opt.piece_begin[i] + g->opt.piece_elems - 1) / g->opt.piece_elems;
    for (size_t k = count; k-- > 0;)
        if (g->kept[i][k]) return (long)k;
    return -1;
}

static void drop_kept_piece(neox_param_gather *g, int i, long k) {
    size_t lo = g->opt.piece_begin[i] + (size_t)k * g->opt.piece_elems, e = g->opt.piece_end[i];
    drop_range(g, lo, e - lo < g->opt.piece_elems ? e : lo + g->opt.piece_elems);
    g->kept[i][k] = 0;
}

// Gives back what was kept whole for a later use (units not in use, pieces) until need more
// elements fit the live bound, those used again last first, and only those used after position
// horizon (a gather for the use in progress takes room from anything kept; a prefetch only from
// what is needed later than what it gathers). Whether they fit now.
static int make_room(neox_param_gather *g, size_t need, int horizon) {
    while (!g->pinned && g->live + need > g->live_limit) {
        int best = -1, best_use = horizon, best_piece = -1;
        for (int u = 0; u < g->nunits; u++) {
            const unit *x = &g->units[u];
            if (x->state != AVAILABLE || x->active > 0 || x->gathered == 0) continue;
            int use = next_use(g, u);
            if (use > best_use) best = u, best_use = use, best_piece = -1;
        }
        for (int i = 0; i < 2; i++) {
            int use = next_use(g, g->lazy_owner[i]);
            if (last_kept_piece(g, i) >= 0 && use > best_use) best = i, best_use = use, best_piece = 1;
        }
        if (best < 0) break;
        if (best_piece > 0) drop_kept_piece(g, best, last_kept_piece(g, best));
        else release_unit(g, best);
    }
    return g->live + need <= g->live_limit;
}

// Gathers ahead the units the trace uses next, in order, while fewer than prefetch_elems elements
// were started in this call (DeepSpeed's budget) and each fits the live bound, counted after the
// current unit's gather and leaving room for one piece when the current unit is used by pieces
// (room is made from what is kept for a later use).
static void prefetch(neox_param_gather *g) {
    int64_t taken = 0;
    int u = g->trace[g->pos];
    size_t reserve = 0;
    for (int i = 0; i < 2; i++)
        if (g->lazy_owner[i] == u && g->opt.piece_begin[i] < g->opt.piece_end[i]) reserve = g->opt.piece_elems;
    for (int j = g->pos + 1; j < g->trace_len && taken < g->opt.prefetch_elems; j++) {
        int v = g->trace[j];
        if (g->units[v].state != RELEASED || g->units[v].gathered == 0) continue;
        if (!make_room(g, g->units[v].gathered + reserve, j)) break;
        start_gather(g, v, 1);
        taken += (int64_t)g->units[v].gathered;
    }
}

void neox_param_gather_acquire(neox_param_gather *g, int u) {
    // Every step uses the units in the order the first step recorded (the model's order is fixed).
    neox_assert(!g->trace || (g->pos < g->trace_len && g->trace[g->pos] == u),
                "ZeRO-3: the model used weight unit %d where its trace has %d (position %d of %d)", u,
                g->pos < g->trace_len ? g->trace[g->pos] : -1, g->pos, g->trace_len);
    unit *x = &g->units[u];
    if (x->state == RELEASED && x->gathered > 0) {
        make_room(g, x->gathered, g->pos - 1);  // (a unit larger than the bound is gathered all the same)
        start_gather(g, u, 0);
    }
    if (x->state == INFLIGHT) finish_gather(g, u);
    if (x->gathered == 0) x->state = AVAILABLE;
    x->active++;
    if (g->trace) {
        prefetch(g);
        g->pos++;
    }
}

// Whether unit u is used again in the pass with fewer than max_reuse_distance elements of other
// units' use in between (DeepSpeed's rule: count the elements of the units used before it).
static int reused_soon(const neox_param_gather *g, int u) {
    int64_t between = 0;
    for (int j = g->pos; g->trace && j < g->trace_len && between < g->opt.max_reuse_distance; j++) {
        if (g->trace[j] == u) return 1;
        between += (int64_t)g->units[g->trace[j]].numel;
    }
    return 0;
}

// A unit used again soon is kept while the live bound holds it.
void neox_param_gather_release(neox_param_gather *g, int u) {
    unit *x = &g->units[u];
    if (--x->active > 0 || x->gathered == 0 || g->pinned || (reused_soon(g, u) && g->live <= g->live_limit)) return;
    release_unit(g, u);
}

// [begin, end) of a piece-gathered range: its all-gather started into *r, counted live from now on
// (finish_range waits for it).
static void start_range(neox_param_gather *g, run *r, size_t begin, size_t end) {
    g->live += end - begin;
    if (g->live > (size_t)g->stats.peak_live_elements) g->stats.peak_live_elements = (int64_t)g->live;
    r->begin = begin, r->end = end;
    if (g->dry) return;
    run_init(g, r, begin, end);
    start_run_gather(g, r);
}

static void finish_range(neox_param_gather *g, run *r) {
    if (g->dry) return;
    neox_wait(&r->req);
    free(r->counts), free(r->displs);
    r->counts = r->displs = NULL;
    if (g->opt.gathered) g->opt.gathered(g->opt.ctx, r->begin, r->end);
    g->stats.gathers++;
    g->stats.gathered_elements += (int64_t)(r->end - r->begin);
}

// [begin, end) of a piece-gathered range made whole alone (blocking).
static void gather_range(neox_param_gather *g, size_t begin, size_t end) {
    run r;
    start_range(g, &r, begin, end);
    finish_range(g, &r);
}

static void drop_range(neox_param_gather *g, size_t begin, size_t end) {
    g->live -= end - begin;
    if (g->dry) return;
    give_back(g, begin, end);
    if (g->opt.released) g->opt.released(g->opt.ctx, begin, end);
}

// A prefetched piece nobody used (the pass ended, or used another piece first): waited for and given back.
static void drop_ahead(neox_param_gather *g, int i) {
    if (!g->ahead_active[i]) return;
    finish_range(g, &g->ahead[i]);
    g->ahead_active[i] = 0;
    drop_range(g, g->ahead[i].begin, g->ahead[i].end);
}

// Passes use a range's pieces in ascending order, so while piece [begin, end) is used the next one
// is gathered, under the units' rule (a prefetch budget, and room under the live bound) unless it
// is still whole from its last use.
static void prefetch_piece(neox_param_gather *g, int i, size_t end) {
    size_t e = g->opt.piece_end[i], hi = e - end < g->opt.piece_elems ? e : end + g->opt.piece_elems;
    if (end >= e || g->ahead_active[i] || g->kept[i][(end - g->opt.piece_begin[i]) / g->opt.piece_elems]) return;
    if (g->opt.prefetch_elems <= 0 || !make_room(g, hi - end, g->pos - 1)) return;
    start_range(g, &g->ahead[i], end, hi);
    g->ahead_active[i] = 1;
    if (!g->dry) g->stats.prefetched++, g->stats.pieces_prefetched++;
}

// A piece is gathered when used unless still whole from its last use or gathered ahead; after the
// use it stays whole while its unit is used again within max_reuse_distance (the output layer from
// forward's end to backward's start) and the live bound holds it, as the units do.
void neox_param_gather_piece(neox_param_gather *g, size_t begin, size_t end, int use) {
    int i = in_pieces(&g->opt, begin, end);
    neox_assert(i >= 0, "ZeRO-3: elements %zu-%zu are not in a range gathered by pieces", begin, end);
    if (g->lazy_whole[i]) return;
    unsigned char *kept = &g->kept[i][(begin - g->opt.piece_begin[i]) / g->opt.piece_elems];
    if (use && g->ahead_active[i] && g->ahead[i].begin == begin) {
        finish_range(g, &g->ahead[i]);
        g->ahead_active[i] = 0;
    } else if (use) {
        drop_ahead(g, i);
        if (*kept) {
            *kept = 0;
        } else {
            make_room(g, end - begin, g->pos - 1);
            gather_range(g, begin, end);
        }
    } else if (g->trace && reused_soon(g, g->lazy_owner[i]) && g->live <= g->live_limit) *kept = 1;
    else drop_range(g, begin, end);
    if (use) prefetch_piece(g, i, end);
}

// The kept pieces given back (the pass is over), and the whole ranges for readers of the whole
// model gathered (whole 1) or given back (whole 0).
static void drop_kept(neox_param_gather *g) {
    for (int i = 0; i < 2; i++) {
        drop_ahead(g, i);
        size_t b = g->opt.piece_begin[i], e = g->opt.piece_end[i];
        for (size_t k = 0; b < e && k * g->opt.piece_elems < e - b; k++) {
            if (!g->kept[i][k]) continue;
            size_t lo = b + k * g->opt.piece_elems, hi = e - lo < g->opt.piece_elems ? e : lo + g->opt.piece_elems;
            drop_range(g, lo, hi);
            g->kept[i][k] = 0;
        }
    }
}

static void lazy_all(neox_param_gather *g, int whole) {
    for (int i = 0; i < 2; i++) {
        if (g->opt.piece_begin[i] >= g->opt.piece_end[i] || g->lazy_whole[i] == whole) continue;
        if (whole) gather_range(g, g->opt.piece_begin[i], g->opt.piece_end[i]);
        else drop_range(g, g->opt.piece_begin[i], g->opt.piece_end[i]);
        g->lazy_whole[i] = whole;
    }
}

void neox_param_gather_end(neox_param_gather *g) {
    drop_kept(g);
    lazy_all(g, 0);
    for (int u = 0; u < g->nunits; u++) {
        g->units[u].active = 0;
        if (g->units[u].gathered == 0) g->units[u].state = RELEASED;
        else if (g->units[u].state != RELEASED) release_unit(g, u);
    }
    g->trace = NULL;
    g->pinned = 0;
}

void neox_param_gather_all(neox_param_gather *g) {
    g->pinned = 1;
    drop_kept(g);
    lazy_all(g, 1);
    for (int u = 0; u < g->nunits; u++)
        if (g->units[u].state == RELEASED && g->units[u].gathered > 0) start_gather(g, u, 0);
    for (int u = 0; u < g->nunits; u++)
        if (g->units[u].state == INFLIGHT) finish_gather(g, u);
}

// Every run's all-gather is started before any is waited for: the persistent tensors (biases and
// norms, a few per layer, apart in the buffer) then cost the data group one wait, not one per run.
void neox_param_gather_persistent(neox_param_gather *g) {
    for (int i = 0; i < g->npersistent; i++) {
        run *r = &g->persistent[i];
        start_run_gather(g, r);
    }
    for (int i = 0; i < g->npersistent; i++) {
        run *r = &g->persistent[i];
        neox_wait(&r->req);
        if (g->opt.gathered) g->opt.gathered(g->opt.ctx, r->begin, r->end);
    }
    // On a device the gathers are only queued; a rank that holds no part of the later runs reaches
    // the host's next collective (the memory plan, the step's metrics) with no device work between,
    // so the device finishes them first: otherwise ranks would wait on each other's host and device
    // collectives (the emulated device runs its queue only when reached). Once per step.
    if (g->opt.be->on_device) g->opt.be->synchronize();
}

size_t neox_param_gather_plan(neox_param_gather *g, const int *trace, int len) {
    neox_param_gather_stats kept = g->stats;
    g->dry = 1;
    g->stats.peak_live_elements = 0;
    neox_param_gather_begin(g, trace, len);
    for (int i = 0; i < len; i++) {
        neox_param_gather_acquire(g, trace[i]);
        for (int r = 0; r < 2; r++) {  // the unit's use of its range's pieces, one after another
            size_t b = g->opt.piece_begin[r], e = g->opt.piece_end[r];
            for (size_t lo = b; b < e && g->lazy_owner[r] == trace[i] && lo < e; lo += g->opt.piece_elems) {
                size_t hi = e - lo < g->opt.piece_elems ? e : lo + g->opt.piece_elems;
                neox_param_gather_piece(g, lo, hi, 1);
                neox_param_gather_piece(g, lo, hi, 0);
            }
        }
        neox_param_gather_release(g, trace[i]);
    }
    size_t peak = (size_t)g->stats.peak_live_elements;
    neox_param_gather_end(g);
    g->dry = 0;
    g->stats = kept;
    return peak;
}

neox_param_gather_stats neox_param_gather_stats_of(const neox_param_gather *g) { return g->stats; }

size_t neox_param_gather_live_limit(const neox_param_gather *g) { return g->live_limit; }

size_t neox_param_gather_piece_limit(size_t n, int ranks, int64_t max_live) {
    size_t outside = outside_partition(n, ranks), live = outside - outside / 2;  // (the persistent tensors take at most half)
    if (max_live >= 0 && (uint64_t)max_live < live) live = (size_t)max_live;
    return live / 2;  // one piece in use and the next gathered ahead
}

size_t neox_param_gather_scratch_bytes(const neox_param_gather *g) {
    if (g->data->size < 2) return 0;
    // MPICH's recursive-doubling all-gather of varying counts gathers into a temporary the size of
    // the whole range and copies it home: a unit's runs start together, and so do the persistent ones.
    size_t largest = g->persistent_elems > g->opt.piece_elems ? g->persistent_elems : g->opt.piece_elems;
    for (int u = 0; u < g->nunits; u++)
        if (g->units[u].gathered > largest) largest = g->units[u].gathered;
    return largest * sizeof(float);
}
