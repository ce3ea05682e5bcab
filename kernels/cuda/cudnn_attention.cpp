// cudnn_attention.cpp: cuDNN's fused attention graphs (cudnn_attention.h) through cudnn-frontend,
// the header-only C++ interface that `make deps` installs into .deps/cudnn-frontend (libcudnn's
// loading, the handle and plan building are cudnn_graph.cpp's). A host without libcudnn falls back to
// the own attention kernels. Built without the frontend's headers, every entry point reports that
// and the own kernels run.
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_graph.hpp"
#include "kernels/kernels.h"

#include <stdio.h>
#include <string.h>

using neox_cudnn::say;

// The strides helpers need nothing of cuDNN.
extern "C" void neox_cudnn_strides_bhtd(int64_t stride[4], int heads, int T, int HS) {
    stride[0] = (int64_t)heads * T * HS;
    stride[1] = (int64_t)T * HS;
    stride[2] = HS;
    stride[3] = 1;
}

extern "C" void neox_cudnn_strides_bthd(int64_t stride[4], int heads, int T, int HS) {
    stride[0] = (int64_t)T * heads * HS;
    stride[1] = HS;
    stride[2] = (int64_t)heads * HS;
    stride[3] = 1;
}

// (the layouts' addressing is kernels.h's neox_qkv_fused_layout, their one owner)
extern "C" void neox_cudnn_strides_qkv(neox_cudnn_sdpa *s, int interleaved, int64_t *q_off, int64_t *k_off,
                                       int64_t *v_off) {
    neox_qkv_layout l = neox_qkv_fused_layout((int)s->T, (int)s->H, (int)s->Hkv, (int)s->HS, interleaved);
    int64_t base[4] = {(int64_t)l.strides.q.batch, (int64_t)l.strides.q.head, (int64_t)l.strides.q.row, 1};
    memcpy(s->q_stride, base, sizeof base);
    memcpy(s->k_stride, base, sizeof base);
    memcpy(s->v_stride, base, sizeof base);
    *q_off = (int64_t)l.q_offset;
    *k_off = (int64_t)l.k_offset;
    *v_off = (int64_t)l.v_offset;
}

#ifndef NEOX_HAVE_CUDNN_FRONTEND

