// cudnn_graphs.c: every cuDNN graph the model can ask for passes cudnn-frontend's validate() for
// Hopper (sm_90), checked without a GPU: the attention graphs (the frontend's checks of data types,
// head sizes, masks, GQA and the architecture's rules; cudnn_attention.h, neox_cudnn_sdpa_validate)
// and the MLP's products with GELU fused (cudnn_matmul.h, neox_cudnn_gelu_mm_validate).
// What needs a GPU (cuDNN's own support check, plan build, the numbers) is in tests/gpu/op_parity.c.
// TAP lines; "# SKIP" when libcudnn cannot be loaded here; a build without the cudnn-frontend headers
// fails. Exit 1 when any check fails.
#include <stdio.h>
#include <string.h>

#include "kernels/cuda/cudnn_attention.h"
#include "kernels/cuda/cudnn_matmul.h"

// How q, k, v and out are laid out in memory.
typedef enum {
    LAYOUT_SPLIT,        // what the CUDA attention op hands cuDNN today: q, k, v (B, heads, T, HS), out (B, T, H, HS)
    LAYOUT_FUSED_NEOX,   // q, k, v read from the fused QKV GEMM output, GPT-NeoX's interleaved per-head layout
    LAYOUT_FUSED_LLAMA,  // the same, Llama's [q heads | k heads | v heads] layout
} layout;

typedef struct {
    const char *what;  // where the shape comes from
    int B, H, Hkv, T, HS, window;
    layout lay;
    int expect_ok;  // 0: a shape the frontend must refuse (the check can fail)
    // > 0: context parallelism's query run, the last Tq of the T positions (causal from the
    // bottom-right corner), its rows in a rank's q of 2 Tq rows, over keys of a sequence of T or more
    int Tq;
} graph_case;

static const graph_case cases[] = {
    // bench/gpu_train.sh: GPT-NeoX 125M, micro-batch auto (32, 16, 8), 12 heads of 64, sequence 2048
    {"125M micro-batch 32", 32, 12, 12, 2048, 64, 0, LAYOUT_SPLIT, 1, 0},
    {"125M micro-batch 16", 16, 12, 12, 2048, 64, 0, LAYOUT_SPLIT, 1, 0},
    {"125M micro-batch 8", 8, 12, 12, 2048, 64, 0, LAYOUT_SPLIT, 1, 0},
    {"125M, fused interleaved QKV", 8, 12, 12, 2048, 64, 0, LAYOUT_FUSED_NEOX, 1, 0},
    // Llama-style GQA and MQA (num_kv_heads < heads), the fused layout of its q/k/v projections
    {"GQA 32/8 HS 128", 2, 32, 8, 2048, 128, 0, LAYOUT_SPLIT, 1, 0},
    {"GQA 32/8 HS 128, fused Llama QKV", 2, 32, 8, 2048, 128, 0, LAYOUT_FUSED_LLAMA, 1, 0},
    {"MQA 8/1 HS 64", 4, 8, 1, 512, 64, 0, LAYOUT_SPLIT, 1, 0},
    // sliding_window_width (window = width + 1 keys)
    {"window 256, GQA 4/2", 4, 4, 2, 1024, 64, 256, LAYOUT_SPLIT, 1, 0},
    {"window 4097 over T 2048 (Mistral's 4096)", 2, 32, 8, 2048, 128, 4097, LAYOUT_SPLIT, 1, 0},
    {"window 17, T 70", 3, 4, 4, 70, 32, 17, LAYOUT_FUSED_NEOX, 1, 0},
    // every head size the 16-bit path takes (kernels.h, neox_attention_operands: 16, 32, ..., 128),
    // at sequences that are not multiples of a tile
    {"HS 16, T 33", 2, 4, 2, 33, 16, 0, LAYOUT_SPLIT, 1, 0},
    {"HS 32, T 129", 2, 4, 4, 129, 32, 0, LAYOUT_SPLIT, 1, 0},
    {"HS 48, T 40", 1, 2, 2, 40, 48, 0, LAYOUT_SPLIT, 1, 0},
    {"HS 80, T 300", 2, 4, 1, 300, 80, 0, LAYOUT_SPLIT, 1, 0},
    {"HS 96, T 65", 2, 4, 4, 65, 96, 0, LAYOUT_FUSED_NEOX, 1, 0},
    {"HS 112, T 37", 1, 2, 2, 37, 112, 0, LAYOUT_SPLIT, 1, 0},
    // context_parallel_size: one call per query run of a rank (attention_cudnn.cu), 125M at 2048 over
    // cp 2 (runs of 512 ending at 1024, 1536, 2048), a window, GQA, the op parity's odd chunks
    {"cp 2 rank 1, first run", 8, 12, 12, 1024, 64, 0, LAYOUT_SPLIT, 1, 512},
    {"cp 2 rank 1, second run", 8, 12, 12, 1536, 64, 0, LAYOUT_SPLIT, 1, 512},
    {"cp 2 rank 0, second run", 8, 12, 12, 2048, 64, 0, LAYOUT_SPLIT, 1, 512},
    {"cp 4 run, window 256, GQA 32/8 HS 128", 2, 32, 8, 1024, 128, 256, LAYOUT_SPLIT, 1, 256},
    {"cp 2 run of 50 ending at 150, GQA", 2, 6, 2, 150, 64, 0, LAYOUT_SPLIT, 1, 50},
    {"cp 4 run of 38 ending at 190, window 40", 1, 4, 2, 190, 64, 40, LAYOUT_SPLIT, 1, 38},
    // refused: the frontend's own rules (Hopper: head size at most 256, a multiple of 8)
    {"HS 264 is refused", 1, 2, 2, 64, 264, 0, LAYOUT_SPLIT, 0, 0},
    {"HS 20 is refused", 1, 2, 2, 64, 20, 0, LAYOUT_SPLIT, 0, 0},
};

