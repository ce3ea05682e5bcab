// backward.c: the backward pass, layer by layer in reverse, adding into the gradient buffer. With
// activation checkpointing each layer's forward is first recomputed from its saved input, made whole
// again first when the checkpoint store keeps it partitioned or on the host (dropout masks come from
// counter-based seeds, so the recomputation is identical). Under tensor
// parallelism the gradient entering each column-parallel linear's input is a partial sum, reduced
// over the tensor-parallel group before the (replicated) norm's backward; replicated parameters
// get the same gradient on every rank. Under sequence parallelism the mirror of forward's exchanges:
// each row-parallel linear's output gradient is all-gathered, each column-parallel linear's input
// gradient reduce-scattered to this rank's rows (in place of the all-reduce), and the norms'
// weight gradients, made from this rank's rows only, all-reduced over the group. Each linear layer computes its weight gradients before its
// input gradient, and after every operation that finishes parameters (and after the long ones that
// finish none) the grads_ready hook is told which became final, so the data-parallel reduction of a
// bucket starts as early as possible and the communication in flight is progressed often (MPI moves
// non-blocking collectives only inside its calls).
#include <math.h>

#include "kernels/backend.h"
#include "model_internal.h"

// dsum: the residual gradient's column sums (a row-parallel bias's gradient, residual_bias_grad), or NULL.
static void norm_backward_rows(const neox_model *m, float *dinp, float *dw, float *db, float *dsum, const float *dout,
                               const float *inp, const float *w, const float *mean, const float *rstd, int N) {
    const neox_model_desc *d = &m->desc;
    if (d->norm == NEOX_NORM_RMSNORM)
        m->be->rmsnorm_backward(dinp, dw, dsum, dout, inp, w, rstd, N, d->hidden_size, m->act_elem);
    else if (d->norm == NEOX_NORM_SCALENORM)
        m->be->scalenorm_backward(dinp, dw, dout, inp, w, rstd, N, d->hidden_size, d->norm_eps, m->act_elem);
    else m->be->layernorm_backward(dinp, dw, db, dsum, dout, inp, w, mean, rstd, N, d->hidden_size, m->act_elem);
}

// Whether the norms' backward passes make the row-parallel biases' gradients, the column sums of the
// residual gradient they write (kernels.h, layernorm_backward's dsum), in place of a pass of the
// linear's own over the same rows: when the forward folds the biases into the residual add (no hidden
// dropout: with it the bias's gradient is the masked gradient's sum), without sequence parallelism
// (the norm has this rank's rows only, the linear all of them gathered) and for the norms that have
// the sums (LayerNorm, RMSNorm).
static int norm_sums_bias(const neox_model *m) {
    return neox_model_bias_folds(m) && !((const neox_acts *)m->acts)->seq_dnorm && m->desc.norm != NEOX_NORM_SCALENORM;
}

// The gradient of layer l's output bias (the second MLP projection's) when the norm backward that
// completes the gradient of the layer's output makes it: that norm is the next layer's first on this
// stage, or the final norm. NULL when the linear's backward makes it (norm_sums_bias, the previous
// stage's last layer, a Mixture of Experts, no bias).
static float *out_bias_by_norm(const neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    if (!norm_sums_bias(m) || l < d->layer_begin || neox_model_moe_layer(d, l)) return NULL;
    if (l + 1 >= d->layer_end && !neox_model_last_stage(d)) return NULL;
    return m->g.layers[l].fc2_b;
}

// The attention output's bias gradient when layer l's second norm makes it (a sequential residual:
// the gradient of x + attention is what that norm's backward completes).
static float *attn_bias_by_norm(const neox_model *m, int l) {
    return norm_sums_bias(m) && !m->desc.parallel_residual ? m->g.layers[l].proj_b : NULL;
}

// A linear's bias gradient for its own backward: db, unless a norm made it.
static float *unless_made(float *db, const float *by_norm) { return by_norm ? NULL : db; }

