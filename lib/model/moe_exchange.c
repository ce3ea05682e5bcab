// moe_exchange.c: the bookkeeping of expert parallelism's all-to-all (docs/parallel.md, "Expert
// parallelism"). A rank's routed rows are sorted by expert, and the experts are shared out in
// consecutive blocks (rank q holds experts [q L, (q + 1) L)), so the rows bound for each rank are
// one contiguous run: the sends are the expert counts summed per rank. The owner receives, from
// each source in rank order, that source's rows for its experts in expert order (source-major);
// its GEMMs want them expert-major (all rows of its first expert, from every source, then the next),
// so the plan also gives the row permutation between the two orders. Pure: no communication.
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"

neox_moe_exchange *neox_moe_exchange_new(int ranks, int local, int cap) {
    neox_moe_exchange *x = neox_calloc(1, sizeof *x);
    x->ranks = ranks, x->local = local, x->cap = cap;
    x->send_count = neox_calloc((size_t)ranks, sizeof(int));
    x->send_displ = neox_calloc((size_t)ranks, sizeof(int));
    x->recv_count = neox_calloc((size_t)ranks, sizeof(int));
    x->recv_displ = neox_calloc((size_t)ranks, sizeof(int));
    x->from = neox_calloc((size_t)ranks * local, sizeof(int));
    x->local_count = neox_calloc((size_t)local, sizeof(int));
    x->to_expert = neox_calloc((size_t)(cap ? cap : 1), sizeof(int));
    x->to_source = neox_calloc((size_t)(cap ? cap : 1), sizeof(int));
    return x;
}

void neox_moe_exchange_free(neox_moe_exchange *x) {
    if (!x) return;
    void *all[] = {x->send_count, x->send_displ, x->recv_count, x->recv_displ, x->from, x->local_count, x->to_expert,
                   x->to_source};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    free(x);
}

int neox_moe_exchange_plan(neox_moe_exchange *x, const int *count, const int *from, neox_error *err) {
    int P = x->ranks, L = x->local;
    memcpy(x->from, from, (size_t)P * L * sizeof(int));
    for (int q = 0, at = 0; q < P; q++) {
        x->send_count[q] = 0;
        for (int e = 0; e < L; e++) x->send_count[q] += count[q * L + e];
        x->send_displ[q] = at, at += x->send_count[q];
    }
    x->received = 0;
    for (int s = 0; s < P; s++) {
        x->recv_count[s] = 0;
        for (int e = 0; e < L; e++) {
            if (from[s * L + e] < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "MoE exchange: negative row count");
            x->recv_count[s] += from[s * L + e];
        }
        x->recv_displ[s] = x->received, x->received += x->recv_count[s];
    }
    if (x->received > x->cap)  // the plan holds the worst case, so this is a broken invariant, not load
        return neox_fail(err, NEOX_EXIT_FAILURE, "MoE exchange: %d rows received, buffers planned for %d", x->received,
                         x->cap);
    int i = 0;
    for (int e = 0; e < L; e++) {
        x->local_count[e] = 0;
        for (int s = 0; s < P; s++) {
            int row = x->recv_displ[s];  // source s's rows for expert e follow its rows for experts < e
            for (int k = 0; k < e; k++) row += from[s * L + k];
            for (int j = 0; j < from[s * L + e]; j++, i++) x->to_expert[i] = row + j, x->to_source[row + j] = i;
            x->local_count[e] += from[s * L + e];
        }
    }
    return 0;
}
