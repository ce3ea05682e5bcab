// moe.c: GPT-NeoX's dropless Mixture of Experts (megatron/model/moe.py, router.py, moe_mlp.py). A
// router (a bias-free linear, hidden -> experts) scores every token; each token goes to top_k
// experts, none is dropped, and the layer's output is the experts' outputs weighted by their
// scores. The routing decisions are made on the host from the router's logits (N x E numbers):
//   sinkhorn (training): experts by the Sinkhorn-balanced scores (GPT-NeoX's three iterations,
//     tolerance 1e-4), weights the sigmoid (top_k 1) or softmax of the logits at those experts;
//   sinkhorn (evaluation) and topk: the top_k of those scores (topk always uses softmax).
// Weights are not renormalised (GPT-NeoX does not) unless moe_topk_renormalize asks for Mixtral's
// rule (topk router: the chosen softmax weights divided by their sum). Experts are GPT-NeoX's
// ungated act(x w1^T) w2^T or, with a gated activation, its grouped LLaMA MLP and Mixtral's
// (f(x w1^T) * (x w3^T)) w2^T. The experts run as one GEMM each over their rows; tokens move with
// gather_rows and moe_combine. GPT-NeoX has no load-balancing loss in this MoE (docs/model.md,
// "Mixture of Experts").
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "model_internal.h"
#include "parallel.h"

int neox_model_has_moe(const neox_model_desc *d) {
    for (int l = d->layer_begin; l < d->layer_end; l++)
        if (neox_model_moe_layer(d, l)) return 1;
    return 0;
}

neox_moe_route *neox_moe_route_new(const neox_model_desc *d, int N, int exchange_rows) {
    size_t NK = (size_t)N * d->moe_top_k, NE = (size_t)N * d->moe_experts;
    neox_moe_route *r = neox_calloc(1, sizeof *r);
    r->expert = neox_malloc(NK * sizeof(int));
    r->slot = neox_malloc(NK * sizeof(int));
    r->perm = neox_malloc(NK * sizeof(int));
    r->count = neox_malloc((size_t)d->moe_experts * sizeof(int));
    r->weight = neox_malloc(NK * sizeof(float));
    r->dweight = neox_malloc(NK * sizeof(float));
    r->scores = neox_malloc(NE * sizeof(float));
    r->dlogits = neox_malloc(NE * sizeof(float));
    r->balanced = neox_malloc(NE * sizeof(double));
    if (exchange_rows > 0) {
        r->x = neox_moe_exchange_new(d->ep_size, neox_model_local_experts(d), exchange_rows);
        r->from = neox_malloc((size_t)d->moe_experts * sizeof(int));
    }
    return r;
}

void neox_moe_route_free(neox_moe_route *r) {
    if (!r) return;
    void *all[] = {r->expert, r->slot, r->perm, r->count, r->weight, r->dweight, r->scores, r->dlogits, r->balanced};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) free(all[i]);
    neox_moe_exchange_free(r->x);
    free(r->from);
    if (r->device_index) r->index_be->free(r->device_index);
    free(r);
}

// GPT-NeoX's SinkhornRouter.sinkhorn on cost = exp(logits) (N, E): returns d1 * cost * d0 in bal.
static void sinkhorn(double *bal, const float *logits, int N, int E) {
    double *d0 = neox_malloc((size_t)N * sizeof *d0), *d1 = neox_malloc((size_t)E * sizeof *d1);
    double *old = neox_malloc((size_t)E * sizeof *old), eps = 1e-8, tol = 1e-4;
    for (size_t i = 0; i < (size_t)N * E; i++) bal[i] = exp((double)logits[i]);
    for (int e = 0; e < E; e++) {
        double s = 0.0;
        for (int t = 0; t < N; t++) s += bal[(size_t)t * E + e];
        old[e] = d1[e] = 1.0 / (E * s);
    }
    for (int it = 0; it < 3; it++) {
        for (int t = 0; t < N; t++) {
            double s = 0.0;
            for (int e = 0; e < E; e++) s += d1[e] * bal[(size_t)t * E + e];
            d0[t] = (1.0 / N) / (s + eps);
        }
        double err = 0.0;
        for (int e = 0; e < E; e++) {
            double s = 0.0;
            for (int t = 0; t < N; t++) s += d0[t] * bal[(size_t)t * E + e];
            d1[e] = (1.0 / E) / (s + eps);
            err += fabs(old[e] - d1[e]) / E;
            old[e] = d1[e];
        }
        if (err < tol) break;
    }
    for (int t = 0; t < N; t++)
        for (int e = 0; e < E; e++) bal[(size_t)t * E + e] *= d1[e] * d0[t];
    free(d0);
    free(d1);
    free(old);
}