// A norm's backward over the residual stream's rows on this rank. Under sequence parallelism its
// weight (and bias) gradients from these rows are summed over the tensor-parallel group before they
// are added: every rank then holds the whole gradient of the replicated weights (dsum is NULL there).
static void norm_backward(neox_model *m, float *dinp, float *dw, float *db, float *dsum, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd) {
    neox_acts *a = m->acts;
    int n = neox_model_stream_rows(m), C = m->desc.hidden_size;
    if (!a->seq_dnorm) {
        norm_backward_rows(m, dinp, dw, db, dsum, dout, inp, w, mean, rstd, n);
        return;
    }
    float *sw = a->seq_dnorm, *sb = db ? a->seq_dnorm + C : NULL;
    size_t count = m->desc.norm == NEOX_NORM_SCALENORM ? 1 : (size_t)C;  // (scalenorm: one scalar)
    m->be->memset_zero(a->seq_dnorm, 2 * (size_t)C * sizeof(float));
    norm_backward_rows(m, dinp, sw, sb, NULL, dout, inp, w, mean, rstd, n);
    neox_allreduce_sum(m->tp, a->seq_dnorm, sb ? 2 * (size_t)C : count, NEOX_F32);
    m->be->add_inplace(dw, sw, count);
    if (sb) m->be->add_inplace(db, sb, (size_t)C);
}

// The input gradient of a column-parallel linear, partial sums of (N, C) rows, as the rows of the
// residual stream here: all-reduced in place, or under sequence parallelism reduce-scattered into
// seq_whole's piece `slot` (two may be live at once: parallel residual's dln1 and dln2).
static const float *reduce_input_grad(neox_model *m, float *partial, int slot) {
    neox_acts *a = m->acts;
    size_t nC = (size_t)neox_model_stream_rows(m) * m->desc.hidden_size;
    if (!a->seq_whole) {
        neox_model_tp_reduce(m, partial, nC);
        return partial;
    }
    float *out = neox_act_at(m, a->seq_whole, (size_t)slot * nC);
    neox_model_reduce_scatter(m, partial, out, nC);
    return out;
}

// The gradient reaching a branch output through its hidden dropout: dx itself, or a masked copy.
static const float *branch_grad(neox_model *m, const float *dx, float *scratch, int layer, int site) {
    if (!m->training || m->desc.hidden_dropout <= 0.0f) return dx;
    neox_model_hidden_dropout(m, scratch, dx, layer, site);
    return scratch;
}

static void grads_ready(neox_model *m, int begin, int end) {
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, begin, end);
}

// Lets the hook progress communication between operations that finish no parameter.
static void poll(neox_model *m) { grads_ready(m, 0, 0); }

