// generate.c: generation (lib/generate.h). The cached path runs the decoder on new positions
// only: the prompt in one pass, then one token at a time; each layer appends its rotated keys and
// values to a per-layer cache and attends over it (neox_attention_cached). The same kernels as
// the training forward compute everything else, in the same order, so the logits match
// recomputation to rounding. The recompute path calls neox_model_forward on the whole sequence.
// neox-eval scores requests through the cached path too, several requests packed one after the
// other as the rows of one pass (each a segment with its own positions and causal attention, so
// the weights are read once for all of them), taking only the rows it needs through the output
// layer. Everything runs on the model's backend (m->be); ids go up and logits come down through
// host copies. The linear layers run in the model's precision through linear.c, as the training
// forward runs them: under bfloat16 each input row is rounded to bfloat16 by the same cast and
// multiplied with the weights' bfloat16 copy (half the bytes a token streams), sums in fp32; fp16
// models generate in fp32 (their 16-bit products would widen every weight on the CPU).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "generate.h"
#include "kernels/backend.h"
#include "model_internal.h"

struct neox_generator {
    neox_model *m;
    const neox_backend *be;         // the model's
    int max_len, recompute;         // max_len: rows the scratch buffers hold (a pass)
    int max_pos;                    // the longest sequence (positions), at most max_len
    int len;                        // positions in the cache
    int cache_len;                  // positions the cache holds per layer and head: max_len, or
                                    // slots * max_pos for batched decoding
    int slots;                      // batched decoding: sequences with a cache of their own (else 0)
    int *slot_len;                  // (slots) positions in each sequence's cache
    float *slot_logits;             // (slots, vocab) host copy of each sequence's latest logits
    float *kcache, *vcache;         // per layer (NKV, cache_len, HS)
    float *cos, *sin;               // rotary tables (max_len, R/2)
    float *alibi;                   // (NH) ALiBi slopes (pos_emb alibi), else NULL
    float *qk_stats;                // (2, max_len, NH) use_qk_layernorm's statistics, else NULL
    neox_moe_bufs moe;              // Mixture of Experts: up to max_len tokens (logits NULL: none)
    // Scratch for up to max_len new positions.
    float *x, *ln, *mean, *rstd, *qkv, *q, *k, *v, *att, *lse, *branch, *mid, *fc, *act;
    uint16_t *half;                 // (max_len, max(C, ffn)) a product's input rounded to bfloat16
    int *ids;                       // (max_len) the pass's token ids on the backend
    float *logits;                  // (vocab) host copy of the last position's logits
    float *out;                     // (out_rows, vocab) logits on the backend, grown on demand
    int out_rows;
    unsigned long long draws;       // sampling draws of this completion so far
    struct team_bufs *team;         // (team_n) each team thread's buffers for a decoding step, made on first use
    int team_n;
};

// A run of consecutive rows of one pass that belong to one sequence: rows [row, row + len) are its
// positions [pos, pos + len); its position 0 is cache position base.
typedef struct segment {
    int row, len, base, pos;
} segment;

static size_t qkv_width(const neox_model_desc *d) { return (size_t)(d->num_heads + 2 * d->num_kv_heads) * d->head_size; }
static size_t fc_width(const neox_model_desc *d) { return (size_t)d->ffn_size * (neox_activation_gated(d->activation) ? 2 : 1); }

// n floats of backend memory, zeroed.
static float *zeros(const neox_backend *be, size_t n) {
    float *p = be->alloc(n * sizeof(float));
    be->memset_zero(p, n * sizeof(float));
    return p;
}

