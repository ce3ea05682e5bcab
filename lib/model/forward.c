// forward.c: the activation plan and the forward pass: embedding, the decoder layers (sequential or
// parallel residual), the final norm, the output projection and the fused cross-entropy. Under
// tensor parallelism the embedding and cross-entropy are vocab-parallel and each layer runs
// Megatron's column-parallel (QKV, first MLP projection) and row-parallel (attention output,
// second MLP projection) linears; row-parallel partial sums are reduced over the tensor-parallel
// group and their bias added once, after the reduction. Under sequence parallelism the residual
// stream, norms and hidden dropouts keep this rank's rows only: the reduction becomes a
// reduce-scatter of rows and each column-parallel linear's input is all-gathered first.
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"

static void *take_bytes(char **cursor, size_t bytes) {
    void *p = *cursor;
    *cursor += (bytes + 63) & ~(size_t)63;  // 64-byte aligned slices
    return p;
}

// n fp32 values (the statistics, the loss mask) or n 4-byte ids; double statistics take 2 each.
static float *take(char **cursor, size_t n) { return take_bytes(cursor, n * sizeof(float)); }

// n elements of an activation tensor or its gradient, in the model's storage (act_elem).
static float *take_act(const neox_model *m, char **cursor, size_t n) {
    return take_bytes(cursor, neox_model_act_bytes(m, n));
}

// The shard's sizes the plan is cut by: rows N = B*T, the fused QKV width W, the first MLP
// projection's width FC (both swiglu halves).
typedef struct plan_sizes {
    size_t n;  // the residual stream's rows on this rank: N, or N / tp_size under sequence parallelism
    size_t N, C, L, HS, NH, NKV, W, F, FC;
    size_t NK, E, Fe;  // Mixture of Experts: token slots, experts, expert width (0 without)
    size_t NR;         // rows this rank's experts can receive: NK, or under expert parallelism the worst case
    size_t FeI;        // the rows of an expert's first projection: Fe, or 2Fe when gated
} plan_sizes;

// Expert parallelism plans for the worst case: every token of the expert group sent to this rank's
// experts (min(top_k, local experts) slots each), so no exchange can outgrow the buffers.
static size_t moe_received_rows(const neox_model_desc *d, size_t N) {
    int K = d->moe_top_k, L = neox_model_local_experts(d);
    return d->ep_size > 1 ? (size_t)d->ep_size * N * (size_t)(K < L ? K : L) : N * (size_t)K;
}

static plan_sizes sizes_of(const neox_model *m) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    plan_sizes z = {(size_t)neox_model_stream_rows(m), (size_t)m->B * m->T, (size_t)d->hidden_size, (size_t)s.L, (size_t)d->head_size, (size_t)s.NH,
                    (size_t)s.NKV, 0, (size_t)s.F, 0, 0, 0, 0, 0, 0};
    z.W = (z.NH + 2 * z.NKV) * z.HS;
    z.FC = neox_activation_gated(d->activation) ? 2 * z.F : z.F;
    if (neox_model_has_moe(d)) {
        z.NK = z.N * (size_t)d->moe_top_k;
        z.E = (size_t)d->moe_experts;
        z.Fe = (size_t)d->moe_ffn_size;
        z.NR = moe_received_rows(d, z.N);
        z.FeI = (size_t)neox_model_moe_in_rows(d);
    }
    return z;
}

// Carves one slot's saved activations from *cur (backend memory) and *host_cur (host memory: the
// checkpoint store's pieces when they are kept on the host).
static void carve_saved(neox_model *m, neox_acts *a, char **cur, char **host_cur) {
    const neox_model_desc *d = &m->desc;
    plan_sizes z = sizes_of(m);
    size_t n = z.n, N = z.N, C = z.C, L = z.L, HS = z.HS, NH = z.NH, NKV = z.NKV, W = z.W, F = z.F, FC = z.FC;
    if (neox_model_recompute_store(d)) {
        a->x = take_act(m, cur, n * C);
        size_t piece = n * C / (size_t)neox_model_recompute_ways(d);
        a->kept = take_act(m, d->recompute_inputs_on_host ? host_cur : cur, L * piece);
        m->layer_input_bytes = neox_model_act_bytes(m, piece);
    } else {
        a->x = take_act(m, cur, (L + 1) * n * C);
        m->layer_input_bytes = neox_model_act_bytes(m, n * C);
    }
    size_t sets = d->checkpoint_activations ? 1 : L;
    for (size_t i = 0; i < sets; i++) {
        neox_layer_acts *la = &a->layers[i];
        char *set_begin = *cur;
        la->ln1 = take_act(m, cur, n * C);
        la->ln1_mean = take(cur, n);
        la->ln1_rstd = take(cur, n);
        la->qkv = take_act(m, cur, N * W);
        if (!neox_model_qkv_fused(d)) {
            la->q = take_act(m, cur, N * NH * HS);
            la->k = take_act(m, cur, N * NKV * HS);
            la->v = take_act(m, cur, N * NKV * HS);
        }
        if (d->qk_norm) {
            la->qraw = take_act(m, cur, N * NH * HS);
            la->kraw = take_act(m, cur, N * NKV * HS);
            la->qk_mean = neox_norm_arith(d) == NEOX_NORM_LAYERNORM ? take(cur, 2 * N * NH) : NULL;
            la->qk_rstd = take(cur, 2 * N * NH);
        }
        la->att = take_act(m, cur, N * NH * HS);
        la->lse = take(cur, N * NH);
        la->mid = d->parallel_residual ? NULL : take_act(m, cur, n * C);
        la->ln2 = take_act(m, cur, n * C);
        la->ln2_mean = take(cur, n);
        la->ln2_rstd = take(cur, n);
        la->fc = take_act(m, cur, N * FC);
        la->act = take_act(m, cur, N * F);
        if (d->checkpoint_activations ? neox_model_has_moe(d) : neox_model_moe_layer(d, d->layer_begin + (int)i)) {
            la->moe.logits = take(cur, N * z.E);
            la->moe.x = take_act(m, cur, z.NR * C);
            la->moe.h = take(cur, z.NR * z.FeI);
            la->moe.act = take(cur, z.NR * z.Fe);
            la->moe.y = take_act(m, cur, z.NK * C);
            la->moe.weight = take(cur, z.NK);
            la->moe.slot = (int *)take(cur, z.NK);
            la->moe.perm = (int *)take(cur, z.NK);
            la->moe.jx = d->moe_jitter_eps > 0.0f ? take_act(m, cur, N * C) : NULL;
        }
        // (the dense layers' set: the smallest, where MoE layers plan more and the rest counts it)
        size_t set = (size_t)(*cur - set_begin);
        if (i == 0 || set < m->layer_set_bytes) m->layer_set_bytes = set;
    }
    for (size_t i = sets; i < L; i++) a->layers[i] = a->layers[0];
    if (neox_model_last_stage(d)) {
        a->lnf = take_act(m, cur, N * C);  // whole: the output layer's input (gathered under sequence parallelism)
        a->lnf_mean = take(cur, n);
        a->lnf_rstd = take(cur, n);
        a->logits = take_act(m, cur, (size_t)m->head_rows * neox_model_head_cols(d));
        a->ce_lse = take(cur, N);
        a->mask = take(cur, N);
        a->targets = (int *)take(cur, N);
    }
    a->ids = (int *)take(cur, N);
}