// The index of the parameter whose gradient starts at g (a view into grad_buf).
static int param_at(const neox_model *m, const float *g) {
    size_t offset = (size_t)(g - m->grad_buf);
    int lo = 0, hi = m->nparams - 1;
    while (lo < hi) {  // the last parameter starting at or before offset
        int mid = (lo + hi + 1) / 2;
        if (m->params[mid].offset <= offset) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// A linear layer's backward: its weight and bias gradients, which are then final as parameters
// [begin, end), before its input gradient (when wanted).
static void linear_backward(neox_model *m, int begin, int end, float *dinp, float *dw, float *db, const float *dout,
                            const float *inp, const float *w, int N, int IC, int OC) {
    neox_model_linear_backward_weights(m, dw, db, dout, inp, N, IC, OC);
    grads_ready(m, begin, end);
    // (Cutting this product into row blocks with polls between would progress reductions during
    // it too, but the GEMM's result for a row depends on how many rows it is given: measured, an
    // overlapped run doing that differed from one without overlap in the last bits.)
    if (dinp) neox_model_linear_backward_input(m, dinp, dout, w, N, IC, OC);
}

// Layer l's parameters, in buffer order (both namings): norm 1, norm 2, QKV, attention output,
// first and second MLP projections, each with its biases; index i starts group i. A parameter-free
// norm's groups are empty (its gradient views point outside grad_buf, at the model's sink).
enum { GROUP_LN1, GROUP_LN2, GROUP_QKV, GROUP_PROJ, GROUP_FC, GROUP_FC2, GROUP_END };
static void layer_groups(const neox_model *m, int l, int *first) {
    const neox_layer_params *g = &m->g.layers[l];
    first[GROUP_LN1] = m->layer_first_param[l];
    first[GROUP_QKV] = param_at(m, g->qkv_w);
    first[GROUP_LN2] = neox_norm_weights(&m->desc) ? param_at(m, g->ln2_w) : first[GROUP_QKV];
    first[GROUP_PROJ] = param_at(m, g->proj_w);
    first[GROUP_END] = m->layer_first_param[l + 1];
    // A Mixture of Experts: the router and experts, all final at once (as group FC).
    first[GROUP_FC] = param_at(m, g->router_w ? g->router_w : g->fc_w);
    first[GROUP_FC2] = g->router_w ? first[GROUP_END] : param_at(m, g->fc2_w);
}

// MLP branch: from the gradient of its output to dln2 (this rank's partial sum of it).
static void mlp_backward(neox_model *m, int l, const int *group, const float *dy, float *dln2) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l - s.l0];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    int N = m->B * m->T, C = d->hidden_size, F = s.F;
    int FC = neox_activation_gated(d->activation) ? 2 * F : F;
    dy = neox_model_seq_gather(m, dy);
    linear_backward(m, group[GROUP_FC2], group[GROUP_END], NULL, g->fc2_w, unless_made(g->fc2_b, out_bias_by_norm(m, l)),
                    dy, la->act, p->fc2_w, N, F, C);
    float *fc_db = neox_model_mlp_backward_act(m, a->dfc, a->dact, g->fc_b, dy, p->fc2_w, la->fc, N, F, C);
    linear_backward(m, group[GROUP_FC], group[GROUP_FC2], dln2, g->fc_w, fc_db, a->dfc, neox_model_seq_gather(m, la->ln2),
                    p->fc_w, N, C, FC);
}