// A generator whose buffers hold max_len rows and whose sequences have at most max_pos positions;
// its cache holds `slots` sequences (0: one, positions of the pass's rows).
static neox_generator *create(neox_model *m, int max_len, int max_pos, int slots, int recompute, neox_error *err) {
    const neox_model_desc *d = &m->desc;
    if (max_pos < 2) return neox_fail(err, NEOX_EXIT_USAGE, "generation needs a context of at least 2 tokens"), NULL;
    if (d->pos_emb == NEOX_POS_LEARNED && max_pos > d->max_positions)
        return neox_fail(err, NEOX_EXIT_USAGE, "seq_length %d exceeds max_position_embeddings %d", max_pos, d->max_positions), NULL;
    neox_generator *g = neox_calloc(1, sizeof *g);
    const neox_backend *be = g->be = m->be;
    g->m = m;
    g->max_len = max_len > max_pos ? max_len : max_pos;
    g->max_pos = max_pos;
    g->recompute = recompute;
    max_len = g->max_len;
    g->slots = slots;
    g->cache_len = slots > 0 ? slots * max_pos : max_len;
    size_t T = (size_t)max_len, C = d->hidden_size, L = d->num_layers, HS = d->head_size;
    size_t kv = L * d->num_kv_heads * (size_t)g->cache_len * HS;
    g->logits = neox_malloc((size_t)d->vocab_size * sizeof(float));
    if (slots > 0) {
        g->slot_len = neox_calloc((size_t)slots, sizeof *g->slot_len);
        g->slot_logits = neox_malloc((size_t)slots * d->vocab_size * sizeof(float));
    }
    if (recompute) return g;
    g->kcache = zeros(be, kv);
    g->vcache = zeros(be, kv);
    size_t R = d->rotary_dims ? d->rotary_dims : 2;
    g->cos = zeros(be, T * R / 2);
    g->sin = zeros(be, T * R / 2);
    if (d->rotary_dims) be->rotary_tables(g->cos, g->sin, (int)T, d->rotary_dims, d->rotary_base, d->rope_scaling);
    if (d->pos_emb == NEOX_POS_ALIBI) {
        g->alibi = zeros(be, (size_t)d->num_heads);
        neox_model_fill_alibi(d, be, g->alibi, 0, d->num_heads);
    }
    g->x = zeros(be, T * C);
    g->ln = zeros(be, T * C);
    g->mean = zeros(be, T);
    g->rstd = zeros(be, T);
    g->qkv = zeros(be, T * qkv_width(d));
    g->q = zeros(be, T * d->num_heads * HS);
    g->k = zeros(be, T * d->num_kv_heads * HS);
    g->v = zeros(be, T * d->num_kv_heads * HS);
    g->att = zeros(be, T * C);
    g->lse = zeros(be, T * d->num_heads);
    g->branch = zeros(be, T * C);
    g->mid = zeros(be, T * C);
    g->fc = zeros(be, T * fc_width(d));
    g->act = zeros(be, T * d->ffn_size);
    if (d->qk_norm) g->qk_stats = zeros(be, 2 * T * d->num_heads);
    if (d->moe_experts > 1) {
        size_t NK = T * d->moe_top_k, Fe = d->moe_ffn_size;
        g->moe = (neox_moe_bufs){.logits = zeros(be, T * d->moe_experts), .x = zeros(be, NK * C),
                                 .h = zeros(be, NK * neox_model_moe_in_rows(d)), .act = zeros(be, NK * Fe), .y = zeros(be, NK * C),
                                 .weight = zeros(be, NK), .slot = (int *)zeros(be, NK), .perm = (int *)zeros(be, NK),
                                 .route = neox_moe_route_new(d, (int)T, 0)};  // no jitter: never training
    }
    if (neox_model_operand_elem(m) == NEOX_ELEM_BF16) {  // (fp8 too: generation's products are bfloat16's)
        neox_model_refresh_weights(m);  // now rather than in the first token's time
        g->half = be->alloc(T * (size_t)(d->ffn_size > d->hidden_size ? d->ffn_size : d->hidden_size) * sizeof(uint16_t));
    }
    g->ids = be->alloc(T * sizeof(int));
    return g;
}

neox_generator *neox_generator_create(neox_model *m, int max_len, int recompute, neox_error *err) {
    return create(m, max_len, max_len, 0, recompute, err);
}

neox_generator *neox_generator_create_packed(neox_model *m, int rows, int max_len, neox_error *err) {
    return create(m, rows, max_len, 0, 0, err);
}

neox_generator *neox_generator_create_batch(neox_model *m, int slots, int max_len, neox_error *err) {
    if (slots < 1 || slots > NEOX_DECODE_MAX_ROWS)
        return neox_fail(err, NEOX_EXIT_USAGE, "batched decoding of %d sequences: 1 to %d", slots, NEOX_DECODE_MAX_ROWS),
               NULL;
    return create(m, slots, max_len, slots, 0, err);
}

static void team_free(neox_generator *g);

int neox_generator_slots(const neox_generator *g) { return g->slots; }

int neox_generator_rows(const neox_generator *g) { return g->max_len; }

void neox_generator_free(neox_generator *g) {
    if (!g) return;
    float *bufs[] = {g->kcache, g->vcache, g->cos, g->sin, g->x, g->ln, g->mean, g->rstd, g->qkv, g->q, g->k,
                     g->v, g->att, g->lse, g->branch, g->mid, g->fc, g->act, (float *)g->ids, g->out, g->alibi,
                     g->qk_stats, g->moe.logits, g->moe.x, g->moe.h, g->moe.act, g->moe.y, g->moe.weight,
                     (float *)g->moe.slot, (float *)g->moe.perm, (float *)g->half};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) g->be->free(bufs[i]);
    neox_moe_route_free(g->moe.route);
    team_free(g);
    free(g->slot_len);
    free(g->slot_logits);
    free(g->logits);
    free(g);
}

// Room for rows x vocab logits on the backend.
static float *out_rows(neox_generator *g, int rows) {
    if (rows > g->out_rows) {
        if (g->out) g->be->free(g->out);
        g->out = g->be->alloc((size_t)rows * g->m->desc.vocab_size * sizeof(float));
        g->out_rows = rows;
    }
    return g->out;
}

// out (S, OC) = inp (S, IC) @ w^T (+ bias): in bfloat16 when the model's precision is (see the top).
static void linear(neox_generator *g, float *out, const float *inp, const float *w, const float *bias, int S, int IC,
                   int OC) {
    if (g->half) neox_model_linear_forward_scratch(g->m, g->half, out, inp, w, bias, S, IC, OC);
    else g->be->linear_forward(out, OC, inp, w, bias, S, IC, OC, NEOX_ELEM_F32);
}

