// context_parallel.c: context parallelism (docs/parallel.md, "Context parallel"). The cp ranks of a
// context group share each sequence: it is cut into 2 cp chunks of c = T / (2 cp) positions and rank
// i holds chunks i and 2 cp - 1 - i, so every rank has as much causal attention work as any other
// (an early chunk sees few keys, its partner late in the sequence many). Everything but attention
// works on the rank's own rows: the rows know their global positions (the rotary tables are picked
// at them; ALiBi and the causal mask take them from the attention options). Attention all-gathers
// the layer's keys and values over the group (Llama 3's way) and reduce-scatters their gradients in
// backward: one collective each way per tensor, simpler than passing blocks round a ring (which
// overlaps each block's transfer with the attention on the one before), and cheap while keys and
// values (2 NKV of NH + 2 NKV heads' worth of the QKV output) are small against attention's work.
// Backward gathers them again rather than keeping every layer's whole keys and values. The rank's
// queries, keys and values stay where the fused QKV projection wrote them (the all-gather copies
// its keys and values out of their views, the reduce-scatter's sums go back into dqkv's), so the
// plan holds nothing per rank beyond one rank's share but the whole keys and values of the layer
// at work and their gradients (4 B NKV T HS elements), whose rooms also serve as the collectives'
// rank-major stages and, at plan time, for the whole sequence's rotary tables. Under bf16
// activation storage the keys and values travel in bf16 (the stored values), while the gradients'
// reduce-scatter sums in fp32, as the tensor-parallel reductions do: each rank's whole gradient is
// rounded once (the attention's output) and the sum over the group once more.
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"

// Positions per chunk; this rank's two chunks' first positions.
static int chunk_len(const neox_model *m) { return m->cp_T / (2 * neox_model_cp_ways(&m->desc)); }
static int first_chunk(const neox_model *m) { return m->desc.cp_rank * chunk_len(m); }
static int second_chunk(const neox_model *m) {
    return (2 * neox_model_cp_ways(&m->desc) - 1 - m->desc.cp_rank) * chunk_len(m);
}

// The elements of one rank's keys (or values), the all-gather's piece.
static size_t kv_elems(const neox_model *m) {
    return (size_t)m->B * neox_model_shard(&m->desc).NKV * m->T * m->desc.head_size;
}

int neox_model_cp_check(const neox_model_desc *d, int T, neox_error *err) {
    int cp = neox_model_cp_ways(d);
    if (cp == 1) return 0;
    if (T % (2 * cp) != 0)
        return neox_fail(err, NEOX_EXIT_USAGE, "key 'context_parallel_size': seq_length %d is not divisible by 2 x "
                         "context_parallel_size (%d chunks of the sequence)", T, 2 * cp);
    const char *key = NULL, *why = NULL;
    if (d->sequence_parallel) key = "sequence_parallel", why = "not implemented together; use one of them";
    else if (d->moe_experts > 1) key = "moe_num_experts", why = "a Mixture of Experts is not implemented with it";
    else if (d->attention_dropout > 0.0f)
        key = "attention_dropout", why = "attention-probability dropout is not implemented with it; use 0";
    else if (d->pos_emb == NEOX_POS_LEARNED)
        key = "pos_emb", why = "learned position embeddings are not implemented with it; use rotary or alibi";
    else if (d->partition_recompute_inputs || d->recompute_inputs_on_host)
        key = "partition_activations", why = "kept layer inputs (partition_activations, checkpoint_in_cpu) are not "
                                             "implemented with it";
    else if (d->value_head) key = "train_impl", why = "a reward model's value head is not implemented with it";
    if (!key) return 0;
    return neox_fail(err, NEOX_EXIT_USAGE, "key 'context_parallel_size' %d with %s: %s", cp, key, why);
}

void neox_model_cp_query_positions(const neox_model *m, neox_attention_opts *o) {
    if (neox_model_cp_ways(&m->desc) == 1) return;
    o->q_rows = m->T;
    o->q_split = chunk_len(m);
    o->q_pos0 = first_chunk(m);
    o->q_pos1 = second_chunk(m);
}