// Attention branch: from the gradient of its output to dln1 (this rank's partial sum of it).
static void attention_backward(neox_model *m, int l, const int *group, const float *dy, float *dln1) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l - s.l0];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    int B = m->B, T = m->T, N = B * T, C = d->hidden_size, NH = s.NH, NKV = s.NKV;
    int HS = d->head_size, W = (NH + 2 * NKV) * HS;
    dy = neox_model_seq_gather(m, dy);
    linear_backward(m, group[GROUP_PROJ], group[GROUP_FC], a->datt, g->proj_w,
                    unless_made(g->proj_b, attn_bias_by_norm(m, l)), dy, la->att, p->proj_w, N, NH * HS, C);
    float attn_p = m->training ? d->attention_dropout : 0.0f;
    // On the fused route q, k, v are read in qkv and their gradients written into dqkv's views.
    neox_qkv_bufs x = neox_model_qkv_bufs(m, la->qkv, la->q, la->k, la->v);
    neox_qkv_bufs dx = neox_model_qkv_bufs(m, a->dqkv, a->dq, a->dk, a->dv);
    const float *k = x.k, *v = x.v;
    float *dk = dx.k, *dv = dx.v;
    int keys = neox_model_attention_keys(m, &k, &v, &x.views);
    neox_model_attention_key_grads(m, &dk, &dv);
    neox_attention_opts o = neox_model_attention_opts(m, a->alibi, attn_p, l);
    o.views = x.views;
    m->be->attention_backward(dx.q, dk, dv, a->datt, x.q, k, v, la->att, la->lse, B, keys, NH, NKV, HS, o,
                              m->act_elem);
    if (dk != dx.k) neox_model_cp_scatter_dkv(m, dx.k, dx.v, dx.views);
    poll(m);
    if (d->rotary_dims) {
        m->be->rotary_apply(dx.q, a->cos, a->sin, B, NH, T, HS, d->rotary_dims, 1, m->act_elem, dx.views.q);
        m->be->rotary_apply(dx.k, a->cos, a->sin, B, NKV, T, HS, d->rotary_dims, 1, m->act_elem, dx.views.k);
    }
    if (d->qk_norm) {  // in place: the gradients of q and k before their norm
        int G = neox_qk_norm_group(d, NH);
        size_t stats = (size_t)B * T * NH / G;
        const float *kmean = la->qk_mean ? la->qk_mean + stats : NULL;
        m->be->head_norm_backward(a->dq, g->qk_norm_w, g->qk_norm_b, a->dq, la->qraw, p->qk_norm_w, la->qk_mean,
                                  la->qk_rstd, B, NH, T, HS, G, m->act_elem);
        m->be->head_norm_backward(a->dk, g->qk_norm_w, g->qk_norm_b, a->dk, la->kraw, p->qk_norm_w, kmean,
                                  la->qk_rstd + stats, B, NH, T, HS, G, m->act_elem);
    }
    if (!neox_model_qkv_fused(d))
        m->be->qkv_merge(a->dqkv, a->dq, a->dk, a->dv, B, T, NH, NKV, HS, d->naming == NEOX_NAMES_GPT_NEOX,
                         m->act_elem);
    linear_backward(m, group[GROUP_QKV], group[GROUP_PROJ], dln1, g->qkv_w, g->qkv_b, a->dqkv,
                    neox_model_seq_gather(m, la->ln1), p->qkv_w, N, C, W);
}

// a->dx holds the gradient of x[l + 1] on entry and of x[l] on return.
static void layer_backward(neox_model *m, int l) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    neox_acts *a = m->acts;
    neox_layer_acts *la = &a->layers[l - s.l0];
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    size_t NC = (size_t)m->B * m->T * d->hidden_size;
    float *dln1 = a->dln, *dln2 = neox_act_at(m, a->dln, NC);  // (N, C) each: partial sums over the tensor-parallel group
    int group[GROUP_END + 1];
    layer_groups(m, l, group);
    if (neox_model_recompute_store(d)) neox_model_fetch_recompute_input(m, l - s.l0);
    const float *x = neox_model_layer_input(m, l - s.l0);
    if (d->checkpoint_activations) {  // the recomputed output is not needed: it goes to scratch
        neox_model_layer_forward(m, l, x, a->dbranch);
        poll(m);
    }
    if (neox_model_moe_layer(d, l)) {  // no dropout on its output
        neox_model_moe_backward(m, l, &la->moe, la->ln2, a->dx, dln2, a->dbranch);
        grads_ready(m, group[GROUP_FC], group[GROUP_END]);
        if (d->ep_size > 1) {  // this rank's experts, laid out after the dense parameters
            int first = param_at(m, g->experts_w);
            grads_ready(m, first, first + 2 * neox_model_local_experts(d));
        }
    } else {
        mlp_backward(m, l, group, branch_grad(m, a->dx, a->dbranch, l, NEOX_SITE_MLP_OUT), dln2);
    }
    if (d->parallel_residual) {
        // Both branches read d x[l+1] before either norm adds its part into it; one reduction
        // completes both partial sums.
        attention_backward(m, l, group, branch_grad(m, a->dx, a->dbranch, l, NEOX_SITE_ATTN_OUT), dln1);
        const float *d2, *d1;
        if (a->seq_whole) {
            d2 = reduce_input_grad(m, dln2, 1);
            d1 = reduce_input_grad(m, dln1, 0);
        } else {
            neox_model_tp_reduce(m, a->dln, 2 * NC);
            d2 = dln2, d1 = dln1;
        }
        norm_backward(m, a->dx, g->ln2_w, g->ln2_b, NULL, d2, x, p->ln2_w, la->ln2_mean, la->ln2_rstd);
        grads_ready(m, group[GROUP_LN2], group[GROUP_QKV]);
        norm_backward(m, a->dx, g->ln1_w, g->ln1_b, out_bias_by_norm(m, l - 1), d1, x, p->ln1_w, la->ln1_mean,
                      la->ln1_rstd);
    } else {
        // (a MoE's input gradient is whole on every rank; sequence parallelism refuses MoE layers)
        const float *d2 = neox_model_moe_layer(d, l) ? dln2 : reduce_input_grad(m, dln2, 0);
        norm_backward(m, a->dx, g->ln2_w, g->ln2_b, attn_bias_by_norm(m, l), d2, la->mid, p->ln2_w, la->ln2_mean,
                      la->ln2_rstd);
        grads_ready(m, group[GROUP_LN2], group[GROUP_QKV]);
        attention_backward(m, l, group, branch_grad(m, a->dx, a->dbranch, l, NEOX_SITE_ATTN_OUT), dln1);
        norm_backward(m, a->dx, g->ln1_w, g->ln1_b, out_bias_by_norm(m, l - 1), reduce_input_grad(m, dln1, 0), x,
                      p->ln1_w, la->ln1_mean, la->ln1_rstd);
    }
    grads_ready(m, group[GROUP_LN1], group[GROUP_LN2]);
}