// logits (rows, vocab; host) = inp (rows, C; backend) @ lm_head^T.
static void output_layer(neox_generator *g, float *logits, const float *inp, int rows) {
    const neox_model_desc *d = &g->m->desc;
    float *out = out_rows(g, rows);
    linear(g, out, inp, g->m->w.lm_head, NULL, rows, d->hidden_size, d->vocab_size);
    g->be->to_host(logits, out, (size_t)rows * d->vocab_size * sizeof(float));
}

const float *neox_generator_logits(const neox_generator *g) { return g->logits; }

static void norm(const neox_generator *g, float *out, float *mean, float *rstd, const float *inp, const float *w,
                 const float *b, int N) {
    neox_model_norm_forward(g->be, &g->m->desc, out, mean, rstd, inp, w, b, N, NEOX_ELEM_F32);
}

// The MLP branch of S rows of inp into g->branch.
static void mlp(neox_generator *g, int l, const float *inp, int S) {
    const neox_model_desc *d = &g->m->desc;
    const neox_layer_params *p = &g->m->w.layers[l];
    int C = d->hidden_size, F = d->ffn_size, FC = (int)fc_width(d);
    const neox_backend *be = g->be;
    norm(g, g->ln, g->mean, g->rstd, inp, p->ln2_w, p->ln2_b, S);
    if (neox_model_moe_layer(d, l)) {  // evaluation routing: each token's own top k
        neox_model_moe_forward(g->m, l, &g->moe, g->ln, g->branch, S, 0, 1);
        return;
    }
    linear(g, g->fc, g->ln, p->fc_w, p->fc_b, S, C, FC);
    neox_act_fn fn = neox_activation_function(d->activation);
    if (neox_activation_gated(d->activation)) be->gated_forward(g->act, g->fc, S, F, fn, NEOX_ELEM_F32);
    else be->activation_forward(g->act, g->fc, (size_t)S * F, fn, NEOX_ELEM_F32);
    linear(g, g->branch, g->act, p->fc2_w, p->fc2_b, S, F, C);
}

// Appends a segment's keys and values of layer l, k and v (NKV, len, HS), to its cache positions.
static void cache_append(neox_generator *g, int l, const float *k, const float *v, const segment *s) {
    const neox_model_desc *d = &g->m->desc;
    size_t HS = d->head_size, T = g->cache_len, S = s->len;
    for (int h = 0; h < d->num_kv_heads; h++) {
        size_t at = ((size_t)l * d->num_kv_heads + h) * T * HS + (size_t)(s->base + s->pos) * HS;
        g->be->copy(g->kcache + at, k + (size_t)h * S * HS, S * HS * sizeof(float));
        g->be->copy(g->vcache + at, v + (size_t)h * S * HS, S * HS * sizeof(float));
    }
}

// A segment's q, k, v of layer l (q (NH, len, HS); k, v (NKV, len, HS)) from g->qkv, normalised
// (use_qk_layernorm, with qk_stats: (2, rows, NH)) and rotated at its positions. Split, not read in
// g->qkv as training reads it: the keys and values go on into the cache's head-major rows.
static void segment_qkv(neox_generator *g, int l, const segment *s, float *q, float *k, float *v, float *qk_stats,
                        size_t rows) {
    const neox_model_desc *d = &g->m->desc;
    int NH = d->num_heads, NKV = d->num_kv_heads, HS = d->head_size, W = (int)qkv_width(d);
    size_t half = d->rotary_dims / 2;
    const neox_backend *be = g->be;
    be->qkv_split(q, k, v, g->qkv + (size_t)s->row * W, 1, s->len, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX,
                  NEOX_ELEM_F32);
    if (d->qk_norm) {  // in place, as the training forward normalises them
        const neox_layer_params *p = &g->m->w.layers[l];
        int G = neox_qk_norm_group(d, NH);
        float *mean = neox_norm_arith(d) == NEOX_NORM_LAYERNORM ? qk_stats : NULL, *rstd = qk_stats + rows * NH;
        be->head_norm_forward(q, mean, rstd, q, p->qk_norm_w, p->qk_norm_b, 1, NH, s->len, HS, G, d->norm_eps,
                              NEOX_ELEM_F32);
        be->head_norm_forward(k, mean, rstd, k, p->qk_norm_w, p->qk_norm_b, 1, NH, s->len, HS, G, d->norm_eps,
                              NEOX_ELEM_F32);
    }
    if (d->rotary_dims) {
        const float *cos = g->cos + (size_t)s->pos * half, *sin = g->sin + (size_t)s->pos * half;
        be->rotary_apply(q, cos, sin, 1, NH, s->len, HS, d->rotary_dims, 0, NEOX_ELEM_F32, (neox_head_strides){0});
        be->rotary_apply(k, cos, sin, 1, NKV, s->len, HS, d->rotary_dims, 0, NEOX_ELEM_F32, (neox_head_strides){0});
    }
}