// The MLP graphs (kernels/cuda/cudnn_matmul.cpp): the first projection's product with its bias and
// GELU (N, C) -> (N, F), and the second's input gradient with GELU's backward (N, C) -> (N, F), at the
// shapes bench/gpu_train.sh trains (N = micro-batch x 2048 tokens, F = 4C).
typedef struct {
    const char *what;
    neox_cudnn_gelu_mm s;  // {backward, N, IC, OC, bias, tanh, plain}
    int expect_ok;
} mm_case;

static const mm_case mm_cases[] = {
    {"125M first projection + bias + exact GELU, micro-batch 32", {0, 65536, 768, 3072, 1, 0, 0}, 1},
    {"125M second projection's input gradient x exact GELU'", {1, 65536, 3072, 768, 0, 0, 0}, 1},
    {"350M first projection + bias + exact GELU, micro-batch 16", {0, 32768, 1024, 4096, 1, 0, 0}, 1},
    {"350M second projection's input gradient x exact GELU'", {1, 32768, 4096, 1024, 0, 0, 0}, 1},
    {"1.3B first projection + bias + exact GELU, micro-batch 8", {0, 16384, 2048, 8192, 1, 0, 0}, 1},
    {"1.3B second projection's input gradient x exact GELU'", {1, 16384, 8192, 2048, 0, 0, 0}, 1},
    {"no bias (use_bias_in_mlp: false)", {0, 2048, 768, 3072, 0, 0, 0}, 1},
    {"tanh-approximated GELU forward (bias_gelu_fusion)", {0, 2048, 768, 3072, 1, 1, 0}, 1},
    {"tanh-approximated GELU backward", {1, 2048, 3072, 768, 0, 1, 0}, 1},
    {"rows and widths not multiples of a tile", {0, 37, 64, 96, 1, 0, 0}, 1},
    {"odd backward shape", {1, 37, 96, 64, 0, 0, 0}, 1},
    {"125M QKV product + fp32 bias, no activation, micro-batch 32", {0, 65536, 768, 2304, 1, 0, 1}, 1},
    {"1.3B QKV product + fp32 bias, no activation, micro-batch 16", {0, 32768, 2048, 6144, 1, 0, 1}, 1},
    {"biased product, rows and widths not multiples of a tile", {0, 37, 200, 96, 1, 0, 1}, 1},
    {"an empty shape is refused", {0, 0, 768, 3072, 1, 0, 0}, 0},
};

static neox_cudnn_sdpa make_shape(const graph_case *c) {
    neox_cudnn_sdpa s;
    memset(&s, 0, sizeof s);
    s.B = c->B, s.H = c->H, s.Hkv = c->Hkv, s.T = c->T, s.HS = c->HS;
    s.causal = 1, s.window = c->window;
    s.scale = 1.0f / __builtin_sqrtf((float)c->HS);
    int64_t off[3];
    if (c->lay == LAYOUT_SPLIT) {
        neox_cudnn_strides_bhtd(s.q_stride, c->H, c->T, c->HS);
        neox_cudnn_strides_bhtd(s.k_stride, c->Hkv, c->T, c->HS);
        neox_cudnn_strides_bhtd(s.v_stride, c->Hkv, c->T, c->HS);
    } else {
        neox_cudnn_strides_qkv(&s, c->lay == LAYOUT_FUSED_NEOX, &off[0], &off[1], &off[2]);
    }
    neox_cudnn_strides_bthd(s.o_stride, c->H, c->T, c->HS);
    if (c->Tq > 0) {  // the run's rows inside the rank's 2 Tq query rows
        s.Tq = c->Tq;
        neox_cudnn_strides_bhtd(s.q_stride, c->H, 2 * c->Tq, c->HS);
        neox_cudnn_strides_bthd(s.o_stride, c->H, 2 * c->Tq, c->HS);
    }
    return s;
}