void neox_model_cp_pick_rows(const neox_model *m, void *dst, const void *src, size_t elem) {
    size_t c = (size_t)chunk_len(m), T = (size_t)m->T, whole = (size_t)m->cp_T;
    for (int b = 0; b < m->B; b++) {
        char *out = (char *)dst + (size_t)b * T * elem;
        const char *in = (const char *)src + (size_t)b * whole * elem;
        memcpy(out, in + (size_t)first_chunk(m) * elem, c * elem);
        memcpy(out + c * elem, in + (size_t)second_chunk(m) * elem, c * elem);
    }
}

void neox_model_cp_rotary_tables(neox_model *m, float *cos, float *sin) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    size_t half = (size_t)d->rotary_dims / 2, c = (size_t)chunk_len(m), row = half * sizeof(float);
    // The whole sequence's tables are made in the whole keys' and values' room (2 B NKV cp_T HS
    // elements of at least 2 bytes hold 2 cp_T R/2 floats, R <= HS), and the rank's rows copied out.
    size_t W = (size_t)m->cp_T;
    neox_assert(2 * W * half * sizeof(float) <= neox_model_act_bytes(m, 2 * kv_elems(m) * (size_t)neox_model_cp_ways(d)),
                "context parallelism: the rotary tables outgrow their room");
    float *whole[2] = {(float *)a->cp_k, (float *)a->cp_k + W * half}, *mine[2] = {cos, sin};
    m->be->rotary_tables(whole[0], whole[1], m->cp_T, d->rotary_dims, d->rotary_base, d->rope_scaling);
    for (int t = 0; t < 2; t++) {
        m->be->copy(mine[t], whole[t] + (size_t)first_chunk(m) * half, c * row);
        m->be->copy(mine[t] + c * half, whole[t] + (size_t)second_chunk(m) * half, c * row);
    }
}

// Between the all-gather's rank-major rows, stage: (cp, B, H, T, HS) with each rank's two chunks in
// its T rows, and the whole sequence in position order, whole: (B, H, cp_T, HS); elements in the
// model's storage. to_whole picks the direction.
static void rearrange(neox_model *m, void *whole, void *stage, int H, int to_whole) {
    int cp = neox_model_cp_ways(&m->desc), HS = m->desc.head_size;
    size_t e = neox_elem_size(m->act_elem), c = (size_t)chunk_len(m), T = (size_t)m->T, W = (size_t)m->cp_T;
    size_t bytes = c * HS * e;
    for (int r = 0; r < cp; r++)
        for (int bh = 0; bh < m->B * H; bh++) {
            char *rows = (char *)stage + (((size_t)r * m->B * H + bh) * T) * HS * e;
            char *seq = (char *)whole + (size_t)bh * W * HS * e;
            size_t at[2] = {(size_t)r * c, (size_t)(2 * cp - 1 - r) * c};
            for (int k = 0; k < 2; k++) {
                char *mine = rows + (size_t)k * c * HS * e, *there = seq + at[k] * HS * e;
                if (to_whole) m->be->copy(there, mine, bytes);
                else m->be->copy(mine, there, bytes);
            }
        }
}

// dst = src for this rank's keys or values (or their gradients), (B, NKV, T, HS) each laid out by
// its strides (all zero: contiguous; else a view of the fused QKV buffer). A view's heads go one
// strided 2-D copy each (copy_matrix, whose 4-byte units also carry bf16 pairs when the rows and
// their strides are whole units), else row by row.
static void copy_heads(neox_model *m, void *dst, neox_head_strides ds, const void *src, neox_head_strides ss) {
    int B = m->B, H = neox_model_shard(&m->desc).NKV, T = m->T, HS = m->desc.head_size;
    size_t e = neox_elem_size(m->act_elem), row = (size_t)HS * e;
    if (neox_head_strides_is_contiguous(ds, H, T, HS) && neox_head_strides_is_contiguous(ss, H, T, HS)) {
        m->be->copy(dst, src, kv_elems(m) * e);
        return;
    }
    ds = neox_head_strides_of(ds, H, T, HS), ss = neox_head_strides_of(ss, H, T, HS);
    int units = row % 4 == 0 && ds.row * e % 4 == 0 && ss.row * e % 4 == 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            char *d = (char *)dst + (b * ds.batch + h * ds.head) * e;
            const char *s = (const char *)src + (b * ss.batch + h * ss.head) * e;
            if (units) {
                m->be->copy_matrix((float *)d, (int)(ds.row * e / 4), (const float *)s, (int)(ss.row * e / 4), T,
                                   (int)(row / 4));
                continue;
            }
            for (int t = 0; t < T; t++) m->be->copy(d + t * ds.row * e, s + t * ss.row * e, row);
        }
}