// Carves the scratch all slots share.
static void carve_shared(const neox_model *m, neox_acts *a, char **cur) {
    const neox_model_desc *d = &m->desc;
    plan_sizes z = sizes_of(m);
    size_t n = z.n, N = z.N, C = z.C, HS = z.HS, NH = z.NH, NKV = z.NKV, W = z.W, F = z.F, FC = z.FC;
    size_t R = d->rotary_dims ? d->rotary_dims : 2, T = (size_t)m->T;  // (this rank's positions' rows)
    a->cos = take(cur, T * R / 2);
    a->sin = take(cur, T * R / 2);
    a->alibi = d->pos_emb == NEOX_POS_ALIBI ? take(cur, NH) : NULL;
    a->branch = take_act(m, cur, n * C);
    a->gather = neox_model_recompute_store(d) ? take_act(m, cur, n * C) : NULL;
    int seq = neox_model_seq_ways(d) > 1;
    a->seq_whole = seq ? take_act(m, cur, N * C) : NULL;
    a->seq_dnorm = seq ? take(cur, 2 * C) : NULL;
    // bf16 storage under tensor parallelism: the fp32 room its reductions sum in (the largest, dln1
    // and dln2 together; a reduce-scatter's whole and its piece)
    a->tp_sum = d->tp_size > 1 && m->act_elem != NEOX_ELEM_F32 ? take(cur, 2 * N * C + n * C) : NULL;
    a->ce_max = take(cur, N);
    a->ce_stats = (double *)take(cur, 4 * N);
    a->ce_loss = (double *)take(cur, 4);
    a->dx = take_act(m, cur, n * C);
    a->dln = take_act(m, cur, 2 * N * C);
    a->dbranch = take_act(m, cur, n * C);
    a->dqkv = take_act(m, cur, N * W);
    if (!neox_model_qkv_fused(d)) {
        a->dq = take_act(m, cur, N * NH * HS);
        a->dk = take_act(m, cur, N * NKV * HS);
        a->dv = take_act(m, cur, N * NKV * HS);
    }
    a->datt = take_act(m, cur, N * NH * HS);
    char *mlp_room = *cur;  // (the MLP backward's scratch: context parallelism's key and value gradients share it)
    a->dfc = take_act(m, cur, N * FC);
    a->dact = take_act(m, cur, N * F);
    if (neox_model_cp_ways(d) > 1) {  // the whole sequence's keys and values (context_parallel.c)
        size_t kv = (size_t)m->B * m->cp_T * NKV * HS;  // (each pair adjacent: the rotary tables' room at plan time)
        // Their gradients in the room of dfc and dact (grown to fit), which the MLP's backward uses and
        // leaves before the attention's backward of the same layer begins, and nothing else touches.
        char *room = mlp_room;
        a->cp_dk = take_act(m, &room, 2 * kv), a->cp_dv = neox_act_at(m, a->cp_dk, kv);
        if (room > *cur) *cur = room;
        a->cp_k = take_act(m, cur, 2 * kv), a->cp_v = neox_act_at(m, a->cp_k, kv);
        // bf16 storage: the fp32 room the gradients' reduce-scatter sums in (the whole, and the rank's piece)
        a->cp_sum = m->act_elem != NEOX_ELEM_F32 ? take(cur, kv + kv / (size_t)neox_model_cp_ways(d)) : NULL;
    }
    if (z.NK) {
        a->moe_dx = take_act(m, cur, z.NR * C);
        a->moe_dh = take(cur, z.NR * z.FeI);
        a->moe_dact = take(cur, z.NR * z.Fe);
        a->moe_dy = take_act(m, cur, (z.NK > z.NR ? z.NK : z.NR) * C);
        a->moe_swap = d->ep_size > 1 ? take_act(m, cur, z.NR * C) : NULL;
        a->moe_dweight = take(cur, z.NK);
        a->moe_dlogits = take(cur, N * z.E);
    }
}

// Walks the plan of every slot; with base == NULL it only counts bytes. Returns the backend bytes
// and sets *host_bytes (the host memory of checkpoints kept there, carved from host_base).
static size_t carve(neox_model *m, neox_acts *slots, void *base, void *host_base, size_t *host_bytes) {
    char *cur = base ? base : (char *)(uintptr_t)256;  // any aligned non-NULL start when counting (never dereferenced)
    char *host_cur = host_base ? host_base : (char *)(uintptr_t)256;
    char *start = cur, *host_start = host_cur;
    carve_shared(m, &slots[0], &cur);
    for (int k = 0; k < m->nslots; k++) {
        if (k > 0) {
            neox_layer_acts *layers = slots[k].layers;
            slots[k] = slots[0];  // the shared pointers
            slots[k].layers = layers;
        }
        carve_saved(m, &slots[k], &cur, &host_cur);
    }
    *host_bytes = (size_t)(host_cur - host_start);
    return (size_t)(cur - start);
}

// Host copies of per-row values (the backend's buffers may be device memory): ids, targets and the
// loss mask on their way in, the log-sum-exp and target logits when log-probabilities are asked for.
// The inputs go in from two staging sets of page-locked memory (host_alloc) by asynchronous copies
// that the forward's ops wait for on the device, not the host: while one set's copy may still be in
// the queue the next micro-batch fills the other, and a set is refilled only after its copy is done
// (which, two micro-batches on, it always is: the ops of the micro-batch between waited for it). A
// captured step holds one set per micro-batch (neox_model_set_input_sets), whose copies its replays
// make again from the same sets.
typedef struct input_stage {
    int *ids, *targets;             // (N)
    float *mask;                    // (N)
    float mask_sum;                 // the mask's sum
    int64_t ticket;                 // the last copy out of this set
} input_stage;

typedef struct host_stage {
    input_stage *in;                // (nsets)
    int nsets;
    int next_in;                    // the set the next forward fills
    float *lse;                     // (N)
    double *target_logit;           // (N)
} host_stage;

static void free_host_stage(neox_model *m) {
    host_stage *h = m->host_stage;
    if (!h) return;
    for (int k = 0; k < h->nsets; k++) {
        m->be->host_wait(h->in[k].ticket);  // (no copy may still read memory freed here)
        void *in[] = {h->in[k].ids, h->in[k].targets, h->in[k].mask};
        for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) m->be->host_free(in[i]);
    }
    free(h->in);
    free(h->lse);
    free(h->target_logit);
    free(h);
    m->host_stage = NULL;
}

static void make_host_stage(neox_model *m) {
    size_t N = (size_t)m->B * m->T;
    host_stage *h = neox_calloc(1, sizeof *h);
    h->nsets = m->input_sets > 2 ? m->input_sets : 2;
    h->in = neox_calloc((size_t)h->nsets, sizeof *h->in);
    for (int k = 0; k < h->nsets; k++) {
        h->in[k].ids = m->be->host_alloc(N * sizeof(int));
        h->in[k].targets = m->be->host_alloc(N * sizeof(int));
        h->in[k].mask = m->be->host_alloc(N * sizeof(float));
    }
    h->lse = neox_malloc(N * sizeof(float));
    h->target_logit = neox_malloc(N * sizeof(double));
    m->host_stage = h;
}

static void free_half(neox_model *m) {
    m->be->free(m->half_in);
    m->be->free(m->half_out);
    m->half_in = m->half_out = NULL;
    m->half_elems = 0;
}