static const char k_not_built[] = "built without the cudnn-frontend headers (make deps installs them)";
extern "C" int neox_cudnn_sdpa_validate(const neox_cudnn_sdpa *, int, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_sdpa_prepare(const neox_cudnn_sdpa *, size_t *, size_t *, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_sdpa_forward(const neox_cudnn_sdpa *, uint16_t *, float *, const uint16_t *,
                                       const uint16_t *, const uint16_t *, void *, void *, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_sdpa_backward(const neox_cudnn_sdpa *, uint16_t *, uint16_t *, uint16_t *,
                                        const uint16_t *, const uint16_t *, const uint16_t *, const uint16_t *,
                                        const uint16_t *, const float *, void *, void *, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}

#else

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;
using neox_cudnn::attempt;
using neox_cudnn::new_graph;

namespace {

// Tensor ids of the variant packs.
enum : int64_t { UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_DOUT, UID_DQ, UID_DK, UID_DV };

int query_rows(const neox_cudnn_sdpa *s) { return s->Tq > 0 ? s->Tq : s->T; }
bool bottom_right(const neox_cudnn_sdpa *s) { return s->Tq > 0 && s->Tq != s->T; }
// q, out and their gradients (B, H, Tq, HS); k, v and theirs (B, Hkv, T, HS).
std::vector<int64_t> q_dims(const neox_cudnn_sdpa *s) { return {s->B, s->H, query_rows(s), s->HS}; }
std::vector<int64_t> kv_dims(const neox_cudnn_sdpa *s) { return {s->B, s->Hkv, s->T, s->HS}; }
std::vector<int64_t> strides(const int64_t st[4]) { return {st[0], st[1], st[2], st[3]}; }
std::vector<int64_t> stats_dims(const neox_cudnn_sdpa *s) { return {s->B, s->H, query_rows(s), 1}; }
// Stats (B, H, Tq, 1) dense: the same memory as the own kernels' lse (B, H, Tq). (Dense, not strided:
// cuDNN before 9.26 takes only a packed stats input in backward.)
std::vector<int64_t> stats_strides(const neox_cudnn_sdpa *s) { return {(int64_t)s->H * query_rows(s), query_rows(s), 1, 1}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph &g, const char *name, int64_t uid,
                                                    std::vector<int64_t> d, std::vector<int64_t> st) {
    return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(d).set_stride(st));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes> &t, int64_t uid, std::vector<int64_t> d,
            std::vector<int64_t> st) {
    t->set_output(true).set_uid(uid).set_dim(d).set_stride(st);
}

// The masks, the same in both directions: causal is the diagonal band's right bound 0 from the top
// left corner (from the bottom-right one when the queries are the last Tq of T positions); a window
// of w keeps key j for query i when j + w > i (the frontend's left bound, in the own kernels' sense:
// keys i - w + 1 .. i, i the query's position on that diagonal).
template <typename Attrs> void set_masks(Attrs &a, const neox_cudnn_sdpa *s) {
    fe::DiagonalAlignment_t corner = bottom_right(s) ? fe::DiagonalAlignment_t::BOTTOM_RIGHT : fe::DiagonalAlignment_t::TOP_LEFT;
    if (s->causal) a.set_diagonal_alignment(corner).set_diagonal_band_right_bound(0);
    if (s->window > 0) a.set_diagonal_band_left_bound(s->window);
}

// out, stats = attention(q, k, v): q (B, H, Tq, HS), k, v (B, Hkv, T, HS), out like q.
std::shared_ptr<fe::graph::Graph> forward_graph(const neox_cudnn_sdpa *s, int sm) {
    auto g = new_graph(sm);
    auto q = input(*g, "q", UID_Q, q_dims(s), strides(s->q_stride));
    auto k = input(*g, "k", UID_K, kv_dims(s), strides(s->k_stride));
    auto v = input(*g, "v", UID_V, kv_dims(s), strides(s->v_stride));
    auto attrs = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(s->scale);
    set_masks(attrs, s);
    auto [o, stats] = g->sdpa(q, k, v, attrs);
    output(o, UID_O, q_dims(s), strides(s->o_stride));
    output(stats, UID_STATS, stats_dims(s), stats_strides(s));
    stats->set_data_type(fe::DataType_t::FLOAT);
    return g;
}

// dq, dk, dv from dout, q, k, v, out and stats; deterministic (no atomics across key tiles).
std::shared_ptr<fe::graph::Graph> backward_graph(const neox_cudnn_sdpa *s, int sm) {
    auto g = new_graph(sm);
    auto q = input(*g, "q", UID_Q, q_dims(s), strides(s->q_stride));
    auto k = input(*g, "k", UID_K, kv_dims(s), strides(s->k_stride));
    auto v = input(*g, "v", UID_V, kv_dims(s), strides(s->v_stride));
    auto o = input(*g, "o", UID_O, q_dims(s), strides(s->o_stride));
    auto dout = input(*g, "dout", UID_DOUT, q_dims(s), strides(s->o_stride));
    auto stats = input(*g, "stats", UID_STATS, stats_dims(s), stats_strides(s));
    stats->set_data_type(fe::DataType_t::FLOAT);
    auto attrs = fe::graph::SDPA_backward_attributes()
                     .set_name("sdpa_backward")
                     .set_attn_scale(s->scale)
                     .set_deterministic_algorithm(true);
    set_masks(attrs, s);
    auto [dq, dk, dv] = g->sdpa_backward(q, k, v, o, dout, stats, attrs);
    output(dq, UID_DQ, q_dims(s), strides(s->q_stride));
    output(dk, UID_DK, kv_dims(s), strides(s->k_stride));
    output(dv, UID_DV, kv_dims(s), strides(s->v_stride));
    return g;
}

// What the frontend cannot express or this interface does not offer, before the frontend sees it.
const char *shape_problem(const neox_cudnn_sdpa *s) {
    if (s->B <= 0 || s->H <= 0 || s->Hkv <= 0 || s->T <= 0 || s->HS <= 0) return "empty shape";
    if (s->H % s->Hkv) return "query heads not a multiple of key/value heads";
    if (s->window > 0 && !s->causal) return "a sliding window needs the causal mask";
    if (s->Tq < 0 || s->Tq > s->T) return "more query rows than keys";
    if (bottom_right(s) && !s->causal) return "queries at the last positions need the causal mask";
    return nullptr;
}

bool validate_both(const neox_cudnn_sdpa *s, int sm, std::string &why) {
    return attempt([&] { return forward_graph(s, sm)->validate(); }, why) &&
           attempt([&] { return backward_graph(s, sm)->validate(); }, why);
}

// One cached shape: both plans, or why there are none.
struct plans {
    bool ok = false;
    std::string why;
    std::shared_ptr<fe::graph::Graph> fwd, bwd;
    int64_t fwd_ws = 0, bwd_ws = 0;
};

std::map<std::vector<int64_t>, plans> g_cache;

std::vector<int64_t> cache_key(const neox_cudnn_sdpa *s) {
    uint32_t scale_bits;
    memcpy(&scale_bits, &s->scale, sizeof scale_bits);
    std::vector<int64_t> key = {s->B, s->H, s->Hkv, s->T, s->HS, s->causal, s->window, scale_bits, s->Tq};
    for (const int64_t *st : {s->q_stride, s->k_stride, s->v_stride, s->o_stride}) key.insert(key.end(), st, st + 4);
    return key;
}

plans make_plans(const neox_cudnn_sdpa *s) {
    plans p;
    char why[256];
    if (const char *bad = shape_problem(s)) return p.why = bad, p;
    if (!neox_cudnn_load(why, sizeof why)) return p.why = why, p;
    if (!neox_cudnn::ensure_handle(p.why)) return p;
    p.fwd = forward_graph(s, 0);
    p.bwd = backward_graph(s, 0);
    if (!neox_cudnn::build(*p.fwd, p.fwd_ws, p.why)) return p.why = "forward: " + p.why, p;
    if (!neox_cudnn::build(*p.bwd, p.bwd_ws, p.why)) return p.why = "backward: " + p.why, p;
    p.ok = true;
    return p;
}

const plans *find_plans(const neox_cudnn_sdpa *s) {
    auto key = cache_key(s);
    auto it = g_cache.find(key);
    if (it == g_cache.end()) it = g_cache.emplace(key, make_plans(s)).first;
    return &it->second;
}

bool execute(const plans *p, fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, void *workspace,
             void *stream, std::string &why) {
    if (!p->ok) return why = p->why, false;
    return neox_cudnn::execute(g, pack, workspace, stream, why);
}

}  // namespace

extern "C" int neox_cudnn_sdpa_validate(const neox_cudnn_sdpa *s, int sm_version, char *why, size_t whylen) {
    if (const char *bad = shape_problem(s)) return say(why, whylen, bad), 0;
    if (!neox_cudnn_load(why, whylen)) return 0;
    std::string reason;
    if (validate_both(s, sm_version, reason)) return 1;
    say(why, whylen, reason.c_str());
    return 0;
}

extern "C" int neox_cudnn_sdpa_prepare(const neox_cudnn_sdpa *s, size_t *fwd_ws, size_t *bwd_ws, char *why,
                                       size_t whylen) {
    const plans *p = find_plans(s);
    if (!p->ok) return say(why, whylen, p->why.c_str()), 0;
    if (fwd_ws) *fwd_ws = (size_t)p->fwd_ws;
    if (bwd_ws) *bwd_ws = (size_t)p->bwd_ws;
    return 1;
}

extern "C" int neox_cudnn_sdpa_forward(const neox_cudnn_sdpa *s, uint16_t *out, float *stats, const uint16_t *q,
                                       const uint16_t *k, const uint16_t *v, void *workspace, void *stream, char *why,
                                       size_t whylen) {
    const plans *p = find_plans(s);
    std::unordered_map<int64_t, void *> pack = {{UID_Q, (void *)q}, {UID_K, (void *)k},     {UID_V, (void *)v},
                                                {UID_O, (void *)out}, {UID_STATS, (void *)stats}};
    std::string reason;
    if (execute(p, *p->fwd, pack, workspace, stream, reason)) return 1;
    say(why, whylen, reason.c_str());
    return 0;
}

extern "C" int neox_cudnn_sdpa_backward(const neox_cudnn_sdpa *s, uint16_t *dq, uint16_t *dk, uint16_t *dv,
                                        const uint16_t *dout, const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                        const uint16_t *out, const float *stats, void *workspace, void *stream,
                                        char *why, size_t whylen) {
    const plans *p = find_plans(s);
    std::unordered_map<int64_t, void *> pack = {
        {UID_Q, (void *)q},   {UID_K, (void *)k},   {UID_V, (void *)v},   {UID_O, (void *)out},
        {UID_DOUT, (void *)dout}, {UID_STATS, (void *)stats}, {UID_DQ, (void *)dq}, {UID_DK, (void *)dk},
        {UID_DV, (void *)dv}};
    std::string reason;
    if (execute(p, *p->bwd, pack, workspace, stream, reason)) return 1;
    say(why, whylen, reason.c_str());
    return 0;
}

#endif