// The whole sequence's keys (or values) into whole from this rank's, mine (laid out by s): a
// contiguous copy of them goes to whole's front, the all-gather reads it from there into the stage
// (cp_dk's room, free until the attention's backward writes it) and the rearranging overwrites it.
static void gather_whole(neox_model *m, void *whole, const float *mine, neox_head_strides s) {
    neox_acts *a = m->acts;
    int NKV = neox_model_shard(&m->desc).NKV;
    const void *piece = mine;
    if (!neox_head_strides_is_contiguous(s, NKV, m->T, m->desc.head_size)) {
        copy_heads(m, whole, (neox_head_strides){0, 0, 0}, mine, s);
        piece = whole;
    }
    neox_allgather(m->cp, piece, a->cp_dk, kv_elems(m), neox_dtype_of_elem(m->act_elem));  // the stored values
    rearrange(m, whole, a->cp_dk, NKV, 1);
}

void neox_model_cp_gather_kv(neox_model *m, const float *k, const float *v, neox_qkv_strides views) {
    neox_acts *a = m->acts;
    gather_whole(m, a->cp_k, k, views.k);
    gather_whole(m, a->cp_v, v, views.v);
}

// The sum over the group of every rank's whole gradient (in stage, rank-major), this rank's piece into
// out: in fp32, through fp32 room under bf16 storage (as neox_model_reduce_scatter sums).
static void scatter_sum(neox_model *m, const void *stage, float *out) {
    neox_acts *a = m->acts;
    size_t n = kv_elems(m);
    if (m->act_elem == NEOX_ELEM_F32) {
        neox_reduce_scatter_sum(m->cp, stage, out, n, NEOX_F32);
        return;
    }
    float *whole = a->cp_sum, *mine = whole + n * (size_t)m->cp->size;
    m->be->cast_bf16_to_f32(whole, (const uint16_t *)stage, n * (size_t)m->cp->size);
    neox_reduce_scatter_sum(m->cp, whole, mine, n, NEOX_F32);
    m->be->cast_f32_to_bf16((uint16_t *)out, mine, n);
}

// This rank's piece of the group's sum of the whole gradients in grad, into dst (laid out by s). The
// whole keys and values are spent by then: the rank-major stage goes in cp_k's room and a piece that
// dst cannot take as it is (a view) in cp_v's.
static void scatter_whole(neox_model *m, float *dst, void *grad, neox_head_strides s) {
    neox_acts *a = m->acts;
    int NKV = neox_model_shard(&m->desc).NKV;
    int contiguous = neox_head_strides_is_contiguous(s, NKV, m->T, m->desc.head_size);
    rearrange(m, grad, a->cp_k, NKV, 0);
    scatter_sum(m, a->cp_k, contiguous ? dst : a->cp_v);
    if (!contiguous) copy_heads(m, dst, s, a->cp_v, (neox_head_strides){0, 0, 0});
}

void neox_model_cp_scatter_dkv(neox_model *m, float *dk, float *dv, neox_qkv_strides views) {
    neox_acts *a = m->acts;
    scatter_whole(m, dk, a->cp_dk, views.k);
    scatter_whole(m, dv, a->cp_dv, views.v);
}

void neox_model_cp_reduce_loss(neox_model *m) {
    if (neox_model_cp_ways(&m->desc) == 1) return;
    neox_allreduce_sum(m->cp, ((neox_acts *)m->acts)->ce_loss, 2, NEOX_F64);
}

int neox_model_attention_keys(neox_model *m, const float **k, const float **v, neox_qkv_strides *views) {
    if (neox_model_cp_ways(&m->desc) == 1) return m->T;
    neox_acts *a = m->acts;
    neox_model_cp_gather_kv(m, *k, *v, *views);
    *k = a->cp_k, *v = a->cp_v;
    views->k = views->v = (neox_head_strides){0, 0, 0};  // (gathered whole: contiguous)
    return m->cp_T;
}

void neox_model_attention_key_grads(neox_model *m, float **dk, float **dv) {
    if (neox_model_cp_ways(&m->desc) == 1) return;
    neox_acts *a = m->acts;
    *dk = a->cp_dk, *dv = a->cp_dv;
}