// fp32 without dropout: the cached form's terms (kernels.h), and recomputation's the same.
static neox_attention_opts attention_opts(const neox_generator *g) {
    const neox_model_desc *d = &g->m->desc;
    return (neox_attention_opts){.scale = 1.0f / sqrtf((float)d->head_size), .window = d->attn_window,
                                 .operands = NEOX_ELEM_F32, .alibi = g->alibi};
}

// A segment's attention over its sequence's cached positions of layer l into out (len, NH, HS).
static void attend_cached(neox_generator *g, int l, const segment *s, float *out, const float *q) {
    const neox_model_desc *d = &g->m->desc;
    size_t CT = g->cache_len, at = ((size_t)l * d->num_kv_heads * CT + (size_t)s->base) * d->head_size;
    g->be->attention_cached(out, q, g->kcache + at, g->vcache + at, s->len, s->pos, d->num_heads, d->num_kv_heads,
                            d->head_size, (int)CT, attention_opts(g));
}

// Attention of one segment of layer l: its q, k, v from g->qkv, rotated at its positions, its keys
// and values into the cache, and its attention over its own cached positions into g->att.
static void attend_segment(neox_generator *g, int l, const segment *s) {
    const neox_model_desc *d = &g->m->desc;
    int NH = d->num_heads, NKV = d->num_kv_heads, HS = d->head_size;
    size_t row = (size_t)s->row;
    float *q = g->q + row * NH * HS, *k = g->k + row * NKV * HS, *v = g->v + row * NKV * HS;
    segment_qkv(g, l, s, q, k, v, g->qk_stats, (size_t)g->max_len);
    cache_append(g, l, k, v, s);
    float *out = g->att + row * d->hidden_size;
    // A segment from position 0 (a prompt, a scored request) sees only its own keys: the training
    // forward's blocked attention computes it, as recomputation does, and far faster than one query
    // row at a time.
    if (s->pos == 0) {
        g->be->attention_forward(out, g->lse, q, k, v, 1, s->len, NH, NKV, HS, attention_opts(g), NEOX_ELEM_F32);
        return;
    }
    attend_cached(g, l, s, out, q);
}

static void layer(neox_generator *g, int l, int S, const segment *segs, int nseg) {
    const neox_model_desc *d = &g->m->desc;
    const neox_layer_params *p = &g->m->w.layers[l];
    int C = d->hidden_size, W = (int)qkv_width(d);
    size_t NC = (size_t)S * C;
    const neox_backend *be = g->be;
    norm(g, g->ln, g->mean, g->rstd, g->x, p->ln1_w, p->ln1_b, S);
    linear(g, g->qkv, g->ln, p->qkv_w, p->qkv_b, S, C, W);
    for (int i = 0; i < nseg; i++) attend_segment(g, l, &segs[i]);
    linear(g, g->branch, g->att, p->proj_w, p->proj_b, S, C, C);
    be->add(g->mid, g->x, g->branch, NC, NEOX_ELEM_F32);  // x + attention
    if (d->parallel_residual) {
        mlp(g, l, g->x, S);                 // beside attention, on ln2(x)
        be->add(g->x, g->mid, g->branch, NC, NEOX_ELEM_F32);
    } else {
        mlp(g, l, g->mid, S);               // after it
        be->add(g->x, g->mid, g->branch, NC, NEOX_ELEM_F32);
    }
}

// ---- a decoding step in one parallel region ---------------------------------------------------------
// Where the backend has a thread team (kernels/backend.h, NEOX_BACKEND_TEAM), a decoding step (up
// to NEOX_DECODE_MAX_ROWS sequences, one new position each) runs in one parallel region instead of
// one per product. Every thread walks the whole step: it computes the small ops (embedding, norms,
// q/k/v split and rotary, attention over the cache, activation, residual adds) itself on its own
// buffers, which hold the same values in every thread, and the threads meet in the products, which
// split their rows among them and end in the team's barrier (shared outputs: g->qkv, g->branch,
// g->fc, the logits). One more barrier per layer lets thread 0's cache append finish before anyone
// reads the cache. So a token of an L-layer model meets 5 L + 1 barriers in one region, where the
// op-by-op step opened 4 L + 1 regions, each a wake-up and a join. Every op and each row's sum are
// the op-by-op step's: the logits are bit for bit the same. Attention over the cache is computed by
// every thread (it is small beside the weights at short contexts; see docs/performance.md).

typedef struct team_bufs {
    float *x, *ln, *mean, *rstd, *q, *k, *v, *att, *mid, *act, *qk_stats;  // (rows, ...) as g's of the same name
    uint16_t *half;
} team_bufs;

typedef struct team_step {
    neox_generator *g;
    const segment *segs;
    int S, nseg;
} team_step;