// Scores from logits in place: sigmoid (Sinkhorn with top_k 1), else softmax over the experts.
static void scores_of(float *s, int N, int E, int use_sigmoid) {
    for (int t = 0; t < N; t++) {
        float *row = s + (size_t)t * E;
        if (use_sigmoid) {
            for (int e = 0; e < E; e++) row[e] = (float)(1.0 / (1.0 + exp(-(double)row[e])));
            continue;
        }
        double mx = row[0], sum = 0.0;
        for (int e = 1; e < E; e++) mx = row[e] > mx ? row[e] : mx;
        for (int e = 0; e < E; e++) sum += exp((double)row[e] - mx);
        for (int e = 0; e < E; e++) row[e] = (float)(exp((double)row[e] - mx) / sum);
    }
}

static int sigmoid_scores(const neox_model_desc *d) { return d->moe_router == NEOX_MOE_SINKHORN && d->moe_top_k == 1; }

// r->scores holds the logits on entry. Picks each token's experts (largest key first, the lower
// expert on ties), their weights, and the expert-ordered rows.
static void route(neox_moe_route *r, const neox_model_desc *d, int N, int training) {
    int E = d->moe_experts, K = d->moe_top_k;
    int balance = d->moe_router == NEOX_MOE_SINKHORN && training;
    if (balance) sinkhorn(r->balanced, r->scores, N, E);
    scores_of(r->scores, N, E, sigmoid_scores(d));
    memset(r->count, 0, (size_t)E * sizeof(int));
    for (int t = 0; t < N; t++) {
        const float *s = r->scores + (size_t)t * E;
        const double *b = r->balanced + (size_t)t * E;
        for (int k = 0; k < K; k++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int j = 0; j < k; j++) taken |= r->expert[t * K + j] == e;
                if (taken) continue;
                if (best < 0 || (balance ? b[e] > b[best] : s[e] > s[best])) best = e;
            }
            r->expert[t * K + k] = best;
            r->weight[t * K + k] = s[best];
            r->count[best]++;
        }
        if (d->moe_renormalize) {
            float sum = 0.0f;  // in fp32, as Mixtral sums its fp32 softmax
            for (int k = 0; k < K; k++) sum += r->weight[t * K + k];
            for (int k = 0; k < K; k++) r->weight[t * K + k] /= sum;
        }
    }
    int *next = neox_malloc((size_t)E * sizeof(int));
    for (int e = 0, at = 0; e < E; e++) next[e] = at, at += r->count[e];
    for (int t = 0; t < N; t++)
        for (int k = 0; k < K; k++) {
            int j = next[r->expert[t * K + k]]++;
            r->slot[t * K + k] = j;
            r->perm[j] = t;
        }
    free(next);
}

// Expert e's first projection (I, C) (w1, or [w3; w1] when gated); its w2 (C, Fe) follows.
static float *w1_of(const float *experts, const neox_model_desc *d, int e) {
    return (float *)experts + (size_t)e * (neox_model_moe_in_rows(d) + d->moe_ffn_size) * d->hidden_size;
}

static float *w2_of(const float *experts, const neox_model_desc *d, int e) {
    return w1_of(experts, d, e) + (size_t)neox_model_moe_in_rows(d) * d->hidden_size;
}

// out (N, OC) = inp (N, IC) @ w^T in the model's precision, or in fp32.
static void linear(neox_model *m, int fp32, float *out, const float *inp, const float *w, int N, int IC, int OC) {
    if (fp32) m->be->linear_forward(out, OC, inp, w, NULL, N, IC, OC, NEOX_ELEM_F32);
    else neox_model_linear_forward(m, out, inp, w, NULL, N, IC, OC);
}