// The output layer is used in pieces of head_grad_rows vocabulary rows when the caller asked for it
// and the layer is a parameter of its own, the last dense one: forward's logits, and backward's
// weight gradient (each piece then final and reported, so its reduction starts while the next is
// computed) and input gradient (the pieces' shares added in order).
int neox_model_head_piece_rows(const neox_model *m) {
    if (m->head_grad_rows <= 0 || !m->grad_range_ready || m->g.lm_head == m->g.wte || m->desc.value_head) return 0;
    int out = param_at(m, m->g.lm_head);
    if (out + 1 != m->dense_params || m->g.lm_head != m->grad_buf + m->params[out].offset) return 0;
    return m->head_grad_rows < neox_model_head_cols(&m->desc) ? m->head_grad_rows : 0;
}

void neox_model_head_range(const neox_model *m, size_t *begin, size_t *end) {
    *begin = (size_t)(m->w.lm_head - m->param_buf);
    *end = *begin + (size_t)neox_model_head_cols(&m->desc) * (size_t)m->desc.hidden_size;
}

int neox_model_embed_rows(const neox_model *m) { return (int)(m->params[0].numel / (size_t)m->desc.hidden_size); }

// The input embedding is used in pieces with the output layer, when it is a parameter of its own,
// the first (its forward reads only the rows of the ids; its backward reads no weights).
int neox_model_embed_piece_rows(const neox_model *m) {
    if (!neox_model_head_piece_rows(m) || !neox_model_first_stage(&m->desc) || m->w.wte != m->param_buf) return 0;
    return m->head_grad_rows < neox_model_embed_rows(m) ? m->head_grad_rows : 0;
}

void neox_model_use_piece(neox_model *m, const float *begin, const float *end, int use) {
    if (m->weights_piece)
        m->weights_piece(m->weights_use_ctx, (size_t)(begin - m->param_buf), (size_t)(end - m->param_buf), use);
}