static void team_free(neox_generator *g) {
    for (int t = 0; t < g->team_n; t++) {
        team_bufs *b = &g->team[t];
        float *bufs[] = {b->x, b->ln, b->mean, b->rstd, b->q, b->k, b->v, b->att, b->mid, b->act, b->qk_stats,
                         (float *)b->half};
        for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
            if (bufs[i]) g->be->free(bufs[i]);
    }
    free(g->team);
    g->team = NULL;
    g->team_n = 0;
}

// Rows a team step may have: the generator's passes, at most NEOX_DECODE_MAX_ROWS.
static int team_rows(const neox_generator *g) { return g->max_len < NEOX_DECODE_MAX_ROWS ? g->max_len : NEOX_DECODE_MAX_ROWS; }

// Buffers for n threads (kept for later steps; remade if the team grew).
static void team_alloc(neox_generator *g, int n) {
    if (n <= g->team_n) return;
    team_free(g);
    const neox_model_desc *d = &g->m->desc;
    size_t R = (size_t)team_rows(g), C = d->hidden_size, HS = d->head_size, F = d->ffn_size;
    g->team = neox_calloc((size_t)n, sizeof *g->team);
    g->team_n = n;
    for (int t = 0; t < n; t++) {
        team_bufs *b = &g->team[t];
        *b = (team_bufs){.x = zeros(g->be, R * C), .ln = zeros(g->be, R * C), .mean = zeros(g->be, R),
                         .rstd = zeros(g->be, R), .q = zeros(g->be, R * d->num_heads * HS),
                         .k = zeros(g->be, R * d->num_kv_heads * HS), .v = zeros(g->be, R * d->num_kv_heads * HS),
                         .att = zeros(g->be, R * C), .mid = zeros(g->be, R * C), .act = zeros(g->be, R * F)};
        if (d->qk_norm) b->qk_stats = zeros(g->be, 2 * R * d->num_heads);
        if (g->half) b->half = g->be->alloc(R * (F > C ? F : C) * sizeof(uint16_t));
    }
}

// Whether a pass can run as a team step: a decoding step (every segment continues its sequence)
// of few enough rows, all of whose logits are wanted, on a backend with a team of two or more, and
// no Mixture-of-Experts layer (its routing has no team form).
static int team_fits(const neox_generator *g, const segment *segs, int nseg, int S, int last) {
    if (!g->be->team_run || S > team_rows(g) || last != S || g->m->desc.moe_experts > 1) return 0;
    for (int i = 0; i < nseg; i++)
        if (segs[i].pos == 0) return 0;
    return g->be->team_threads() > 1;
}

static void team_linear(neox_generator *g, team_bufs *b, float *out, const float *inp, const float *w,
                        const float *bias, int S, int IC, int OC) {
    neox_model_linear_team(g->m, b->half, out, inp, w, bias, S, IC, OC);
}

// The MLP branch of S rows of inp (this thread's) into g->branch.
static void team_mlp(neox_generator *g, team_bufs *b, int l, const float *inp, int S) {
    const neox_model_desc *d = &g->m->desc;
    const neox_layer_params *p = &g->m->w.layers[l];
    int C = d->hidden_size, F = d->ffn_size;
    norm(g, b->ln, b->mean, b->rstd, inp, p->ln2_w, p->ln2_b, S);
    team_linear(g, b, g->fc, b->ln, p->fc_w, p->fc_b, S, C, (int)fc_width(d));
    neox_act_fn fn = neox_activation_function(d->activation);
    if (neox_activation_gated(d->activation)) g->be->gated_forward(b->act, g->fc, S, F, fn, NEOX_ELEM_F32);
    else g->be->activation_forward(b->act, g->fc, (size_t)S * F, fn, NEOX_ELEM_F32);
    team_linear(g, b, g->branch, b->act, p->fc2_w, p->fc2_b, S, F, C);
}

// Layer l of a team step on thread `thread`: the op-by-op layer's ops in its order.
static void team_layer(const team_step *st, team_bufs *b, int l, int thread) {
    neox_generator *g = st->g;
    const neox_model_desc *d = &g->m->desc;
    const neox_layer_params *p = &g->m->w.layers[l];
    int C = d->hidden_size, NH = d->num_heads, NKV = d->num_kv_heads, HS = d->head_size, S = st->S;
    size_t NC = (size_t)S * C;
    norm(g, b->ln, b->mean, b->rstd, b->x, p->ln1_w, p->ln1_b, S);
    team_linear(g, b, g->qkv, b->ln, p->qkv_w, p->qkv_b, S, C, (int)qkv_width(d));
    for (int i = 0; i < st->nseg; i++) {
        const segment *s = &st->segs[i];
        size_t row = (size_t)s->row;
        segment_qkv(g, l, s, b->q + row * NH * HS, b->k + row * NKV * HS, b->v + row * NKV * HS, b->qk_stats,
                    (size_t)team_rows(g));
        if (thread == 0) cache_append(g, l, b->k + row * NKV * HS, b->v + row * NKV * HS, s);
    }
    g->be->team_barrier();  // the new keys and values are in the cache
    for (int i = 0; i < st->nseg; i++) {
        const segment *s = &st->segs[i];
        attend_cached(g, l, s, b->att + (size_t)s->row * C, b->q + (size_t)s->row * NH * HS);
    }
    team_linear(g, b, g->branch, b->att, p->proj_w, p->proj_b, S, C, C);
    g->be->add(b->mid, b->x, g->branch, NC, NEOX_ELEM_F32);  // x + attention
    team_mlp(g, b, l, d->parallel_residual ? b->x : b->mid, S);
    g->be->add(b->x, b->mid, g->branch, NC, NEOX_ELEM_F32);
}