void neox_model_plan_half(neox_model *m) {
    free_half(m);
    // (bf16 storage: the products read and write the activations as they are, with no 16-bit copies)
    if (m->precision == NEOX_PRECISION_FP32 || m->act_elem == NEOX_ELEM_BF16 || !m->act_buf) return;
    plan_sizes z = sizes_of(m);
    size_t V = neox_model_last_stage(&m->desc) ? (size_t)neox_model_head_cols(&m->desc) : 0;
    size_t in = z.C > z.NH * z.HS ? z.C : z.NH * z.HS, out = z.W > z.FC ? z.W : z.FC;
    in = in > z.F ? in : z.F;
    out = out > z.C ? out : z.C;
    size_t nin = z.N * in, nout = z.N * out;
    nout = nout > (size_t)m->head_rows * V ? nout : (size_t)m->head_rows * V;  // the head: one chunk's logits
    if (z.NK) {  // the experts' products over token slots (gated: 2Fe wide), the router's over tokens
        size_t wide = z.C > z.FeI ? z.C : z.FeI;
        nin = nin > z.NR * wide ? nin : z.NR * wide;
        nout = nout > z.NR * wide ? nout : z.NR * wide;
        nout = nout > z.N * z.E ? nout : z.N * z.E;
    }
    m->half_in = m->be->alloc(nin * sizeof(uint16_t));
    m->half_out = m->be->alloc(nout * sizeof(uint16_t));
    neox_model_fp8_plan(m, (int)z.N);
    m->half_elems = nin + nout;
}

void neox_model_free_plan(neox_model *m) {
    neox_acts *slots = m->slots;
    int sets = m->desc.checkpoint_activations ? 1 : neox_model_shard(&m->desc).L;
    for (int k = 0; slots && k < m->nslots; k++) {
        for (int i = 0; i < sets; i++) neox_moe_route_free(slots[k].layers[i].moe.route);
        free(slots[k].layers);
    }
    if (slots) free(slots[0].gather_counts);
    free(slots);
    if (m->act_buf) m->be->free(m->act_buf);
    free(m->recompute_inputs_host);
    m->recompute_inputs_host = NULL;
    m->recompute_inputs_host_bytes = 0;
    free_half(m);
    free_host_stage(m);
    m->slots = m->acts = NULL;
    m->act_buf = NULL;
    m->nslots = 0;
}

void neox_model_set_head_rows(neox_model *m, int rows) {
    m->head_rows_asked = rows > 0 || rows == NEOX_MODEL_HEAD_AUTO ? rows : 0;
}

void neox_model_set_fused_head(neox_model *m, int on) { m->fused_head = on != 0; }

// The rows of logits the plan holds: all N, chunks of the asked size, or (automatically) as many as
// NEOX_MODEL_HEAD_ELEMS allows, or NEOX_MODEL_HEAD_FUSED_ELEMS under the fused loss (which makes no
// chunk twice, so smaller chunks cost nothing). A value head's N values are always whole.
static int head_rows(const neox_model *m) {
    size_t N = (size_t)m->B * m->T, V = (size_t)neox_model_head_cols(&m->desc), rows = N;
    size_t limit = m->fused_head ? NEOX_MODEL_HEAD_FUSED_ELEMS : NEOX_MODEL_HEAD_ELEMS;
    if (m->head_rows_asked > 0) rows = (size_t)m->head_rows_asked;
    else if (m->head_rows_asked == NEOX_MODEL_HEAD_AUTO && N * V > limit) rows = limit / V;
    if (m->desc.value_head || rows > N) rows = N;
    return rows ? (int)rows : 1;
}

int neox_model_plan_slots(neox_model *m, int B, int T, int nslots, neox_error *err) {
    const neox_model_desc *d = &m->desc;
    if (B <= 0 || T <= 0 || nslots <= 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "model: micro-batch and sequence must be positive");
    if (d->pos_emb == NEOX_POS_LEARNED && T > d->max_positions)
        return neox_fail(err, NEOX_EXIT_USAGE, "seq_length %d exceeds max_position_embeddings %d", T, d->max_positions);
    if (neox_model_recompute_ways(d) > 1 && (size_t)B * T * d->hidden_size / (size_t)neox_model_recompute_ways(d) > INT_MAX)
        return neox_fail(err, NEOX_EXIT_USAGE, "partition_activations: a layer input of %d x %d x %d elements is too "
                         "large to all-gather", B, T, d->hidden_size);
    if (d->ep_size > 1 && neox_model_has_moe(d) && moe_received_rows(d, (size_t)B * T) * d->hidden_size > INT32_MAX)
        return neox_fail(err, NEOX_EXIT_USAGE, "expert parallelism: an all-to-all of up to %zu rows of %d elements is too "
                         "large for MPI's counts (2^31); lower micro batch size or seq_length",
                         moe_received_rows(d, (size_t)B * T), d->hidden_size);
    int P = neox_model_seq_ways(d);
    if (P > 1 && T % P != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "sequence_parallel: seq_length %d is not divisible by model_parallel_size %d",
                         T, P);
    if (P > 1 && neox_model_has_moe(d))
        return neox_fail(err, NEOX_EXIT_USAGE, "sequence_parallel with a Mixture of Experts (moe_num_experts) is not "
                         "supported");
    if (P > 1 && neox_model_recompute_store(d))
        return neox_fail(err, NEOX_EXIT_USAGE, "sequence_parallel with checkpoint_in_cpu or partition_activations is not "
                         "supported (sequence parallelism keeps 1/%d of each layer input already)", P);
    if (neox_model_cp_check(d, T, err) != 0) return -1;
    neox_model_free_plan(m);
    m->B = B;
    m->T = T / neox_model_cp_ways(d);  // this rank's rows of each sequence
    m->cp_T = T;
    m->head_rows = head_rows(m);
    m->nslots = nslots;
    neox_acts *slots = neox_calloc((size_t)nslots, sizeof *slots);
    int L = neox_model_shard(d).L;
    for (int k = 0; k < nslots; k++) slots[k].layers = neox_calloc((size_t)L, sizeof *slots[k].layers);
    m->act_bytes = carve(m, slots, NULL, NULL, &m->recompute_inputs_host_bytes);
    m->act_buf = m->be->alloc(m->act_bytes);
    m->be->memset_zero(m->act_buf, m->act_bytes);
    if (m->recompute_inputs_host_bytes) m->recompute_inputs_host = neox_calloc(m->recompute_inputs_host_bytes, 1);
    carve(m, slots, m->act_buf, m->recompute_inputs_host, &m->recompute_inputs_host_bytes);
    if (neox_model_recompute_ways(d) > 1) {
        int P = neox_model_recompute_ways(d);
        int *counts = neox_malloc((size_t)P * sizeof *counts);
        for (int r = 0; r < P; r++) counts[r] = (int)((size_t)B * T * d->hidden_size / (size_t)P);
        for (int k = 0; k < nslots; k++) slots[k].gather_counts = counts;
    }
    int sets = d->checkpoint_activations ? 1 : L;
    for (int k = 0; k < nslots; k++) {
        for (int i = 0; i < sets; i++)
            if (slots[k].layers[i].moe.logits)
                slots[k].layers[i].moe.route =
                    neox_moe_route_new(d, B * T, d->ep_size > 1 ? (int)moe_received_rows(d, (size_t)B * T) : 0);
        for (int i = sets; i < L; i++) slots[k].layers[i].moe.route = slots[k].layers[0].moe.route;
    }
    m->slots = slots;
    neox_model_use_slot(m, 0);
    make_host_stage(m);
    neox_model_plan_half(m);
    if (d->rotary_dims && neox_model_cp_ways(d) > 1) neox_model_cp_rotary_tables(m, slots[0].cos, slots[0].sin);
    else if (d->rotary_dims) m->be->rotary_tables(slots[0].cos, slots[0].sin, T, d->rotary_dims, d->rotary_base, d->rope_scaling);
    if (slots[0].alibi) {  // this rank's heads: GPT-NeoX slices the slopes by tensor-parallel rank
        int NH = neox_model_shard(d).NH;
        neox_model_fill_alibi(d, m->be, slots[0].alibi, d->tp_rank * NH, NH);
    }
    return 0;
}

