// cudnn_matmul.cpp: the MLP's products with GELU fused (cudnn_matmul.h) as cuDNN graphs: a matmul
// node, the bias as a pointwise ADD, and GELU's forward or backward as a pointwise node in the
// product's epilogue (or none: a biased product stored in bf16), built through cudnn-frontend
// (libcudnn's loading, the handle and plan building: cudnn_graph.cpp). Built without the frontend's
// headers, every entry point reports that.
#include "kernels/cuda/cudnn_matmul.h"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_graph.hpp"

#include <string.h>

using neox_cudnn::say;

#ifndef NEOX_HAVE_CUDNN_FRONTEND

static const char k_not_built[] = "built without the cudnn-frontend headers (make deps installs them)";
extern "C" int neox_cudnn_gelu_mm_validate(const neox_cudnn_gelu_mm *, int, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_gelu_mm_prepare(const neox_cudnn_gelu_mm *, size_t *, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_gelu_mm_forward(const neox_cudnn_gelu_mm *, uint16_t *, uint16_t *, const uint16_t *,
                                          const uint16_t *, const float *, void *, void *, char *why, size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}
extern "C" int neox_cudnn_gelu_mm_backward(const neox_cudnn_gelu_mm *, uint16_t *, const uint16_t *,
                                           const uint16_t *, const uint16_t *, void *, void *, char *why,
                                           size_t whylen) {
    return say(why, whylen, k_not_built), 0;
}

#else

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fe = cudnn_frontend;
using neox_cudnn::attempt;
using neox_cudnn::new_graph;

namespace {

// Tensor ids of the variant packs.
enum : int64_t { UID_X = 1, UID_W, UID_BIAS, UID_PRE, UID_OUT, UID_DOUT, UID_DPRE };

using tensor = std::shared_ptr<fe::graph::Tensor_attributes>;

// A (1, rows, cols) tensor of the graph with the given strides and element type.
tensor input(fe::graph::Graph &g, const char *name, int64_t uid, int64_t rows, int64_t cols, std::vector<int64_t> st,
             fe::DataType_t type = fe::DataType_t::BFLOAT16) {
    return g.tensor(fe::graph::Tensor_attributes()
                        .set_name(name)
                        .set_uid(uid)
                        .set_dim({1, rows, cols})
                        .set_stride(st)
                        .set_data_type(type));
}

// A dense row-major (rows, cols) bf16 result.
void output(const tensor &t, const char *name, int64_t uid, int64_t rows, int64_t cols) {
    t->set_output(true).set_name(name).set_uid(uid).set_dim({1, rows, cols}).set_stride({rows * cols, cols, 1});
    t->set_data_type(fe::DataType_t::BFLOAT16);
}

fe::graph::Pointwise_attributes pointwise(const char *name, fe::PointwiseMode_t mode) {
    return fe::graph::Pointwise_attributes().set_name(name).set_mode(mode).set_compute_data_type(fe::DataType_t::FLOAT);
}

fe::graph::Matmul_attributes product(const char *name) {
    return fe::graph::Matmul_attributes().set_name(name).set_compute_data_type(fe::DataType_t::FLOAT);
}

// pre = x (N, IC) @ w^T (+ bias), out = gelu(pre). w (OC, IC) row-major is read as the (IC, OC)
// operand through its strides.
std::shared_ptr<fe::graph::Graph> forward_graph(const neox_cudnn_gelu_mm *s, int sm) {
    auto g = new_graph(sm);
    int64_t N = s->N, IC = s->IC, OC = s->OC;
    auto x = input(*g, "x", UID_X, N, IC, {N * IC, IC, 1});
    auto w = input(*g, "w", UID_W, IC, OC, {IC * OC, 1, IC});
    auto pre = g->matmul(x, w, product("product"));
    pre->set_data_type(fe::DataType_t::FLOAT);
    if (s->bias) {
        auto b = input(*g, "bias", UID_BIAS, 1, OC, {OC, OC, 1}, fe::DataType_t::FLOAT);
        pre = g->pointwise(pre, b, pointwise("bias", fe::PointwiseMode_t::ADD));
    }
    if (s->plain) {  // the biased product alone
        output(pre, "out", UID_OUT, N, OC);
        return g;
    }
    auto mode = s->tanh ? fe::PointwiseMode_t::GELU_APPROX_TANH_FWD : fe::PointwiseMode_t::GELU_FWD;
    auto out = g->pointwise(pre, pointwise("gelu", mode));
    output(pre, "pre", UID_PRE, N, OC);
    output(out, "out", UID_OUT, N, OC);
    return g;
}

// dpre = (dout (N, OC) @ w (OC, IC)) * gelu'(pre (N, IC)).
std::shared_ptr<fe::graph::Graph> backward_graph(const neox_cudnn_gelu_mm *s, int sm) {
    auto g = new_graph(sm);
    int64_t N = s->N, IC = s->IC, OC = s->OC;
    auto dout = input(*g, "dout", UID_DOUT, N, OC, {N * OC, OC, 1});
    auto w = input(*g, "w", UID_W, OC, IC, {OC * IC, IC, 1});
    auto pre = input(*g, "pre", UID_PRE, N, IC, {N * IC, IC, 1});
    auto dpost = g->matmul(dout, w, product("product"));
    dpost->set_data_type(fe::DataType_t::FLOAT);
    auto mode = s->tanh ? fe::PointwiseMode_t::GELU_APPROX_TANH_BWD : fe::PointwiseMode_t::GELU_BWD;
    auto dpre = g->pointwise(dpost, pre, pointwise("gelu_backward", mode));  // (the gradient first, then the input)
    output(dpre, "dpre", UID_DPRE, N, IC);
    return g;
}

std::shared_ptr<fe::graph::Graph> graph_of(const neox_cudnn_gelu_mm *s, int sm) {
    return s->backward ? backward_graph(s, sm) : forward_graph(s, sm);
}

const char *shape_problem(const neox_cudnn_gelu_mm *s) {
    if (s->N <= 0 || s->IC <= 0 || s->OC <= 0) return "empty shape";
    return nullptr;
}

// One cached shape: its plan, or why there is none.
struct plan {
    bool ok = false;
    std::string why;
    std::shared_ptr<fe::graph::Graph> g;
    int64_t ws = 0;
};

std::map<std::vector<int64_t>, plan> g_cache;

const plan *find_plan(const neox_cudnn_gelu_mm *s) {
    std::vector<int64_t> key = {s->backward, s->N, s->IC, s->OC, s->bias, s->tanh, s->plain};
    auto it = g_cache.find(key);
    if (it != g_cache.end()) return &it->second;
    plan p;
    char why[256];
    if (const char *bad = shape_problem(s)) p.why = bad;
    else if (!neox_cudnn_load(why, sizeof why)) p.why = why;
    else if (neox_cudnn::ensure_handle(p.why)) {
        p.g = graph_of(s, 0);
        p.ok = neox_cudnn::build(*p.g, p.ws, p.why);
    }
    return &g_cache.emplace(key, p).first->second;
}

int run(const neox_cudnn_gelu_mm *s, std::unordered_map<int64_t, void *> &pack, void *workspace, void *stream,
        char *why, size_t whylen) {
    const plan *p = find_plan(s);
    std::string reason = p->why;
    if (p->ok && neox_cudnn::execute(*p->g, pack, workspace, stream, reason)) return 1;
    say(why, whylen, reason.c_str());
    return 0;
}

}  // namespace

extern "C" int neox_cudnn_gelu_mm_validate(const neox_cudnn_gelu_mm *s, int sm_version, char *why, size_t whylen) {
    if (const char *bad = shape_problem(s)) return say(why, whylen, bad), 0;
    if (!neox_cudnn_load(why, whylen)) return 0;
    std::string reason;
    if (attempt([&] { return graph_of(s, sm_version)->validate(); }, reason)) return 1;
    say(why, whylen, reason.c_str());
    return 0;
}

extern "C" int neox_cudnn_gelu_mm_prepare(const neox_cudnn_gelu_mm *s, size_t *ws, char *why, size_t whylen) {
    const plan *p = find_plan(s);
    if (!p->ok) return say(why, whylen, p->why.c_str()), 0;
    if (ws) *ws = (size_t)p->ws;
    return 1;
}

extern "C" int neox_cudnn_gelu_mm_forward(const neox_cudnn_gelu_mm *s, uint16_t *out, uint16_t *pre,
                                          const uint16_t *inp, const uint16_t *w, const float *bias, void *workspace,
                                          void *stream, char *why, size_t whylen) {
    std::unordered_map<int64_t, void *> pack = {
        {UID_X, (void *)inp}, {UID_W, (void *)w}, {UID_OUT, (void *)out}};
    if (!s->plain) pack[UID_PRE] = (void *)pre;
    if (s->bias) pack[UID_BIAS] = (void *)bias;
    return run(s, pack, workspace, stream, why, whylen);
}

extern "C" int neox_cudnn_gelu_mm_backward(const neox_cudnn_gelu_mm *s, uint16_t *dpre, const uint16_t *dout,
                                           const uint16_t *w, const uint16_t *pre, void *workspace, void *stream,
                                           char *why, size_t whylen) {
    std::unordered_map<int64_t, void *> pack = {
        {UID_DOUT, (void *)dout}, {UID_W, (void *)w}, {UID_PRE, (void *)pre}, {UID_DPRE, (void *)dpre}};
    return run(s, pack, workspace, stream, why, whylen);
}

#endif