// One thread's walk of a team step: embedding, the layers, the final norm and the logits (g->out).
static void team_body(void *ctx, int thread, int threads) {
    (void)threads;
    const team_step *st = ctx;
    neox_generator *g = st->g;
    const neox_model_desc *d = &g->m->desc;
    const neox_model_weights *w = &g->m->w;
    team_bufs *b = &g->team[thread];
    int C = d->hidden_size;
    for (int i = 0; i < st->nseg; i++) {
        const segment *s = &st->segs[i];
        const float *wpe = w->wpe ? w->wpe + (size_t)s->pos * C : NULL;
        g->be->embedding_forward(b->x + (size_t)s->row * C, g->ids + s->row, w->wte, wpe, 1, s->len, C, NEOX_ELEM_F32);
    }
    for (int l = 0; l < d->num_layers; l++) team_layer(st, b, l, thread);
    norm(g, b->ln, b->mean, b->rstd, b->x, w->lnf_w, w->lnf_b, st->S);
    team_linear(g, b, g->out, b->ln, w->lm_head, NULL, st->S, C, d->vocab_size);
}

// The team form of forward_segments (same results): logits (S, vocab; host) and the final norm's
// rows in g->ln.
static void forward_team(neox_generator *g, const segment *segs, int nseg, int S, float *logits) {
    const neox_model_desc *d = &g->m->desc;
    team_alloc(g, g->be->team_threads());
    out_rows(g, S);
    team_step st = {g, segs, S, nseg};
    g->be->team_run(team_body, &st);
    g->be->copy(g->ln, g->team[0].ln, (size_t)S * d->hidden_size * sizeof(float));
    g->be->to_host(logits, g->out, (size_t)S * d->vocab_size * sizeof(float));
}

// Runs the S rows of ids, cut into segments, through the decoder with the cache, and the final
// norm of the last `last` rows into g->ln; their logits into logits (last, vocab) unless it is NULL.
static void forward_segments(neox_generator *g, const int32_t *ids, int S, const segment *segs, int nseg, int last,
                             float *logits) {
    const neox_model_desc *d = &g->m->desc;
    const neox_model_weights *w = &g->m->w;
    int C = d->hidden_size;
    if (g->half) neox_model_refresh_weights(g->m);  // the bfloat16 copy, when the weights changed since
    g->be->to_device(g->ids, ids, (size_t)S * sizeof(int));
    if (logits && team_fits(g, segs, nseg, S, last)) {
        forward_team(g, segs, nseg, S, logits);
        return;
    }
    for (int i = 0; i < nseg; i++) {
        const float *wpe = w->wpe ? w->wpe + (size_t)segs[i].pos * C : NULL;
        g->be->embedding_forward(g->x + (size_t)segs[i].row * C, g->ids + segs[i].row, w->wte, wpe, 1, segs[i].len, C,
                                 NEOX_ELEM_F32);
    }
    for (int l = 0; l < d->num_layers; l++) layer(g, l, S, segs, nseg);
    const float *rows = g->x + (size_t)(S - last) * C;
    norm(g, g->ln, g->mean, g->rstd, rows, w->lnf_w, w->lnf_b, last);
    if (logits) output_layer(g, logits, g->ln, last);
}

// S new tokens of the one sequence being generated, at positions g->len...
static void forward_cached_rows(neox_generator *g, const int32_t *ids, int S, int last, float *logits) {
    segment s = {0, S, 0, g->len};
    forward_segments(g, ids, S, &s, 1, last, logits);
    g->len += S;
}

static void forward_cached(neox_generator *g, const int32_t *ids, int S) { forward_cached_rows(g, ids, S, 1, g->logits); }

static int check_ids(const neox_generator *g, const int32_t *ids, int n, neox_error *err) {
    if (g->recompute) return neox_fail(err, NEOX_EXIT_FAILURE, "scoring needs a generator with a KV cache");
    int V = g->m->desc.vocab_size;
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return neox_fail(err, NEOX_EXIT_FAILURE, "token id %d at position %d is outside the vocabulary (%d)", ids[i], i, V);
    return 0;
}

int neox_generator_score(neox_generator *g, const int32_t *ids, int n, int last, neox_error *err) {
    if (n < 1 || n > g->max_pos || last < 1 || last > n)
        return neox_fail(err, NEOX_EXIT_FAILURE, "scoring %d of %d positions with a context of %d", last, n, g->max_pos);
    if (check_ids(g, ids, n, err) != 0) return -1;
    g->len = 0;
    forward_cached_rows(g, ids, n, last, NULL);
    return 0;
}