int neox_model_plan(neox_model *m, int B, int T, neox_error *err) { return neox_model_plan_slots(m, B, T, 1, err); }

void neox_model_use_slot(neox_model *m, int slot) {
    m->slot = slot;
    m->acts = (neox_acts *)m->slots + slot;
}

size_t neox_model_activation_bytes(const neox_model *m) {
    return m->act_bytes + m->half_elems * sizeof(uint16_t) + neox_model_fp8_bytes(m);
}

neox_activation_layout neox_model_activation_layout(const neox_model *m) {
    const neox_model_desc *d = &m->desc;
    neox_activation_layout o = {0, m->layer_set_bytes, 0, neox_model_shard(d).L, m->nslots};
    // the input a layer keeps, and its saved set unless one set serves every layer's recomputation;
    // inputs kept on the host are not the plan's (they are "offloaded")
    size_t input = d->recompute_inputs_on_host ? 0 : m->layer_input_bytes;
    o.per_layer = input + (d->checkpoint_activations ? 0 : m->layer_set_bytes);
    o.rest = neox_model_activation_bytes(m) - (size_t)o.layers * (size_t)o.slots * o.per_layer;
    return o;
}

size_t neox_model_host_recompute_bytes(const neox_model *m) { return m->recompute_inputs_host_bytes; }

const float *neox_model_logits(const neox_model *m) { return ((const neox_acts *)m->acts)->logits; }

float *neox_model_stage_input(neox_model *m) { return neox_model_layer_input(m, 0); }

const float *neox_model_stage_output(const neox_model *m) { return neox_model_stage_out(m); }

float *neox_model_stage_output_grad(neox_model *m) { return ((neox_acts *)m->acts)->dx; }

const float *neox_model_stage_input_grad(const neox_model *m) { return ((const neox_acts *)m->acts)->dx; }

unsigned long long neox_model_dropout_seed(const neox_model *m, int layer, int site) {
    const neox_acts *a = m->acts;
    return neox_hash64(a->dropout_seed, (unsigned long long)(layer + 1) * NEOX_SITES_PER_LAYER + site);
}

void neox_model_hidden_dropout(const neox_model *m, float *out, const float *inp, int layer, int site) {
    const neox_acts *a = m->acts;
    size_t C = (size_t)m->desc.hidden_size, nC = (size_t)neox_model_stream_rows(m) * C;
    // (the rank's rows under sequence parallelism: their counters, so the masks are the whole rows')
    unsigned long long offset = (a->dropout_row0 * (unsigned long long)m->T + (unsigned long long)neox_model_stream_row0(m)) * C;
    m->be->dropout(out, inp, nC, m->desc.hidden_dropout, neox_model_dropout_seed(m, layer, site), offset,
                   a->dropout_row0_at, (unsigned long long)m->T * C, m->act_elem);
}

neox_attention_opts neox_model_attention_opts(const neox_model *m, const float *alibi, float dropout, int layer) {
    const neox_model_desc *d = &m->desc;
    const neox_acts *a = m->acts;
    int NH = neox_model_shard(d).NH;
    neox_attention_opts o = {.scale = 1.0f / sqrtf((float)d->head_size), .window = d->attn_window,
                             .dropout = dropout,
                             .seed = dropout > 0.0f ? neox_model_dropout_seed(m, layer, NEOX_SITE_ATTN_PROBS) : 0,
                             .operands = neox_attention_operands(neox_model_operand_elem(m), d->head_size),
                             .alibi = alibi, .dropout_row0 = a->dropout_row0, .dropout_head0 = d->tp_rank * NH,
                             .dropout_heads = d->num_heads, .dropout_row0_at = a->dropout_row0_at};
    neox_model_cp_query_positions(m, &o);
    return o;
}

int neox_model_qkv_fused(const neox_model_desc *d) {
    // Split instead: use_qk_layernorm's head norm reads and writes contiguous q and k. (Context
    // parallelism all-gathers the keys and values from their views: context_parallel.c.)
    return !d->qk_norm;
}

neox_qkv_bufs neox_model_qkv_bufs(const neox_model *m, float *fused, float *q, float *k, float *v) {
    const neox_model_desc *d = &m->desc;
    if (!neox_model_qkv_fused(d)) return (neox_qkv_bufs){.q = q, .k = k, .v = v};
    neox_shard s = neox_model_shard(d);
    neox_qkv_layout l = neox_qkv_fused_layout(m->T, s.NH, s.NKV, d->head_size, d->naming == NEOX_NAMES_GPT_NEOX);
    return (neox_qkv_bufs){.q = neox_act_at(m, fused, l.q_offset), .k = neox_act_at(m, fused, l.k_offset),
                           .v = neox_act_at(m, fused, l.v_offset), .views = l.strides};
}

void neox_model_fill_alibi(const neox_model_desc *d, const neox_backend *be, float *slopes, int head0, int n) {
    float *host = neox_malloc((size_t)n * sizeof *host);
    neox_alibi_slopes(host, d->num_heads, head0, n);
    be->to_device(slopes, host, (size_t)n * sizeof *host);
    free(host);
}

// Partial sums stored in bf16 are summed in fp32: widened into the fp32 scratch, reduced there and
// rounded once on the way back (a bf16 all-reduce would round at every addition).
void neox_model_tp_reduce(neox_model *m, float *x, size_t n) {
    if (!m->tp || m->tp->size <= 1) return;
    if (m->act_elem == NEOX_ELEM_F32) {
        neox_allreduce_sum(m->tp, x, n, NEOX_F32);
        return;
    }
    float *sum = ((neox_acts *)m->acts)->tp_sum;
    m->be->cast_bf16_to_f32(sum, (const uint16_t *)x, n);
    neox_allreduce_sum(m->tp, sum, n, NEOX_F32);
    m->be->cast_f32_to_bf16((uint16_t *)x, sum, n);
}

void neox_model_reduce_scatter(neox_model *m, const float *whole, float *out, size_t nC) {
    if (m->act_elem == NEOX_ELEM_F32) {
        neox_reduce_scatter_sum(m->tp, whole, out, nC, NEOX_F32);
        return;
    }
    float *sum = ((neox_acts *)m->acts)->tp_sum, *mine = sum + nC * (size_t)m->tp->size;
    m->be->cast_bf16_to_f32(sum, (const uint16_t *)whole, nC * (size_t)m->tp->size);
    neox_reduce_scatter_sum(m->tp, sum, mine, nC, NEOX_F32);
    m->be->cast_f32_to_bf16((uint16_t *)out, mine, nC);
}

const float *neox_model_seq_gather(neox_model *m, const float *local) {
    neox_acts *a = m->acts;
    if (!a->seq_whole) return local;
    neox_allgather(m->tp, local, a->seq_whole, (size_t)neox_model_stream_rows(m) * m->desc.hidden_size,
                   neox_dtype_of_elem(m->act_elem));
    return a->seq_whole;
}

// The tensor-parallel sum of the partial (N, C) rows in whole, into this rank's rows: all of them in
// place, or under sequence parallelism its n rows in out (a reduce-scatter). Returns the rows.
static float *seq_reduce(neox_model *m, float *whole, float *out) {
    size_t nC = (size_t)neox_model_stream_rows(m) * m->desc.hidden_size;
    if (neox_model_seq_ways(&m->desc) == 1) {
        neox_model_tp_reduce(m, whole, nC);
        return whole;
    }
    neox_model_reduce_scatter(m, whole, out, nC);
    return out;
}