// Rows [r0, r0 + rows) of the output layer's backward, piece by piece; the last rows finish its
// weight gradient.
static void head_backward_in_pieces(neox_model *m, int r0, int rows, int last) {
    neox_acts *a = m->acts;
    int C = m->desc.hidden_size, OC = neox_model_head_cols(&m->desc), step = neox_model_head_piece_rows(m);
    const float *lnf = neox_act_at(m, a->lnf, (size_t)r0 * C);
    size_t base = (size_t)(m->g.lm_head - m->grad_buf);
    for (int o0 = 0; o0 < OC; o0 += step) {
        int o1 = OC - o0 < step ? OC : o0 + step;
        const float *w = m->w.lm_head + (size_t)o0 * C;
        neox_model_use_piece(m, w, w + (size_t)(o1 - o0) * C, 1);
        neox_model_linear_backward_weight_rows(m, m->g.lm_head, a->logits, lnf, rows, C, OC, o0, o1, o0 == 0);
        if (last) m->grad_range_ready(m->grads_ready_ctx, base + (size_t)o0 * C, base + (size_t)o1 * C);
        neox_model_linear_backward_input_rows(m, neox_act_at(m, a->dln, (size_t)r0 * C), a->logits, m->w.lm_head, rows, C, OC, o0, o1);
        neox_model_use_piece(m, w, w + (size_t)(o1 - o0) * C, 0);
        poll(m);
    }
}

size_t neox_model_grad_fill_elems(const neox_model *m) {
    size_t fill = 0, touched = (size_t)m->B * m->T * m->desc.hidden_size;
    for (int p = 0; p < m->nparams; p++) {
        size_t n = m->params[p].numel;
        const float *g = m->grad_buf + m->params[p].offset;
        if (g == m->g.wte && g != m->g.lm_head && touched < n) n = touched;  // a scatter into the rows of the ids
        if (g == m->g.lm_head && neox_model_head_piece_rows(m)) n = (size_t)m->head_grad_rows * m->desc.hidden_size;
        if (n > fill) fill = n;
    }
    return fill;
}

void neox_model_head_chunk_backward(neox_model *m, int r0, int rows) {
    neox_acts *a = m->acts;
    int C = m->desc.hidden_size, OC = neox_model_head_cols(&m->desc);
    const float *lnf = neox_act_at(m, a->lnf, (size_t)r0 * C);
    neox_model_linear_backward_weights(m, m->g.lm_head, NULL, a->logits, lnf, rows, C, OC);
    neox_model_linear_backward_input(m, neox_act_at(m, a->dln, (size_t)r0 * C), a->logits, m->w.lm_head, rows, C, OC);
}