// The router's input: inp, or (topk router in training with moe_jitter_eps) inp times GPT-NeoX's
// uniform noise, drawn from the layer's stream (a MoE layer has no MLP-output dropout to use it).
static const float *router_input(neox_model *m, int l, const neox_moe_bufs *b, const float *inp, int N, int training) {
    const neox_model_desc *d = &m->desc;
    if (!training || !b->jx) return inp;
    m->be->jitter(b->jx, inp, (size_t)N * d->hidden_size, d->moe_jitter_eps,
                  neox_model_dropout_seed(m, l, NEOX_SITE_MLP_OUT), m->act_elem);
    return b->jx;
}

// ---- expert parallelism: the all-to-all (moe_exchange.c plans it) ----------------------------
// Every rank first learns how many rows of each of its experts every rank of the expert group
// will send (one all-to-all of counts), then the rows travel.
static void plan_exchange(neox_model *m, neox_moe_route *r) {
    const neox_model_desc *d = &m->desc;
    neox_alltoall(m->ep, r->count, r->from, (size_t)neox_model_local_experts(d), NEOX_I32);
    neox_error err = {0};
    int planned = neox_moe_exchange_plan(r->x, r->count, r->from, &err);
    neox_assert(planned == 0, "%s", err.message);  // every rank routes within the planned worst case
    if (!m->be->on_device) return;
    neox_moe_exchange *x = r->x;
    if (!r->device_index) r->index_be = m->be, r->device_index = m->be->alloc(2 * (size_t)x->cap * sizeof(int));
    m->be->to_device(r->device_index, x->to_expert, (size_t)x->received * sizeof(int));
    m->be->to_device(r->device_index + x->cap, x->to_source, (size_t)x->received * sizeof(int));
}

// The plan's row permutations where gather_rows reads them (the host's on the CPU backend).
static const int *to_expert_of(const neox_moe_route *r) { return r->device_index ? r->device_index : r->x->to_expert; }
static const int *to_source_of(const neox_moe_route *r) {
    return r->device_index ? r->device_index + r->x->cap : r->x->to_source;
}

// Rows of C floats: out (forward) from the expert-sorted `send` to their experts' ranks, received
// source-major; back, the reverse, into the expert-sorted order they left in.
static void exchange_rows(neox_model *m, const neox_moe_exchange *x, const float *send, float *recv, int C, int back) {
    int P = x->ranks, *c = neox_malloc(4 * (size_t)P * sizeof(int)), *sd = c + P, *rc = c + 2 * P, *rd = c + 3 * P;
    const int *rows_out = back ? x->recv_count : x->send_count, *at_out = back ? x->recv_displ : x->send_displ;
    const int *rows_in = back ? x->send_count : x->recv_count, *at_in = back ? x->send_displ : x->recv_displ;
    for (int q = 0; q < P; q++) {
        // neox_model_plan_slots refused a plan whose worst case passes 2^31 elements
        neox_assert((int64_t)(at_out[q] + rows_out[q]) * C <= INT32_MAX && (int64_t)(at_in[q] + rows_in[q]) * C <= INT32_MAX,
                    "MoE exchange: more than 2^31 elements in one all-to-all");
        c[q] = rows_out[q] * C, sd[q] = at_out[q] * C, rc[q] = rows_in[q] * C, rd[q] = at_in[q] * C;
    }
    neox_alltoallv(m->ep, send, c, sd, recv, rc, rd, NEOX_F32);
    free(c);
}

// The experts' products over rows grouped by local expert (rows[e] of local expert e in turn):
// h = x w1^T (I wide: [up | gate] per row when gated), act = act(h) (Fe wide), y = act w2^T.
static void run_experts(neox_model *m, int fp32, const float *experts, const int *rows, int total, const float *x,
                        float *h, float *act, float *y) {
    const neox_model_desc *d = &m->desc;
    int C = d->hidden_size, Fe = d->moe_ffn_size, I = neox_model_moe_in_rows(d), L = neox_model_local_experts(d);
    neox_act_fn fn = neox_activation_function(d->activation);
    for (int e = 0, at = 0; e < L; at += rows[e++])
        if (rows[e]) linear(m, fp32, h + (size_t)at * I, neox_act_at(m, x, (size_t)at * C), w1_of(experts, d, e), rows[e], C, I);
    if (I != Fe) m->be->gated_forward(act, h, total, Fe, fn, NEOX_ELEM_F32);
    else m->be->activation_forward(act, h, (size_t)total * Fe, fn, NEOX_ELEM_F32);
    for (int e = 0, at = 0; e < L; at += rows[e++])
        if (rows[e]) linear(m, fp32, neox_act_at(m, y, (size_t)at * C), act + (size_t)at * Fe, w2_of(experts, d, e), rows[e], Fe, C);
}