size_t neox_model_stream_floats(const neox_model_desc *d, int B, int T) {
    return (size_t)B * T * d->hidden_size / (size_t)neox_model_seq_ways(d) / (size_t)neox_model_cp_ways(d);
}

void neox_model_norm_forward(const neox_backend *be, const neox_model_desc *d, float *out, float *mean, float *rstd,
                             const float *inp, const float *w, const float *b, int N, neox_elem act) {
    int C = d->hidden_size;
    if (d->norm == NEOX_NORM_RMSNORM) be->rmsnorm_forward(out, rstd, inp, w, N, C, d->norm_eps, act);
    else if (d->norm == NEOX_NORM_SCALENORM) be->scalenorm_forward(out, rstd, inp, w, N, C, d->norm_eps, act);
    else be->layernorm_forward(out, mean, rstd, inp, w, b, N, C, d->norm_eps, act);
}

static void norm_forward(const neox_model *m, float *out, float *mean, float *rstd, const float *inp, const float *w,
                         const float *b, int N) {
    neox_model_norm_forward(m->be, &m->desc, out, mean, rstd, inp, w, b, N, m->act_elem);
}

// A row-parallel linear: out (n, C) = the sum over tensor-parallel ranks of inp (N, IC) @ w^T
// (IC this rank's columns), then + bias once; n = N, or this rank's rows under sequence parallelism
// (the partial sums made in seq_whole and reduce-scattered).
static void row_parallel_forward(neox_model *m, float *out, const float *inp, const float *w, const float *bias, int N,
                                 int IC) {
    neox_acts *a = m->acts;
    int C = m->desc.hidden_size;
    float *partial = a->seq_whole ? a->seq_whole : out;
    neox_model_linear_forward(m, partial, inp, w, NULL, N, IC, C);
    seq_reduce(m, partial, out);
    if (bias) m->be->add_bias(out, bias, neox_model_stream_rows(m), C, m->act_elem);
}

// A branch output's hidden dropout, in place.
static void branch_dropout(neox_model *m, float *branch, int layer, int site) {
    if (m->training && m->desc.hidden_dropout > 0.0f) neox_model_hidden_dropout(m, branch, branch, layer, site);
}

// Whether a row-parallel linear's bias is added by the op that adds the branch into the residual
// stream (add_layernorm_forward's b_bias) instead of by an add_bias pass of its own: always but under
// hidden dropout, whose mask applies to the output with its bias (GPT-NeoX's dropout(out + bias) +
// residual), so the bias is added before it, and only the add and the norm are fused.
int neox_model_bias_folds(const neox_model *m) { return !(m->training && m->desc.hidden_dropout > 0.0f); }

static const float *folded_bias(const neox_model *m, const float *bias) { return neox_model_bias_folds(m) ? bias : NULL; }
static const float *own_bias(const neox_model *m, const float *bias) { return neox_model_bias_folds(m) ? NULL : bias; }

// A norm's destination and weights; out NULL: no norm.
typedef struct norm_into {
    float *out, *mean, *rstd;
    const float *w, *b;
} norm_into;

// sum = res + (branch + bias) (bias: the branch's row-parallel bias when it folds, else NULL), then
// the norm of sum into `to`, in one op over the residual stream's rows here. ScaleNorm, which has no
// fused op, runs the add alone and then its norm.
static void add_norm(neox_model *m, float *sum, const float *res, const float *branch, const float *bias, norm_into to) {
    const neox_model_desc *d = &m->desc;
    int N = neox_model_stream_rows(m), C = d->hidden_size;
    if (d->norm == NEOX_NORM_RMSNORM) {
        m->be->add_rmsnorm_forward(sum, to.out, to.rstd, res, branch, bias, to.w, N, C, d->norm_eps, m->act_elem);
        return;
    }
    int fused = neox_norm_arith(d) == NEOX_NORM_LAYERNORM;
    m->be->add_layernorm_forward(sum, fused ? to.out : NULL, to.mean, to.rstd, res, branch, bias, to.w, to.b, N, C,
                                 d->norm_eps, m->act_elem);
    if (!fused && to.out) neox_model_norm_forward(m->be, d, to.out, to.mean, to.rstd, sum, to.w, to.b, N, m->act_elem);
}

// A branch output (after hidden dropout) added into the residual and normed: add_norm of dropout(branch).
static void add_branch_norm(neox_model *m, float *sum, const float *res, float *branch, const float *bias,
                            norm_into to, int layer, int site) {
    branch_dropout(m, branch, layer, site);
    add_norm(m, sum, res, branch, bias, to);
}

// The norm that follows layer l's output, made by the layer's last add (the layer boundary): the next
// layer's first norm on this stage, or after the stage's last layer the final norm (last stage only).
// None under activation checkpointing (one set of activations serves every layer and a recomputed
// layer makes its own first norm) or when a hook gathers each unit's weights (ZeRO-3: the next unit's
// norm weights are not here yet).
static norm_into next_norm(neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    norm_into none = {0};
    if (d->checkpoint_activations || m->weights_use) return none;
    if (l + 1 < d->layer_end) {
        neox_layer_acts *la = &a->layers[l + 1 - neox_model_shard(d).l0];
        const neox_layer_params *p = &m->w.layers[l + 1];
        return (norm_into){la->ln1, la->ln1_mean, la->ln1_rstd, p->ln1_w, p->ln1_b};
    }
    if (!neox_model_last_stage(d)) return none;  // (under sequence parallelism this rank's rows, gathered by the head)
    return (norm_into){a->seq_whole ? a->seq_whole : a->lnf, a->lnf_mean, a->lnf_rstd, m->w.lnf_w, m->w.lnf_b};
}

// The layer's last add: y = res + branch (+ bias), with the next norm when next_norm makes it here.
static void finish_layer(neox_model *m, int l, float *y, const float *res, float *branch, const float *bias, int site) {
    norm_into next = next_norm(m, l);
    if (site >= 0) add_branch_norm(m, y, res, branch, bias, next, l, site);
    else add_norm(m, y, res, branch, bias, next);
    ((neox_acts *)m->acts)->norm_made = next.out ? l + 1 : -1;
}

// use_qk_layernorm: the one norm of queries and keys (same weights, statistics apart), before rotary.
static void qk_norm_forward(neox_model *m, int l, neox_layer_acts *la) {
    const neox_model_desc *d = &m->desc;
    const neox_layer_params *p = &m->w.layers[l];
    int B = m->B, T = m->T, NH = neox_model_shard(d).NH, G = neox_qk_norm_group(d, NH);
    size_t stats = (size_t)B * T * NH / G;
    float *kmean = la->qk_mean ? la->qk_mean + stats : NULL;
    m->be->head_norm_forward(la->q, la->qk_mean, la->qk_rstd, la->qraw, p->qk_norm_w, p->qk_norm_b, B, NH, T,
                             d->head_size, G, d->norm_eps, m->act_elem);
    m->be->head_norm_forward(la->k, kmean, la->qk_rstd + stats, la->kraw, p->qk_norm_w, p->qk_norm_b, B, NH, T,
                             d->head_size, G, d->norm_eps, m->act_elem);
}

