// shared_records.c: work shared over the data-parallel ranks of an evaluation job, in one place so the
// tools make no collective calls: items k = 0..n-1 go to rank k % ranks, each rank makes its items'
// records, and rank 0 receives them and emits them in item order (neox-eval generate's completions).
// Also how the ranks agree that all succeeded, and the sum/max reduction of a rate.
#include <stdlib.h>
#include <string.h>

#include "eval.h"

int neox_eval_ranks_agree(neox_comm *dp, int rc, const char *doing, neox_error *err) {
    int status = rc != 0 ? (err->status ? err->status : NEOX_EXIT_FAILURE) : 0;
    if (dp->size > 1) neox_allreduce_max(dp, &status, 1, NEOX_I32);
    // A rank that failed keeps its own error; the others get one with the same exit status, so the
    // job's status is the failure's whichever rank ends it first.
    if (status && rc == 0) neox_fail(err, status, "another rank failed while %s", doing);
    return status ? -1 : 0;
}

// Rank 0 receives record k from its owner (every rank sends its own in increasing k, the order
// rank 0 asks for them) and emits it.
static void gather_in_order(neox_comm *dp, int64_t n, char **records, neox_record_sink emit, void *ctx) {
    for (int64_t k = 0; k < n; k++) {
        int owner = (int)(k % dp->size);
        int64_t len = records[k] ? (int64_t)strlen(records[k]) : 0;
        if (owner != 0 && dp->rank == owner) {
            neox_send(dp, &len, 1, NEOX_I64, 0, 0);
            neox_send(dp, records[k], (size_t)len, NEOX_U8, 0, 0);
        } else if (owner != 0 && dp->rank == 0) {
            neox_recv(dp, &len, 1, NEOX_I64, owner, 0);
            records[k] = neox_malloc((size_t)len + 1);
            neox_recv(dp, records[k], (size_t)len, NEOX_U8, owner, 0);
            records[k][len] = 0;
        }
        if (dp->rank == 0) emit(ctx, k, records[k]);
    }
}

int neox_eval_share_records(neox_comm *dp, int64_t n, neox_record_maker make, neox_record_sink emit, void *ctx,
                            const char *doing, neox_error *err) {
    char **records = neox_calloc((size_t)n + 1, sizeof *records);
    int rc = 0;
    int64_t made = 0;
    for (int64_t k = dp->rank; rc == 0 && k < n; k += dp->size, made++)
        if (!(records[k] = make(ctx, k, err))) rc = -1;
    if (rc == 0) neox_debug("%s: made %lld of the %lld records", doing, (long long)made, (long long)n);
    rc = neox_eval_ranks_agree(dp, rc, doing, err);
    if (rc == 0) gather_in_order(dp, n, records, emit, ctx);
    for (int64_t k = 0; k < n; k++) free(records[k]);
    free(records);
    return rc;
}

void neox_eval_sum_and_max(neox_comm *dp, double *sum, double *max) {
    if (dp->size <= 1) return;
    neox_allreduce_sum(dp, sum, 1, NEOX_F64);
    neox_allreduce_max(dp, max, 1, NEOX_F64);
}