// Under expert parallelism (the route has an exchange) b->x, h and act hold the rows this rank's
// experts received, expert-major; b->y the outputs of this rank's own token slots, back home.
void neox_model_moe_forward(neox_model *m, int l, const neox_moe_bufs *b, const float *inp, float *out, int N,
                            int training, int fp32) {
    const neox_model_desc *d = &m->desc;
    const neox_backend *be = m->be;
    const neox_layer_params *p = &m->w.layers[l];
    neox_moe_route *r = b->route;
    int C = d->hidden_size, E = d->moe_experts, K = d->moe_top_k, NK = N * K;
    linear(m, fp32, b->logits, router_input(m, l, b, inp, N, training), p->router_w, N, C, E);
    be->to_host(r->scores, b->logits, (size_t)N * E * sizeof(float));
    route(r, d, N, training);
    be->to_device(b->perm, r->perm, (size_t)NK * sizeof(int));
    be->to_device(b->slot, r->slot, (size_t)NK * sizeof(int));
    be->to_device(b->weight, r->weight, (size_t)NK * sizeof(float));
    if (!r->x) {
        be->gather_rows(b->x, inp, b->perm, NK, C, m->act_elem);
        run_experts(m, fp32, p->experts_w, r->count, NK, b->x, b->h, b->act, b->y);
    } else {  // (the counts are on the host already: the routing runs there)
        neox_acts *a = m->acts;
        neox_moe_exchange *x = r->x;
        be->gather_rows(a->moe_dy, inp, b->perm, NK, C, m->act_elem);
        plan_exchange(m, r);
        exchange_rows(m, x, a->moe_dy, a->moe_swap, C, 0);
        be->gather_rows(b->x, a->moe_swap, to_expert_of(r), x->received, C, m->act_elem);
        run_experts(m, fp32, p->experts_w, x->local_count, x->received, b->x, b->h, b->act, a->moe_dx);
        be->gather_rows(a->moe_swap, a->moe_dx, to_source_of(r), x->received, C, m->act_elem);
        exchange_rows(m, x, a->moe_swap, b->y, C, 1);
    }
    be->moe_combine(out, b->y, b->slot, b->weight, N, K, C, m->act_elem);
}

// Renormalised weights w_k = p_k / S (S the chosen p's sum): turns d/dw into d/dp in place,
// dp_j = (dw_j - sum_k w_k dw_k) / S.
static void unrenormalize_grads(neox_moe_route *r, const neox_model_desc *d, int t) {
    int E = d->moe_experts, K = d->moe_top_k;
    const float *s = r->scores + (size_t)t * E;
    float *dw = r->dweight + (size_t)t * K;
    double sum = 0.0, dot = 0.0;
    for (int k = 0; k < K; k++) sum += s[r->expert[t * K + k]];
    for (int k = 0; k < K; k++) dot += (double)r->weight[t * K + k] * dw[k];
    for (int k = 0; k < K; k++) dw[k] = (float)((dw[k] - dot) / sum);
}

// d(loss)/d(logits) from d(loss)/d(weights): through the renormalisation, then the sigmoid, or the
// softmax over all experts.
static void router_logit_grads(neox_moe_route *r, const neox_model_desc *d, int N) {
    int E = d->moe_experts, K = d->moe_top_k;
    memset(r->dlogits, 0, (size_t)N * E * sizeof(float));
    for (int t = 0; t < N; t++) {
        if (d->moe_renormalize) unrenormalize_grads(r, d, t);
        const float *s = r->scores + (size_t)t * E;
        float *g = r->dlogits + (size_t)t * E;
        if (sigmoid_scores(d)) {
            for (int k = 0; k < K; k++) {
                int e = r->expert[t * K + k];
                g[e] += r->dweight[t * K + k] * s[e] * (1.0f - s[e]);
            }
            continue;
        }
        double dot = 0.0;  // sum_j p_j dp_j, dp nonzero at the chosen experts
        for (int k = 0; k < K; k++) dot += (double)s[r->expert[t * K + k]] * r->dweight[t * K + k];
        for (int e = 0; e < E; e++) g[e] = (float)(-(double)s[e] * dot);
        for (int k = 0; k < K; k++) {
            int e = r->expert[t * K + k];
            g[e] += s[e] * r->dweight[t * K + k];
        }
    }
}