int main(void) {
    char why[512];
    if (!neox_cudnn_built()) {  // the CUDA build's attention would never use cuDNN
        printf("not ok - cuDNN attention graphs: the CUDA variant was built without the cudnn-frontend headers "
               "(make deps installs them into .deps/cudnn-frontend)\n");
        return 1;
    }
    if (!neox_cudnn_load(why, sizeof why)) {
        printf("ok - cuDNN attention graphs # SKIP %s\n", why);
        return 0;
    }
    printf("# cuDNN %s, graphs validated for sm_90 without a GPU\n", neox_cudnn_version());
    int n = (int)(sizeof cases / sizeof cases[0]), failed = 0;
    int nmm = (int)(sizeof mm_cases / sizeof mm_cases[0]);
    printf("1..%d\n", n + 2 + nmm + 1);
    for (int i = 0; i < n; i++) {
        const graph_case *c = &cases[i];
        neox_cudnn_sdpa s = make_shape(c);
        why[0] = 0;
        int ok = neox_cudnn_sdpa_validate(&s, 90, why, sizeof why);
        int pass = ok == c->expect_ok;
        failed += !pass;
        printf("%s %d - forward + deterministic backward: %s (B %d, H %d/%d, T %d, Tq %d, HS %d, window %d)%s%s\n",
               pass ? "ok" : "not ok", i + 1, c->what, c->B, c->H, c->Hkv, c->T, c->Tq, c->HS, c->window,
               why[0] ? ": " : "", why);
    }
    // A window without the causal mask is refused before the frontend sees it.
    graph_case lone = {"window without causal", 1, 2, 2, 64, 64, 8, LAYOUT_SPLIT, 0, 0};
    neox_cudnn_sdpa s = make_shape(&lone);
    s.causal = 0;
    int refused = !neox_cudnn_sdpa_validate(&s, 90, why, sizeof why);
    failed += !refused;
    printf("%s %d - a window without the causal mask is refused: %s\n", refused ? "ok" : "not ok", n + 1, why);
    // Plans need a GPU (a cuDNN handle): without one, prepare must refuse with the reason (the
    // attention then falls back to the own kernels), not crash or throw; with one it builds them.
    s = make_shape(&cases[0]);
    why[0] = 0;
    size_t fwd_ws = 0, bwd_ws = 0;
    int planned = neox_cudnn_sdpa_prepare(&s, &fwd_ws, &bwd_ws, why, sizeof why);
    int sound = planned ? 1 : why[0] != 0;
    failed += !sound;
    if (planned)
        printf("ok %d - plans built on this GPU (workspace %zu + %zu bytes)\n", n + 2, fwd_ws, bwd_ws);
    else
        printf("%s %d - without plans, prepare says why (the own kernels then run): %s\n", sound ? "ok" : "not ok",
               n + 2, why);
    for (int i = 0; i < nmm; i++) {
        const mm_case *c = &mm_cases[i];
        why[0] = 0;
        int ok = neox_cudnn_gelu_mm_validate(&c->s, 90, why, sizeof why);
        int pass = ok == c->expect_ok;
        failed += !pass;
        printf("%s %d - MLP %s: %s (N %d, IC %d, OC %d)%s%s\n", pass ? "ok" : "not ok", n + 3 + i,
               c->s.backward ? "backward" : "forward", c->what, c->s.N, c->s.IC, c->s.OC, why[0] ? ": " : "", why);
    }
    // As for attention: without a GPU, prepare refuses with the reason (the separate passes then run).
    size_t ws = 0;
    why[0] = 0;
    planned = neox_cudnn_gelu_mm_prepare(&mm_cases[0].s, &ws, why, sizeof why);
    sound = planned ? 1 : why[0] != 0;
    failed += !sound;
    if (planned) printf("ok %d - MLP plan built on this GPU (workspace %zu bytes)\n", n + 3 + nmm, ws);
    else
        printf("%s %d - without a plan, prepare says why (the separate passes then run): %s\n", sound ? "ok" : "not ok",
               n + 3 + nmm, why);
    return failed ? 1 : 0;
}
