// cudnn_graph.cpp: what every cuDNN graph of the CUDA backend shares (cudnn_graph.hpp): libcudnn
// opened with dlopen on first use (the frontend's dynamic loading, so linking the tools needs no
// cuDNN and a host without it runs the own kernels), its version, the one handle and plan building.
// Built without the cudnn-frontend headers (make deps installs them), every entry point reports that.
#include "kernels/cuda/cudnn_graph.hpp"
#include "kernels/cuda/cudnn_attention.h"

#ifndef NEOX_HAVE_CUDNN_FRONTEND

static const char k_not_built[] = "built without the cudnn-frontend headers (make deps installs them)";
extern "C" int neox_cudnn_built(void) { return 0; }
extern "C" int neox_cudnn_load(char *why, size_t whylen) { return neox_cudnn::say(why, whylen, k_not_built), 0; }
extern "C" const char *neox_cudnn_version(void) { return ""; }

#else

#include <dlfcn.h>

// The frontend's dynamic loading resolves every cuDNN call through this handle.
void *cudnn_frontend::cudnn_dlhandle = nullptr;

namespace neox_cudnn {

namespace {
std::string g_version;
cudnnHandle_t g_handle = nullptr;
std::string g_handle_error;
}  // namespace

std::shared_ptr<fe::graph::Graph> new_graph(int sm) {
    auto g = std::make_shared<fe::graph::Graph>();
    if (sm > 0) g->set_sm_version(sm);
    g->set_io_data_type(fe::DataType_t::BFLOAT16)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    return g;
}

bool ensure_handle(std::string &why) {
    if (g_handle) return true;
    if (g_handle_error.empty()) {
        try {
            cudnnStatus_t st = fe::detail::create_handle(&g_handle);
            if (st != CUDNN_STATUS_SUCCESS) {
                g_handle = nullptr;
                g_handle_error = std::string("cudnnCreate failed: ") + fe::detail::get_error_string(st);
            }
        } catch (const std::exception &e) {
            g_handle_error = std::string("cudnnCreate failed: ") + e.what();
        }
    }
    why = g_handle_error;
    return g_handle != nullptr;
}

bool build(fe::graph::Graph &g, int64_t &ws, std::string &why) {
    return attempt([&] { return g.validate(); }, why) && attempt([&] { return g.build_operation_graph(g_handle); }, why) &&
           attempt([&] { return g.create_execution_plans({fe::HeurMode_t::A}); }, why) &&
           attempt([&] { return g.check_support(g_handle); }, why) && attempt([&] { return g.build_plans(); }, why) &&
           attempt([&] { return g.get_workspace_size(ws); }, why);
}

bool execute(fe::graph::Graph &g, std::unordered_map<int64_t, void *> &pack, void *workspace, void *stream,
             std::string &why) {
    if (fe::detail::set_stream(g_handle, (cudaStream_t)stream) != CUDNN_STATUS_SUCCESS) {
        why = "cudnnSetStream failed";
        return false;
    }
    return attempt([&] { return g.execute(g_handle, pack, workspace); }, why);
}

}  // namespace neox_cudnn

extern "C" int neox_cudnn_load(char *why, size_t whylen) {
    static int state = -1;  // -1 not tried, 0 failed, 1 loaded
    static std::string error;
    namespace fe = cudnn_frontend;
    if (state < 0) {
        // The soname of cuDNN 9 (the frontend needs 9.x), found through the RPATH (the CUDA toolkit's
        // lib64) or the loader's usual search.
        fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!fe::cudnn_dlhandle) {
            const char *e = dlerror();
            error = std::string("libcudnn.so.9 not loadable: ") + (e ? e : "?");
            state = 0;
        } else {
            try {
                size_t v = fe::detail::get_backend_version();
                neox_cudnn::g_version = std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." +
                                        std::to_string(v % 100);
                state = 1;
            } catch (const std::exception &e) {
                error = std::string("libcudnn.so.9 loaded but unusable: ") + e.what();
                state = 0;
            }
        }
    }
    if (!state) neox_cudnn::say(why, whylen, error.c_str());
    return state;
}

extern "C" int neox_cudnn_built(void) { return 1; }

extern "C" const char *neox_cudnn_version(void) { return neox_cudnn::g_version.c_str(); }

#endif