void neox_model_moe_backward(neox_model *m, int l, const neox_moe_bufs *b, const float *inp, const float *dy,
                             float *dln2, float *scratch) {
    const neox_model_desc *d = &m->desc;
    const neox_backend *be = m->be;
    const neox_layer_params *p = &m->w.layers[l];
    neox_layer_params *g = &m->g.layers[l];
    neox_acts *a = m->acts;
    neox_moe_route *r = b->route;
    neox_moe_exchange *x = r->x;
    int N = m->B * m->T, C = d->hidden_size, E = d->moe_experts, K = d->moe_top_k, Fe = d->moe_ffn_size, NK = N * K;
    int L = neox_model_local_experts(d), total = x ? x->received : NK;
    int I = neox_model_moe_in_rows(d);
    neox_act_fn fn = neox_activation_function(d->activation);
    const int *rows = x ? x->local_count : r->count;
    be->moe_combine_backward(a->moe_dy, a->moe_dweight, dy, b->y, b->slot, b->weight, N, K, C, m->act_elem);
    if (x) {  // the output gradients travel to the experts as the rows did
        exchange_rows(m, x, a->moe_dy, a->moe_swap, C, 0);
        be->gather_rows(a->moe_dy, a->moe_swap, to_expert_of(r), x->received, C, m->act_elem);
    }
    for (int e = 0, at = 0; e < L; at += rows[e++]) {
        if (!rows[e]) continue;
        const float *w2 = w2_of(p->experts_w, d, e);
        float *dw2 = w2_of(g->experts_w, d, e);
        const float *dye = neox_act_at(m, a->moe_dy, (size_t)at * C);
        neox_model_linear_backward_weights(m, dw2, NULL, dye, b->act + (size_t)at * Fe, rows[e], Fe, C);
        neox_model_linear_backward_input(m, a->moe_dact + (size_t)at * Fe, dye, w2, rows[e], Fe, C);
    }
    if (I != Fe) be->gated_backward(a->moe_dh, a->moe_dact, b->h, total, Fe, fn, NEOX_ELEM_F32);  // moe_dh: (total, 2Fe)
    else be->activation_backward(a->moe_dh, a->moe_dact, b->h, (size_t)total * Fe, fn, NEOX_ELEM_F32);
    for (int e = 0, at = 0; e < L; at += rows[e++]) {
        if (!rows[e]) continue;
        const float *dh = a->moe_dh + (size_t)at * I;
        neox_model_linear_backward_weights(m, w1_of(g->experts_w, d, e), NULL, dh, neox_act_at(m, b->x, (size_t)at * C), rows[e], C, I);
        neox_model_linear_backward_input(m, neox_act_at(m, a->moe_dx, (size_t)at * C), dh, w1_of(p->experts_w, d, e), rows[e], C, I);
    }
    const float *dx = a->moe_dx;
    if (x) {  // the input gradients go back to the ranks the rows came from
        be->gather_rows(a->moe_swap, a->moe_dx, to_source_of(r), x->received, C, m->act_elem);
        exchange_rows(m, x, a->moe_swap, a->moe_dy, C, 1);
        dx = a->moe_dy;
    }
    be->moe_combine(dln2, dx, b->slot, NULL, N, K, C, m->act_elem);
    be->to_host(r->dweight, a->moe_dweight, (size_t)NK * sizeof(float));
    router_logit_grads(r, d, N);
    be->to_device(a->moe_dlogits, r->dlogits, (size_t)N * E * sizeof(float));
    int jittered = m->training && b->jx;
    neox_model_linear_backward_weights(m, g->router_w, NULL, a->moe_dlogits, jittered ? b->jx : inp, N, C, E);
    neox_model_linear_backward_input(m, scratch, a->moe_dlogits, p->router_w, N, C, E);
    if (jittered)  // d(x * noise)/dx = noise
        be->jitter(scratch, scratch, (size_t)N * C, d->moe_jitter_eps, neox_model_dropout_seed(m, l, NEOX_SITE_MLP_OUT),
                   m->act_elem);
    be->add(dln2, dln2, scratch, (size_t)N * C, m->act_elem);
}