void neox_model_layer_forward(neox_model *m, int l, const float *x, float *y) {
    const neox_model_desc *d = &m->desc;
    const neox_backend *be = m->be;
    neox_shard s = neox_model_shard(d);
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l - s.l0];
    const neox_layer_params *p = &m->w.layers[l];
    int B = m->B, T = m->T, N = B * T, C = d->hidden_size, NH = s.NH, NKV = s.NKV;
    int HS = d->head_size, W = (NH + 2 * NKV) * HS, F = s.F;
    int n = neox_model_stream_rows(m);  // the residual stream's rows here (N, or this rank's under sequence parallelism)

    // attention over this rank's heads, on every row (its norm made by the previous layer's last add,
    // or here)
    if (a->norm_made != l) norm_forward(m, la->ln1, la->ln1_mean, la->ln1_rstd, x, p->ln1_w, p->ln1_b, n);
    a->norm_made = -1;
    neox_model_linear_forward(m, la->qkv, neox_model_seq_gather(m, la->ln1), p->qkv_w, p->qkv_b, N, C, W);
    neox_qkv_bufs qkv = neox_model_qkv_bufs(m, la->qkv, la->q, la->k, la->v);
    if (d->qk_norm) {
        be->qkv_split(la->qraw, la->kraw, la->v, la->qkv, B, T, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX, m->act_elem);
        qk_norm_forward(m, l, la);
    } else if (!neox_model_qkv_fused(d)) {
        be->qkv_split(la->q, la->k, la->v, la->qkv, B, T, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX,
                      m->act_elem);
    }
    if (d->rotary_dims) {  // (on the fused route in place in qkv, which nothing reads before attention)
        be->rotary_apply(qkv.q, a->cos, a->sin, B, NH, T, HS, d->rotary_dims, 0, m->act_elem, qkv.views.q);
        be->rotary_apply(qkv.k, a->cos, a->sin, B, NKV, T, HS, d->rotary_dims, 0, m->act_elem, qkv.views.k);
    }
    float attn_p = m->training ? d->attention_dropout : 0.0f;
    const float *k = qkv.k, *v = qkv.v;
    int keys = neox_model_attention_keys(m, &k, &v, &qkv.views);
    neox_attention_opts o = neox_model_attention_opts(m, a->alibi, attn_p, l);
    o.views = qkv.views;
    be->attention_forward(la->att, la->lse, qkv.q, k, v, B, keys, NH, NKV, HS, o, m->act_elem);
    row_parallel_forward(m, a->branch, la->att, p->proj_w, own_bias(m, p->proj_b), N, NH * HS);

    // MLP: on ln2(x) beside attention (parallel) or on ln2(x + attention) after it (sequential); the
    // attention output's bias is added by the add into the residual stream
    norm_into ln2 = {la->ln2, la->ln2_mean, la->ln2_rstd, p->ln2_w, p->ln2_b}, no_norm = {0};
    if (d->parallel_residual) {
        add_branch_norm(m, y, x, a->branch, folded_bias(m, p->proj_b), no_norm, l, NEOX_SITE_ATTN_OUT);
        norm_forward(m, la->ln2, la->ln2_mean, la->ln2_rstd, x, p->ln2_w, p->ln2_b, n);
    } else {
        add_branch_norm(m, la->mid, x, a->branch, folded_bias(m, p->proj_b), ln2, l, NEOX_SITE_ATTN_OUT);
    }
    if (neox_model_moe_layer(d, l)) {  // GPT-NeoX adds a MoE's output without dropout (it has no bias)
        neox_model_moe_forward(m, l, &la->moe, la->ln2, a->branch, N, m->training, 0);
        finish_layer(m, l, y, la->mid, a->branch, NULL, -1);
        return;
    }
    neox_model_mlp_forward_in(m, la->act, la->fc, neox_model_seq_gather(m, la->ln2), p->fc_w, p->fc_b, N, C, F);
    row_parallel_forward(m, a->branch, la->act, p->fc2_w, own_bias(m, p->fc2_b), N, F);
    finish_layer(m, l, y, d->parallel_residual ? y : la->mid, a->branch, folded_bias(m, p->fc2_b), NEOX_SITE_MLP_OUT);
}

// Layer l's forward within the stage's: from its input into the next layer's, or the stage's output
// after the last. Under a checkpoint store the input is the gather buffer: the layer writes the
// stage's output buffer, the store keeps this rank's piece of the input, and the output becomes the
// next layer's input in the gather buffer.
static void stage_layer_forward(neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    int i = l - s.l0;
    size_t NC = (size_t)neox_model_stream_rows(m) * d->hidden_size;
    if (!neox_model_recompute_store(d)) {
        neox_model_layer_forward(m, l, neox_model_layer_input(m, i), neox_act_at(m, neox_model_layer_input(m, i), NC));
        return;
    }
    neox_acts *a = m->acts;
    neox_model_layer_forward(m, l, a->gather, a->x);
    neox_model_keep_recompute_input(m, i);
    if (i + 1 < s.L) m->be->copy(a->gather, a->x, neox_model_act_bytes(m, NC));
}

// Ids outside [0, vocab) are an error; inside, they are mapped to this rank's vocabulary rows (-1
// for rows another rank holds).
static int localise_ids(int *out, const int *ids, int N, int V, neox_shard s, const char *what, neox_error *err) {
    for (int i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= V)
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s id %d at position %d is outside the vocabulary (%d)", what, ids[i],
                             i, V);
        out[i] = ids[i] >= s.v0 && ids[i] < s.v0 + s.V ? ids[i] - s.v0 : -1;
    }
    return 0;
}

// x (B*T, C) = wte[ids] (+ wpe), the embedding_forward op's values, with the embedding used piece by
// piece (rows [v0, v1) at a time: ZeRO-3 gathers each alone). Under bf16 storage the looked-up row is
// rounded before the position row is added, one rounding more than embedding_forward's.
static void embed_in_pieces(neox_model *m, float *x, const float *wpe, int step) {
    const neox_backend *be = m->be;
    int N = m->B * m->T, C = m->desc.hidden_size, V = neox_model_embed_rows(m);
    be->memset_zero(x, neox_model_act_bytes(m, (size_t)N * C));  // (ids of another shard, < 0, stay zero rows)
    for (int v0 = 0; v0 < V; v0 += step) {
        int v1 = V - v0 < step ? V : v0 + step;
        const float *rows = m->w.wte + (size_t)v0 * C;
        neox_model_use_piece(m, rows, rows + (size_t)(v1 - v0) * C, 1);
        be->embedding_rows(x, ((const neox_acts *)m->acts)->ids, rows, v0, v1, N, C, m->act_elem);
        neox_model_use_piece(m, rows, rows + (size_t)(v1 - v0) * C, 0);
    }
    // The position table added to each sequence as one (T * C) row of bias, in the activations' storage.
    for (int b = 0; wpe && b < m->B; b++) be->add_bias(neox_act_at(m, x, (size_t)b * m->T * C), wpe, 1, m->T * C, m->act_elem);
}

// Vocab-parallel embedding: each rank looks up the ids in its rows and the partial rows are summed.
static void embed(neox_model *m) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    float *x = neox_model_layer_input(m, 0);
    float *partial = a->seq_whole ? a->seq_whole : x;  // (N, C); the sum is scattered by rows under sequence parallelism
    const float *wpe = d->tp_rank == 0 ? m->w.wpe : NULL;  // replicated: added once to the sum
    int step = neox_model_embed_piece_rows(m);
    if (step) embed_in_pieces(m, partial, wpe, step);
    else m->be->embedding_forward(partial, a->ids, m->w.wte, wpe, m->B, m->T, d->hidden_size, m->act_elem);
    seq_reduce(m, partial, x);
    if (m->training && d->hidden_dropout > 0.0f) neox_model_hidden_dropout(m, x, x, -1, NEOX_SITE_ATTN_OUT);
}