// From the loss to the gradient of the stage's output: cross-entropy over this rank's
// vocabulary (or the given gradient of a value head's values), the output layer (its input
// gradient reduced) and the final norm.
static void head_backward(neox_model *m, float loss_scale) {
    const neox_model_desc *d = &m->desc;
    neox_shard s = neox_model_shard(d);
    neox_acts *a = m->acts;
    int N = m->B * m->T, C = d->hidden_size;
    int OC = neox_model_head_cols(d);
    // The head's parameters are the final norm's, then the output layer's; with tied weights on
    // one stage the output layer is the embedding, which is final only after the embedding's
    // backward.
    int head = m->layer_first_param[d->num_layers], out = param_at(m, m->g.lm_head);
    if (out < head) out = m->dense_params;
    if (d->value_head) {
        // The values' gradient was set by neox_model_set_value_grads.
        m->be->scale(a->logits, (size_t)N, neox_model_head_scale(loss_scale, (float)neox_model_loss_ranks(m)));
        linear_backward(m, out, m->dense_params, a->dln, m->g.lm_head, NULL, a->logits, a->lnf, m->w.lm_head, N, C, OC);
    } else if (a->head_done) {
        // The fused forward made the output layer's gradients (for the same loss_scale).
        neox_assert(loss_scale == a->head_loss_scale, "backward's loss scale %g is not the fused forward's %g",
                    (double)loss_scale, (double)a->head_loss_scale);
        grads_ready(m, out, m->dense_params);
    } else {
        // Chunk by chunk of head_rows rows (one chunk when the plan holds every row's logits, which
        // are then still there from forward): dlogits in place, then the chunk's share of the
        // output layer's weight gradient and its rows of the input gradient.
        float scale = neox_model_head_scale(loss_scale, a->mask_sum);
        for (int r0 = 0; r0 < N; r0 += m->head_rows) {
            int rows = N - r0 < m->head_rows ? N - r0 : m->head_rows;
            if (m->head_rows < N) neox_model_head_logits(m, r0, rows);
            m->be->cross_entropy_backward(a->logits, a->logits, a->ce_lse + r0, a->targets + r0, a->mask + r0, scale,
                                          a->head_scale_at, rows, s.V, m->act_elem);
            const float *lnf = neox_act_at(m, a->lnf, (size_t)r0 * C);
            if (neox_model_head_piece_rows(m)) {
                head_backward_in_pieces(m, r0, rows, r0 + rows >= N);
            } else if (r0 + rows < N) {
                neox_model_head_chunk_backward(m, r0, rows);
                poll(m);
            } else {  // the last chunk finishes the output layer's gradient
                linear_backward(m, out, m->dense_params, neox_act_at(m, a->dln, (size_t)r0 * C), m->g.lm_head, NULL, a->logits, lnf,
                                m->w.lm_head, rows, C, OC);
            }
        }
    }
    // A vocabulary shard's input gradient is a partial sum; the replicated value head's is whole
    // (under sequence parallelism this rank's rows of it are taken).
    const float *dlnf = a->dln;
    if (!d->value_head) dlnf = reduce_input_grad(m, a->dln, 0);
    else dlnf = neox_act_at(m, dlnf, (size_t)neox_model_stream_row0(m) * C);
    a->head_done = 0;
    m->be->memset_zero(a->dx, neox_model_act_bytes(m, (size_t)neox_model_stream_rows(m) * d->hidden_size));
    norm_backward(m, a->dx, m->g.lnf_w, m->g.lnf_b, out_bias_by_norm(m, d->layer_end - 1), dlnf,
                  neox_model_stage_out(m), m->w.lnf_w, a->lnf_mean, a->lnf_rstd);
    grads_ready(m, head, out);
}

void neox_model_backward(neox_model *m, float loss_scale) {
    const neox_model_desc *d = &m->desc;
    neox_acts *a = m->acts;
    neox_profile_scope(NEOX_PHASE_BACKWARD, -1);  // (the per-op profile's scope: kernels/backend.h)
    if (neox_model_last_stage(d)) {
        neox_range_push("backward head");
        neox_model_use_head(m, 1);
        head_backward(m, loss_scale);
        neox_model_use_head(m, 0);
        neox_range_pop();
    }
    for (int l = d->layer_end - 1; l >= d->layer_begin; l--) {
        neox_profile_scope(NEOX_PHASE_BACKWARD, l);
        neox_range_pushf("backward layer %d", l);
        neox_model_use_weights(m, NEOX_UNIT_LAYER(l), 1);
        layer_backward(m, l);
        neox_model_use_weights(m, NEOX_UNIT_LAYER(l), 0);
        neox_range_pop();
    }
    neox_profile_scope(NEOX_PHASE_BACKWARD, -1);
    if (neox_model_first_stage(d)) {  // (otherwise the caller sends a->dx to the previous stage)
        if (m->training && d->hidden_dropout > 0.0f) neox_model_hidden_dropout(m, a->dx, a->dx, -1, NEOX_SITE_ATTN_OUT);
        const float *dx = neox_model_seq_gather(m, a->dx);  // (every row's, for the rows of the ids)
        m->be->embedding_backward(m->g.wte, m->g.wpe, dx, a->ids, m->B, m->T, d->hidden_size, m->act_elem);
        grads_ready(m, 0, m->layer_first_param[0]);
    }
    // What follows a backward, until the next forward, is the update: the gradients' reduction,
    // norm and clipping, and the optimizer.
    neox_profile_scope(NEOX_PHASE_OPTIMIZER, -1);
}
