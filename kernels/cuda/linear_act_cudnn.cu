// linear_act_cudnn.cu: the cuDNN route of the fused linear + activation ops (kernels.h,
// neox_linear_act_forward/backward; the route's rule: kernels/linear_act_route.c): the MLP's first
// product with its GELU, and the second's input gradient with GELU's backward, each one cuDNN graph
// (kernels/cuda/cudnn_matmul.cpp) on the bf16 activations and the weights' bf16 copy as they are.
// Also a biased bf16 product alone (the QKV projection), stored in bf16 from its fp32 epilogue.
// When libcudnn does not load or cuDNN builds no plan for a shape, the caller (linear.cu) runs the
// product and the activation as separate ops (or the product through fp32 rows). Which ran is said
// once per outcome on stderr.
#include <string.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_matmul.h"

// Says once per distinct outcome which implementation the MLP's fused products (and the biased bf16
// products) run on.
static void notice(const char *what) {
    enum { KEEP = 8 };
    static char said[KEEP][512];
    static int n;
    for (int i = 0; i < n; i++)
        if (!strcmp(said[i], what)) return;
    if (n < KEEP) snprintf(said[n++], sizeof said[0], "%s", what);
    fprintf(stderr, "neox cuda: %s\n", what);
}

// Whether cuDNN runs s: libcudnn loads and builds a plan for the shape (plans and refusals cached).
static int use_cudnn(const neox_cudnn_gelu_mm *s, size_t *ws) {
    char why[320], line[512];
    const char *dir = s->backward ? "backward" : "forward";
    if (!neox_cudnn_gelu_mm_prepare(s, ws, why, sizeof why)) {
        snprintf(line, sizeof line,
                 "MLP product + GELU: %s: the product, then the activation as its own pass (cuDNN: %s)", dir, why);
        notice(line);
        return 0;
    }
    snprintf(line, sizeof line,
             "MLP product + GELU: %s: one cuDNN %s graph (bf16, %s GELU in the product's epilogue)", dir,
             neox_cudnn_version(), s->tanh ? "tanh-approximated" : "exact (erf)");
    notice(line);
    return 1;
}

// A cuDNN failure after its plan was built is a bug or a lost device, like a failing kernel.
static void check_ran(int ok, const char *what, const char *why) {
    if (ok) return;
    fprintf(stderr, "neox cuda: cuDNN MLP %s graph failed: %s\n", what, why);
    abort();
}

// out, pre: (N, OC); inp: (N, IC); weight: (OC, IC); all bf16; bias (OC) fp32 or NULL. 1 when cuDNN ran.
int neox_cuda_linear_act_cudnn_forward(void *out, void *pre, const void *inp, const void *weight, const float *bias,
                                       int N, int IC, int OC, neox_act_fn fn) {
    neox_cudnn_gelu_mm s = {0, N, IC, OC, bias != NULL, fn == NEOX_FN_GELU_TANH, 0};
    size_t ws = 0;
    if (N <= 0 || !use_cudnn(&s, &ws)) return 0;
    char why[320];
    check_ran(neox_cudnn_gelu_mm_forward(&s, (uint16_t *)out, (uint16_t *)pre, (const uint16_t *)inp,
                                         (const uint16_t *)weight, bias, neox_cuda_scratch(ws),
                                         neox_cuda_current_stream(), why, sizeof why),
              "forward", why);
    return 1;
}

// out: (N, OC) = inp (N, IC) @ weight (OC, IC)^T + bias (OC, fp32); bf16 but the bias. 1 when cuDNN ran.
int neox_cuda_linear_bias_cudnn_forward(void *out, const void *inp, const void *weight, const float *bias, int N,
                                        int IC, int OC) {
    neox_cudnn_gelu_mm s = {0, N, IC, OC, 1, 0, 1};
    size_t ws = 0;
    char why[320], line[512];
    if (N <= 0) return 0;
    if (!neox_cudnn_gelu_mm_prepare(&s, &ws, why, sizeof why)) {
        snprintf(line, sizeof line, "biased product: fp32 rows, then rounded in a pass of their own (cuDNN: %s)", why);
        notice(line);
        return 0;
    }
    snprintf(line, sizeof line, "biased product: one cuDNN %s graph (bf16, the fp32 bias in its epilogue)",
             neox_cudnn_version());
    notice(line);
    check_ran(neox_cudnn_gelu_mm_forward(&s, (uint16_t *)out, NULL, (const uint16_t *)inp, (const uint16_t *)weight,
                                         bias, neox_cuda_scratch(ws), neox_cuda_current_stream(), why, sizeof why),
              "biased product", why);
    return 1;
}

// dpre, pre: (N, IC); dout: (N, OC); weight: (OC, IC); all bf16. 1 when cuDNN ran.
int neox_cuda_linear_act_cudnn_backward(void *dpre, const void *dout, const void *weight, const void *pre, int N,
                                        int IC, int OC, neox_act_fn fn) {
    neox_cudnn_gelu_mm s = {1, N, IC, OC, 0, fn == NEOX_FN_GELU_TANH, 0};
    size_t ws = 0;
    if (N <= 0 || !use_cudnn(&s, &ws)) return 0;
    char why[320];
    check_ran(neox_cudnn_gelu_mm_backward(&s, (uint16_t *)dpre, (const uint16_t *)dout, (const uint16_t *)weight,
                                          (const uint16_t *)pre, neox_cuda_scratch(ws), neox_cuda_current_stream(),
                                          why, sizeof why),
              "backward", why);
    return 1;
}