int neox_generator_score_packed(neox_generator *g, const int32_t *ids, const int *lens, int nseq, neox_error *err) {
    segment *segs = neox_malloc((size_t)(nseq > 0 ? nseq : 1) * sizeof *segs);
    int total = 0;
    for (int i = 0; i < nseq; i++) {
        if (lens[i] < 1 || lens[i] > g->max_pos || lens[i] > g->max_len - total) {
            free(segs);
            return neox_fail(err, NEOX_EXIT_FAILURE, "scoring a sequence of %d positions after %d rows: a context of %d "
                             "positions and passes of %d rows", lens[i], total, g->max_pos, g->max_len);
        }
        segs[i] = (segment){total, lens[i], total, 0};
        total += lens[i];
    }
    int rc = nseq < 1 ? neox_fail(err, NEOX_EXIT_FAILURE, "scoring no sequences") : check_ids(g, ids, total, err);
    if (rc == 0) {
        g->len = 0;
        forward_segments(g, ids, total, segs, nseq, total, NULL);
        g->len = total;
    }
    free(segs);
    return rc;
}

void neox_generator_rows_logits(neox_generator *g, const int *rows, int count, float *logits) {
    size_t C = g->m->desc.hidden_size;
    for (int i = 0; i < count; i++) g->be->copy(g->branch + i * C, g->ln + (size_t)rows[i] * C, C * sizeof(float));
    output_layer(g, logits, g->branch, count);
}

void neox_generator_score_logits(neox_generator *g, int j, int count, float *logits) {
    output_layer(g, logits, g->ln + (size_t)j * g->m->desc.hidden_size, count);
}

// ---- batched decoding ------------------------------------------------------------------------------
// Sequence `slot` keeps its cache at positions [slot * max_pos, (slot + 1) * max_pos) of each
// layer's; a pass is one segment per sequence.
static int check_slot(const neox_generator *g, int slot, neox_error *err) {
    if (g->slots < 1) return neox_fail(err, NEOX_EXIT_FAILURE, "not a batched decoder");
    if (slot < 0 || slot >= g->slots) return neox_fail(err, NEOX_EXIT_FAILURE, "sequence slot %d of %d", slot, g->slots);
    return 0;
}

int neox_generator_prefill(neox_generator *g, int slot, const int32_t *prompt, int n, neox_error *err) {
    if (check_slot(g, slot, err) != 0) return -1;
    if (n < 1 || n >= g->max_pos)
        return neox_fail(err, NEOX_EXIT_USAGE, "the prompt has %d tokens; the context holds %d, leaving no room to generate",
                         n, g->max_pos);
    if (check_ids(g, prompt, n, err) != 0) return -1;
    size_t V = g->m->desc.vocab_size;
    segment seg = {0, n, slot * g->max_pos, 0};
    forward_segments(g, prompt, n, &seg, 1, 1, g->slot_logits + (size_t)slot * V);
    g->slot_len[slot] = n;
    return 0;
}

int neox_generator_decode(neox_generator *g, const int *slots, const int32_t *tokens, int count, neox_error *err) {
    if (count < 1 || count > g->slots) return neox_fail(err, NEOX_EXIT_FAILURE, "decoding %d sequences of %d", count, g->slots);
    segment segs[NEOX_DECODE_MAX_ROWS];
    for (int i = 0; i < count; i++) {
        if (check_slot(g, slots[i], err) != 0) return -1;
        for (int j = 0; j < i; j++)
            if (slots[j] == slots[i]) return neox_fail(err, NEOX_EXIT_FAILURE, "sequence slot %d twice in one step", slots[i]);
        int len = g->slot_len[slots[i]];
        if (len < 1 || len >= g->max_pos)
            return neox_fail(err, NEOX_EXIT_FAILURE, "sequence slot %d holds %d of %d positions", slots[i], len, g->max_pos);
        segs[i] = (segment){i, 1, slots[i] * g->max_pos, len};
    }
    if (check_ids(g, tokens, count, err) != 0) return -1;
    size_t V = g->m->desc.vocab_size;
    float *rows = neox_malloc((size_t)count * V * sizeof *rows);
    forward_segments(g, tokens, count, segs, count, count, rows);
    for (int i = 0; i < count; i++) {
        memcpy(g->slot_logits + (size_t)slots[i] * V, rows + (size_t)i * V, V * sizeof *rows);
        g->slot_len[slots[i]]++;
    }
    free(rows);
    return 0;
}

const float *neox_generator_slot_logits(const neox_generator *g, int slot) {
    return g->slot_logits + (size_t)slot * g->m->desc.vocab_size;
}

int neox_generator_slot_len(const neox_generator *g, int slot) { return g->slot_len[slot]; }