// The logits of rows [r0, r0 + rows) into a->logits: the output layer on the final norm's rows.
void neox_model_head_logits(neox_model *m, int r0, int rows) {
    neox_acts *a = m->acts;
    int C = m->desc.hidden_size, OC = neox_model_head_cols(&m->desc), step = neox_model_head_piece_rows(m);
    const float *lnf = neox_act_at(m, a->lnf, (size_t)r0 * C);
    if (!step) {
        neox_model_linear_forward(m, a->logits, lnf, m->w.lm_head, NULL, rows, C, OC);
        return;
    }
    for (int o0 = 0; o0 < OC; o0 += step) {  // the output layer in pieces (ZeRO-2 and 3)
        int o1 = OC - o0 < step ? OC : o0 + step;
        const float *w = m->w.lm_head + (size_t)o0 * C;
        neox_model_use_piece(m, w, w + (size_t)(o1 - o0) * C, 1);
        neox_model_linear_forward_cols(m, neox_act_at(m, a->logits, (size_t)o0), OC, lnf, w, rows, C, o1 - o0);
        neox_model_use_piece(m, w, w + (size_t)(o1 - o0) * C, 0);
    }
}

// The element type of the logits buffer: the activations' storage precision.
static neox_elem logits_elem(const neox_model *m) { return m->act_elem; }

// The unfused loss statistics of one chunk of logits (rows [r0, r0 + rows)): the row maxima (reduced
// over the vocab-parallel ranks here), the sums of exponentials and the target logits (this rank's
// parts, reduced with the other chunks').
static void chunk_stats(neox_model *m, int r0, int rows) {
    neox_acts *a = m->acts;
    int N = m->B * m->T, V = neox_model_shard(&m->desc).V;
    m->be->cross_entropy_row_max(a->ce_max + r0, a->logits, rows, V, m->act_elem);
    if (m->tp && m->tp->size > 1) neox_allreduce_max(m->tp, a->ce_max + r0, (size_t)rows, NEOX_F32);
    m->be->cross_entropy_row_sumexp(a->ce_stats + r0, a->logits, a->ce_max + r0, rows, V, m->act_elem);
    m->be->cross_entropy_target_logit(a->ce_stats + N + r0, a->logits, a->targets + r0, rows, V, m->act_elem);
}

// The fused loss of one chunk: its statistics and dlogits in place in one op, then the output
// layer's backward of the chunk at once. A vocab-parallel head takes two phases: the statistics of
// this rank's columns, reduced over the ranks (the maxima before the sums need them), then the
// op's second phase writes dlogits from the reduced statistics.
static void fused_chunk(neox_model *m, int r0, int rows, float scale) {
    neox_acts *a = m->acts;
    int N = m->B * m->T, V = neox_model_shard(&m->desc).V;
    float *mx = a->ce_max + r0;
    double *sum = a->ce_stats + r0, *target = a->ce_stats + N + r0;
    int split = m->tp && m->tp->size > 1;
    if (split) {
        chunk_stats(m, r0, rows);
        neox_allreduce_sum(m->tp, sum, (size_t)rows, NEOX_F64);
        neox_allreduce_sum(m->tp, target, (size_t)rows, NEOX_F64);
    }
    m->be->cross_entropy_fused(a->logits, logits_elem(m), mx, sum, target, a->targets + r0, a->mask + r0, scale,
                               a->head_scale_at, rows, V, split);
    neox_profile_scope(NEOX_PHASE_BACKWARD, -1);  // (the output layer's backward, counted as such)
    neox_model_head_chunk_backward(m, r0, rows);
    neox_profile_scope(NEOX_PHASE_FORWARD, -1);
}

// Whether this forward runs the fused loss (neox_model_set_fused_head).
static int fuses_head(const neox_model *m) {
    return m->fused_head && m->training && !m->desc.value_head && !neox_model_head_piece_rows(m);
}

// The masked sum and count of the rows' losses, assembled on the backend (cross_entropy_loss, which
// also saves the log-sum-exp for backward); only these two sums come to the host, at once or (with
// defer_loss) when the caller reads them.
static void assemble_loss(neox_model *m) {
    neox_acts *a = m->acts;
    m->be->cross_entropy_loss(a->ce_lse, a->ce_loss, a->ce_max, a->ce_stats, a->mask, m->B * m->T);
    neox_model_cp_reduce_loss(m);  // (the whole sequences' sums under context parallelism)
    if (m->defer_loss) {  // the caller reads the pair later (neox_model_loss_sums)
        m->loss = NAN;
        return;
    }
    double loss[2];  // the masked sum of the rows' losses, the sum of the mask
    m->be->to_host(loss, a->ce_loss, sizeof loss);
    m->loss = neox_mean_loss(loss[0], loss[1]);
}

// Vocab-parallel cross-entropy: the log-sum-exp from every rank's row maxima and sums, the target
// logit from the rank that holds it; the logits are never gathered. Chunk by chunk of head_rows
// rows when the plan holds fewer than N (the logits of a chunk are made here and dropped). Under
// the fused loss each chunk's dlogits and output-layer backward follow at once, scaled by
// head_loss_scale over the mask's sum (the mean's normalisation, taken on the host when the mask was
// staged: stage_inputs).
static void cross_entropy(neox_model *m) {
    neox_acts *a = m->acts;
    int N = m->B * m->T, fused = fuses_head(m);
    float scale = neox_model_head_scale(m->head_loss_scale, a->mask_sum);
    for (int r0 = 0; r0 < N; r0 += m->head_rows) {
        int rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
        neox_model_head_logits(m, r0, rows);
        if (fused) fused_chunk(m, r0, rows, scale);
        else chunk_stats(m, r0, rows);
    }
    if (!fused && m->tp && m->tp->size > 1) neox_allreduce_sum(m->tp, a->ce_stats, 2 * (size_t)N, NEOX_F64);
    a->head_done = fused;
    a->head_loss_scale = m->head_loss_scale;
    assemble_loss(m);
}

const double *neox_model_loss_sums(const neox_model *m) { return ((const neox_acts *)m->acts)->ce_loss; }

void neox_model_token_logprobs(const neox_model *m, double *out) {
    const neox_acts *a = m->acts;
    host_stage *h = m->host_stage;
    int N = m->B * m->T;
    m->be->to_host(h->lse, a->ce_lse, (size_t)N * sizeof(float));
    m->be->to_host(h->target_logit, a->ce_stats + N, (size_t)N * sizeof(double));
    for (int i = 0; i < N; i++) out[i] = h->target_logit[i] - (double)h->lse[i];
}

void neox_model_set_token_weights(neox_model *m, const float *w) {
    neox_acts *a = m->acts;
    neox_assert(!a->head_done, "token weights after a fused forward, whose output layer's backward is done");
    m->be->to_device(a->mask, w, (size_t)m->B * m->T * sizeof(float));
    a->mask_sum = (float)neox_model_loss_ranks(m);
}

void neox_model_set_input_sets(neox_model *m, int sets) {
    m->input_sets = sets;
    if (!m->host_stage) return;
    free_host_stage(m);
    make_host_stage(m);
}

void neox_model_restart_inputs(neox_model *m) { ((host_stage *)m->host_stage)->next_in = 0; }

