// attention_route.c: the rule for which implementation a CUDA device runs an attention call on,
// cuDNN's fused attention or the own tensor-core kernels. The CUDA backend (kernels/cuda/
// attention_cudnn.cu) applies it before asking cuDNN for a plan (which may still refuse a shape),
// and the step predictor (bench/gpu_predict, through kernels/op_cost.c) prices each call at the rate
// of the implementation the rule picks, so the two cannot disagree about the route.
#include "kernels/kernels.h"

static int cudnn_allowed = 1;  // config key cudnn_attention

void neox_attention_allow_cudnn(int allow) { cudnn_allowed = allow != 0; }

// Why the call stays on the own kernels, or NULL when cuDNN may take it: bf16 operands only (fp16
// and fp32 stay on the own kernels), no attention dropout (the own kernels draw the CPU's masks;
// cuDNN's Philox masks differ) and no ALiBi.
const char *neox_attention_own_reason(const neox_attention_opts *o) {
    if (!cudnn_allowed) return "cudnn_attention: false";
    if (o->operands != NEOX_ELEM_BF16) return "fp16 or fp32 operands: cuDNN is used for bf16 only";
    if (o->dropout > 0.0f) return "attention dropout";
    if (o->alibi) return "ALiBi";
    return NULL;
}