static int forward_recompute(neox_generator *g, const int32_t *seq, int n, neox_error *err) {
    neox_model *m = g->m;
    if ((m->B != 1 || m->T != n || !m->acts) && neox_model_plan(m, 1, n, err) != 0) return -1;
    if (neox_model_forward(m, (const int *)seq, NULL, NULL, err) != 0) return -1;
    neox_model_act_to_host(m, g->logits, neox_act_at(m, neox_model_logits(m), (size_t)(n - 1) * m->desc.vocab_size),
                           (size_t)m->desc.vocab_size);
    return 0;
}

// ---- choosing the next token ---------------------------------------------------------------------
typedef struct scored {
    float logit;
    int id;
} scored;

static int by_logit_desc(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id - y->id;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

// GPT-NeoX's sampling: logits / temperature, then top-k (drop logits below the k-th largest),
// then top-p (drop the tokens after the cumulative probability first exceeds p, always keeping
// the most likely), softmax and one multinomial draw.
int neox_sample_token(const float *logits, int V, const neox_sampling *s, unsigned long long *draws) {
    if (s->vocab > 0 && s->vocab < V) V = s->vocab;
    if (s->temperature == 0.0 && s->top_k == 0 && s->top_p == 0.0) return argmax(logits, V);
    scored *c = neox_malloc((size_t)V * sizeof *c);
    for (int i = 0; i < V; i++) c[i] = (scored){s->temperature > 0.0 ? (float)(logits[i] / s->temperature) : logits[i], i};
    qsort(c, (size_t)V, sizeof *c, by_logit_desc);
    int keep = V;
    if (s->top_k > 0 && s->top_k < V) {
        keep = s->top_k;
        while (keep < V && c[keep].logit == c[s->top_k - 1].logit) keep++;  // ties with the k-th stay
    }
    double mx = c[0].logit, sum = 0.0;
    for (int i = 0; i < keep; i++) sum += exp(c[i].logit - mx);
    if (s->top_p > 0.0) {
        double cum = 0.0;
        for (int i = 0; i < keep; i++) {
            cum += exp(c[i].logit - mx) / sum;
            if (cum > s->top_p) {
                keep = i + 1;
                break;
            }
        }
        sum = 0.0;
        for (int i = 0; i < keep; i++) sum += exp(c[i].logit - mx);
    }
    double u = neox_uniform(s->seed, (*draws)++) * sum, acc = 0.0;
    int chosen = c[keep - 1].id;
    for (int i = 0; i < keep; i++) {
        acc += exp(c[i].logit - mx);
        if (u < acc) {
            chosen = c[i].id;
            break;
        }
    }
    free(c);
    return chosen;
}

int neox_generate(neox_generator *g, const int32_t *prompt, int nprompt, int max_new, const neox_sampling *s,
                  const int32_t *stop, int nstop, neox_generation *out, neox_error *err) {
    return neox_generate_hooked(g, prompt, nprompt, max_new, s, stop, nstop, NULL, NULL, out, err);
}

int neox_generate_hooked(neox_generator *g, const int32_t *prompt, int nprompt, int max_new, const neox_sampling *s,
                         const int32_t *stop, int nstop, neox_token_hook hook, void *ctx, neox_generation *out,
                         neox_error *err) {
    *out = (neox_generation){0};
    if (nprompt < 1) return neox_fail(err, NEOX_EXIT_USAGE, "the prompt has no tokens");
    if (nprompt >= g->max_pos)
        return neox_fail(err, NEOX_EXIT_USAGE, "the prompt has %d tokens; the context holds %d, leaving no room to generate",
                         nprompt, g->max_pos);
    int V = g->m->desc.vocab_size;
    for (int i = 0; i < nprompt; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return neox_fail(err, NEOX_EXIT_USAGE, "prompt token %d is outside the vocabulary (%d)", prompt[i], V);
    int32_t *seq = neox_malloc((size_t)g->max_len * sizeof *seq);
    memcpy(seq, prompt, (size_t)nprompt * sizeof *seq);
    int n = nprompt, rc = 0;
    out->tokens = neox_malloc(((size_t)max_new + 1) * sizeof *out->tokens);
    if (s->keep_logits) out->logits = neox_malloc(((size_t)max_new + 1) * (size_t)V * sizeof *out->logits);
    g->len = 0;
    g->draws = 0;  // each completion draws from its own seed (s->seed)
    if (g->recompute) rc = forward_recompute(g, seq, n, err);
    else forward_cached(g, seq, n);
    while (rc == 0 && out->n < max_new && n < g->max_pos) {
        int32_t next = neox_sample_token(g->logits, V, s, &g->draws);
        if (s->keep_logits) memcpy(out->logits + (size_t)out->n * V, g->logits, (size_t)V * sizeof *g->logits);
        out->tokens[out->n++] = next;
        seq[n++] = next;
        int stopped = 0;
        for (int i = 0; i < nstop; i++) stopped |= next == stop[i];
        if (hook && hook(ctx, out->tokens, out->n, g->logits)) stopped = 1;
        if (stopped) {
            out->finished = 1;
            break;
        }
        if (out->n == max_new || n == g->max_pos) break;
        if (g->recompute) rc = forward_recompute(g, seq, n, err);
        else forward_cached(g, &next, 1);
    }
    free(seq);
    return rc;
}