// Context parallelism's staging: the rank's rows picked from the whole sequences given, and as the
// mask's sum the whole sequences' over the ranks of the group (each rank's backward then makes its
// share of the gradient of the whole sequences' mean, and the data group's average sums them).
static int fill_stage_rows(neox_model *m, input_stage *in, const int *ids, const int *targets, const float *loss_mask,
                           neox_error *err) {
    neox_acts *a = m->acts;
    int N = m->B * m->T, whole = m->B * m->cp_T, V = m->desc.vocab_size;
    neox_shard s = neox_model_shard(&m->desc);
    if (ids) neox_model_cp_pick_rows(m, in->ids, ids, sizeof(int));
    if (ids && localise_ids(in->ids, in->ids, N, V, s, "token", err) != 0) return -1;
    if (!targets) return 0;
    neox_model_cp_pick_rows(m, in->targets, targets, sizeof(int));
    if (localise_ids(in->targets, in->targets, N, V, s, "target", err) != 0) return -1;
    double mask_sum = 0.0;
    for (int i = 0; i < whole; i++) mask_sum += loss_mask ? loss_mask[i] : 1.0f;
    if (loss_mask) neox_model_cp_pick_rows(m, in->mask, loss_mask, sizeof(float));
    else for (int i = 0; i < N; i++) in->mask[i] = 1.0f;
    a->mask_sum = in->mask_sum = (float)(mask_sum / neox_model_cp_ways(&m->desc) * neox_model_loss_ranks(m));
    return 0;
}

// The micro-batch's ids, targets and loss mask (1 where NULL) into the next staging set (host_stage
// above); the sum of the mask, which backward scales by, is taken here in the order cross_entropy_loss
// takes it, so it never comes back from the device.
static int fill_stage(neox_model *m, input_stage *in, const int *ids, const int *targets, const float *loss_mask,
                      neox_error *err) {
    neox_acts *a = m->acts;
    int N = m->B * m->T, V = m->desc.vocab_size;
    neox_shard s = neox_model_shard(&m->desc);
    m->be->host_wait(in->ticket);  // (done long since: see host_stage)
    int cp = neox_model_cp_ways(&m->desc);
    if (cp > 1) return fill_stage_rows(m, in, ids, targets, loss_mask, err);
    if (ids && localise_ids(in->ids, ids, N, V, s, "token", err) != 0) return -1;
    if (targets && localise_ids(in->targets, targets, N, V, s, "target", err) != 0) return -1;
    if (targets) {
        double mask_sum = 0.0;
        for (int i = 0; i < N; i++) {
            in->mask[i] = loss_mask ? loss_mask[i] : 1.0f;
            mask_sum += in->mask[i];
        }
        a->mask_sum = in->mask_sum = (float)(mask_sum * neox_model_loss_ranks(m));
    }
    return 0;
}

int neox_model_fill_inputs(neox_model *m, const int *ids, const int *targets, const float *loss_mask, float *mask_sum,
                           neox_error *err) {
    host_stage *h = m->host_stage;
    if (fill_stage(m, &h->in[h->next_in], ids, targets, loss_mask, err) != 0) return -1;
    *mask_sum = ((neox_acts *)m->acts)->mask_sum;
    if (ids || targets) h->next_in = (h->next_in + 1) % h->nsets;
    return 0;
}

// The staged set's copies into the model's buffers, which the forward's ops wait for on the device.
static int stage_inputs(neox_model *m, const int *ids, const int *targets, const float *loss_mask, neox_error *err) {
    const neox_backend *be = m->be;
    neox_acts *a = m->acts;
    host_stage *h = m->host_stage;
    input_stage *in = &h->in[h->next_in];
    size_t N = (size_t)m->B * m->T;
    if (!m->inputs_staged && fill_stage(m, in, ids, targets, loss_mask, err) != 0) return -1;
    if (m->inputs_staged && targets) a->mask_sum = in->mask_sum;
    int64_t ticket = 0;
    if (ids) ticket = be->to_device_async(a->ids, in->ids, N * sizeof(int));
    if (targets) {
        be->to_device_async(a->targets, in->targets, N * sizeof(int));
        ticket = be->to_device_async(a->mask, in->mask, N * sizeof(float));
    }
    if (!ticket) return 0;
    be->device_wait(ticket);  // (copies run in order: the last covers them all)
    in->ticket = ticket;
    h->next_in = (h->next_in + 1) % h->nsets;
    return 0;
}

int neox_model_forward(neox_model *m, const int *ids, const int *targets, const float *loss_mask, neox_error *err) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    int N = m->B * m->T;
    int first = neox_model_first_stage(d), last = neox_model_last_stage(d);
    if (d->value_head) targets = NULL;  // its loss is the caller's (neox_model_values)
    if (stage_inputs(m, first ? ids : NULL, last ? targets : NULL, loss_mask, err) != 0) return -1;
    a->dropout_seed = m->dropout_seed;
    a->dropout_row0 = m->dropout_row0;
    a->dropout_row0_at = m->dropout_row0_at;
    a->head_scale_at = m->head_scale_at;
    a->head_done = 0;
    a->norm_made = -1;
    // The scope of the ops that follow, for the per-op profile (kernels/backend.h).
    neox_phase phase = m->training ? NEOX_PHASE_FORWARD : NEOX_PHASE_OTHER;
    neox_profile_scope(phase, -1);
    neox_model_refresh_weights(m);
    if (first) {
        neox_model_use_weights(m, NEOX_UNIT_EMBED, 1);
        embed(m);
        neox_model_use_weights(m, NEOX_UNIT_EMBED, 0);
    }
    for (int l = d->layer_begin; l < d->layer_end; l++) {
        neox_profile_scope(phase, l);
        neox_range_pushf("forward layer %d", l);
        neox_model_use_weights(m, NEOX_UNIT_LAYER(l), 1);
        stage_layer_forward(m, l);
        neox_model_use_weights(m, NEOX_UNIT_LAYER(l), 0);
        neox_range_pop();
    }
    neox_profile_scope(phase, -1);
    if (!last) return 0;
    neox_range_push("forward head");
    const float *out = neox_model_stage_out(m);
    neox_model_use_head(m, 1);
    int made = a->norm_made == d->layer_end;  // (by the last layer's last add)
    a->norm_made = -1;
    if (a->seq_whole) {  // the rank's rows normed, then gathered whole for the output layer
        size_t nC = (size_t)neox_model_stream_rows(m) * d->hidden_size;
        if (!made) norm_forward(m, a->seq_whole, a->lnf_mean, a->lnf_rstd, out, m->w.lnf_w, m->w.lnf_b, neox_model_stream_rows(m));
        neox_allgather(m->tp, a->seq_whole, a->lnf, nC, neox_dtype_of_elem(m->act_elem));
    } else if (!made) {
        norm_forward(m, a->lnf, a->lnf_mean, a->lnf_rstd, out, m->w.lnf_w, m->w.lnf_b, N);
    }
    int rc = 0;
    if (targets) cross_entropy(m);
    else if (m->head_rows < N)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "model: a forward without targets needs all %d rows of logits; the plan "
                       "holds %d at a time", N, m->head_rows);
    else neox_model_head_logits(m, 0, N);
    neox_model_use_head(m, 0);
    neox_range_pop();
    if (rc != 0) return rc;
    return 0;
}

void neox_model_act_to_host(const neox_model *m, float *out, const float *src, size_t n) {
    if (m->act_elem == NEOX_ELEM_F32) {
        m->be->to_host(out, src, n * sizeof(float));
        return;
    }
    uint16_t *bits = neox_malloc(n * sizeof *bits);
    m->be->to_host(bits, src, n * sizeof *bits);
    for (size_t i = 0; i < n; i++) out[i] = neox_bf16_to_f32(bits[i]);
    free(bits);
}

void neox_model_values(const neox_model *m, float *out) {
    m->be->to_host(out, ((const neox_acts *)m->acts)->logits, (size_t)m->B * m->T * sizeof(float));
}

void neox_model_set_value_grads(neox_model *m, const float *dv) {
    m->be->to_device(((neox_acts *)m->acts)->logits, dv, (size_t)m->B * m->T * sizeof(float));
}
