// test_param_gather.c: ZeRO-3's live bound (lib/gradient/param_gather.c) on a model written out by
// hand, planned without communication (the coordinator's dry run of a training pass): whatever the
// stage-3 keys, the elements a rank holds whole beside its partition (persistent tensors and the
// peak of units and pieces whole at once) are at most the elements outside its partition, so stage 3
// never holds more than stage 0; the persistent tensors take at most half of those;
// stage3_max_live_parameters bounds the units and pieces (the pieces sized by
// neox_param_gather_piece_limit), units kept for their reuse giving their room back; only a single
// unit larger than the bound passes it; ranks of unequal partitions agree.
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "gradient.h"

// The model: an input embedding of 400 elements (unit 0), four layers of 100 (units 1-4), the head's
// norm of 10 and its output layer of 390 (unit 5): 1200 elements; rank 0 of 2 holds [0, 600).
enum { N = 1200, RANKS = 2, PARTITION = 600, NUNITS = 6, NPARAMS = 7 };
static const size_t offset[NPARAMS] = {0, 400, 500, 600, 700, 800, 810};
static const size_t size[NPARAMS] = {400, 100, 100, 100, 100, 10, 390};
static const int unit_first[NUNITS + 1] = {0, 1, 2, 3, 4, 5, 7};
// A training pass: forward embedding, layers, head; backward head, layers in reverse.
static const int trace[] = {0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1};
enum { TRACE_LEN = sizeof trace / sizeof *trace };

typedef struct planned {
    size_t peak, persistent, live_limit;
} planned;

// Plans a pass of rank `rank` of `ranks` with these keys; with pieces, the embedding and the output
// layer are gathered by pieces of the size the bound allows.
static planned plan_on(neox_param_gather_options o, int pieces, int rank, int ranks) {
    static float params[N], master[N];
    neox_comm data = {.rank = rank, .size = ranks};
    if (pieces) {
        o.piece_begin[0] = 810, o.piece_end[0] = 1200;  // the output layer
        o.piece_begin[1] = 0, o.piece_end[1] = 400;     // the input embedding
        o.piece_elems = neox_param_gather_piece_limit(N, ranks, o.max_live);
    }
    neox_param_gather *g = neox_param_gather_make(&data, params, N, master, offset, size, unit_first, NUNITS, &o);
    planned p = {.peak = neox_param_gather_plan(g, trace, TRACE_LEN),
                 .persistent = (size_t)neox_param_gather_stats_of(g).persistent_elements,
                 .live_limit = neox_param_gather_live_limit(g)};
    neox_param_gather_free(g);
    return p;
}

static planned plan_with(neox_param_gather_options o, int pieces) { return plan_on(o, pieces, 0, RANKS); }

// DeepSpeed's defaults (GPT-NeoX passes them on): every tensor here is small enough to be
// persistent, everything is prefetched and kept for reuse.
static neox_param_gather_options defaults(void) {
    return (neox_param_gather_options){.prefetch_elems = 50000000, .max_live = 1000000000,
                                       .max_reuse_distance = 1000000000, .persistence_threshold = 100000,
                                       .model_persistence_threshold = -1};
}

static void assert_within_stage0(planned p) {
    assert_true(p.persistent <= (N - PARTITION) / 2);
    assert_true(p.peak <= p.live_limit);
    assert_true(p.persistent + p.peak <= N - PARTITION);
}

static void test_defaults_within_stage0(void **state) {
    (void)state;
    planned p = plan_with(defaults(), 1);
    assert_within_stage0(p);
    // In buffer order the first three layers fit half the 600 elements outside the partition.
    assert_int_equal(p.persistent, 300);
    assert_int_equal(p.live_limit, 300);
    assert_int_equal(neox_param_gather_piece_limit(N, RANKS, 1000000000), 150);
}

static void test_small_max_live_bounds_pieces(void **state) {
    (void)state;
    neox_param_gather_options o = defaults();
    o.max_live = 120;
    planned p = plan_with(o, 1);
    assert_within_stage0(p);
    assert_int_equal(p.live_limit, 120);
    assert_true(p.peak <= 120);
    assert_int_equal(neox_param_gather_piece_limit(N, RANKS, 120), 60);
}

// Nothing persistent, nothing prefetched, everything kept for its reuse: the kept layers give their
// room to the next gathers once the bound is reached.
static void test_reuse_kept_within_the_bound(void **state) {
    (void)state;
    neox_param_gather_options o = defaults();
    o.persistence_threshold = 0, o.prefetch_elems = 0, o.max_live = 250;
    planned p = plan_with(o, 1);
    assert_within_stage0(p);
    assert_int_equal(p.persistent, 0);
    assert_true(p.peak <= 250);
    o.max_live = 1000000000;  // the bound is then what the partition leaves: 600 elements
    p = plan_with(o, 1);
    assert_within_stage0(p);
    assert_int_equal(p.live_limit, 600);
}

// A unit larger than the bound is gathered whole all the same (only the embeddings are cut).
static void test_single_unit_over_the_bound(void **state) {
    (void)state;
    neox_param_gather_options o = defaults();
    o.persistence_threshold = 0, o.max_live = 1;
    planned p = plan_with(o, 0);
    assert_int_equal(p.live_limit, 1);
    assert_int_equal(p.peak, 400);  // the input embedding, whole without pieces
}

// Partitions of unequal sizes (1200 over 7 ranks: 171 or 172 elements): every rank chooses the same
// persistent tensors and bound (their gathers are collectives), that of the largest partition.
static void test_ranks_agree(void **state) {
    (void)state;
    planned first = plan_on(defaults(), 1, 0, 7);
    for (int r = 1; r < 7; r++) {
        planned p = plan_on(defaults(), 1, r, 7);
        assert_int_equal(p.persistent, first.persistent);
        assert_int_equal(p.live_limit, first.live_limit);
        assert_int_equal(p.peak, first.peak);
    }
    assert_true(first.persistent + first.peak <= N - 172);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_within_stage0),
        cmocka_unit_test(test_small_max_live_bounds_pieces),
        cmocka_unit_test(test_reuse_kept_within_the_bound),
        cmocka_unit_test(test_single_unit_over_the_bound),
        cmocka_unit_test(test_ranks_agree),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
