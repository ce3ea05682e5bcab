// linear_act_route.c: the rule for where a CUDA device runs the fused linear + activation ops
// (kernels.h, neox_linear_act_forward/backward): cuBLASLt's GELU epilogues, one cuDNN graph, or the
// product and the activation as separate passes; and where a bf16 product with a bias runs. The CUDA
// backend (kernels/cuda/linear.cu) applies it before asking cuDNN for a plan (which may still refuse a
// shape, and the separate passes then run), and the step predictor (bench/gpu_predict, through
// kernels/op_cost.c) prices each call by the route it picks, so the two cannot disagree.
#include "kernels/kernels.h"

static int cudnn_allowed = 1;

void neox_linear_act_allow_cudnn(int allow) { cudnn_allowed = allow != 0; }

// cuBLASLt's GELU epilogue is the tanh approximation and its aux/bias forms are fp32 here (the path
// that existed first); cuDNN's pointwise modes have both GELUs, and its graphs take bf16 storage as it
// is (fp32 storage would need casts around the product, which is what the separate passes avoid too).
// A bf16 product with an fp32 bias: cuBLASLt's bias epilogue takes a bias of the output's type only,
// so without cuDNN the product goes through fp32 rows and a pass of its own rounds them into out
// (kernels/cuda/linear.cu's forward16); cuDNN's graph adds the fp32 bias in its fp32 epilogue and
// stores bf16 (dense rows only: ldo = OC).
neox_epilogue_route neox_linear_bias_route(neox_elem act, int ldo, int OC) {
    return act == NEOX_ELEM_BF16 && cudnn_allowed && ldo == OC ? NEOX_EPILOGUE_CUDNN : NEOX_EPILOGUE_NONE;
}

neox_epilogue_route neox_linear_act_route(neox_act_fn fn, neox_elem act) {
    if (act == NEOX_ELEM_F32) return fn == NEOX_FN_GELU_TANH ? NEOX_EPILOGUE_CUBLASLT : NEOX_EPILOGUE_NONE;
    if (act == NEOX_ELEM_BF16 && cudnn_allowed && (fn == NEOX_FN_GELU || fn == NEOX_FN_GELU_TANH))
        return NEOX_EPILOGUE_CUDNN;
    return NEOX_EPILOGUE_NONE;
}
