// cudnn_graph.hpp: what every cuDNN graph of the CUDA backend shares (C++ only, inside kernels/cuda):
// the frontend included once with its dynamic loading, its errors and exceptions turned into
// messages, the one cuDNN handle, and a graph's plan build. libcudnn itself is opened by
// neox_cudnn_load (cudnn_attention.h), in cudnn_graph.cpp. The attention graphs
// (cudnn_attention.cpp) and the MLP's product graphs (cudnn_matmul.cpp) use it.
#ifndef NEOX_CUDNN_GRAPH_HPP
#define NEOX_CUDNN_GRAPH_HPP

#include <stdio.h>

#include <memory>
#include <string>
#include <unordered_map>

#if __has_include(<cudnn_frontend.h>)
#define NEOX_HAVE_CUDNN_FRONTEND 1
#define NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING
#include <cudnn_frontend.h>
#endif

namespace neox_cudnn {

inline void say(char *why, size_t whylen, const char *what) {
    if (why && whylen) snprintf(why, whylen, "%s", what);
}

#ifdef NEOX_HAVE_CUDNN_FRONTEND
namespace fe = cudnn_frontend;

// Runs f, turning the frontend's errors and exceptions (dynamic loading throws on a missing
// symbol) into a message.
template <typename F> bool attempt(F f, std::string &why) {
    try {
        fe::error_t st = f();
        if (st.is_good()) return true;
        why = st.get_message();
    } catch (const std::exception &e) {
        why = e.what();
    } catch (...) {
        why = "unknown exception from cudnn-frontend";
    }
    if (why.empty()) why = "cudnn-frontend failed without a message";
    return false;
}

// A graph of bf16 inputs and outputs with fp32 intermediates and compute, for sm (90 = Hopper) or,
// with 0, the current GPU. The version is set before any node: each node copies the graph's context.
std::shared_ptr<fe::graph::Graph> new_graph(int sm);
// The handle every graph runs with, created on first use (needs a GPU); false with the reason.
bool ensure_handle(std::string &why);
// validate, cuDNN's operation graph, heuristics' candidates, support check, plan build; ws: the
// workspace bytes the plan needs.
bool build(fe::graph::Graph &g, int64_t &ws, std::string &why);
// Runs a built graph on stream (a cudaStream_t).
bool execute(fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, void *workspace, void *stream,
             std::string &why);
#endif

}  // namespace neox_cudnn

#endif
