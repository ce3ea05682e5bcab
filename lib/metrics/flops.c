// flops.c: model FLOPs per iteration with GPT-NeoX's formula (megatron/logging.py get_flops), so
// TFLOP/s and MFU read the same in neox.c and GPT-NeoX logs; Mixture-of-Experts layers count the
// parameters a token activates (metrics.h).
#include <stdio.h>

#include "metrics.h"

double neox_flops_per_iteration(const neox_flops_model *m) {
    double l = (double)m->num_layers, h = (double)m->hidden_size, v = (double)m->padded_vocab_size;
    double s = (double)m->seq_length, b = (double)m->train_batch_size;
    if (l <= 0 || h <= 0) return 0.0;
    // Forward = 1 unit, backward = 2; recomputing the forward under activation checkpointing adds 1.
    double passes = m->checkpoint_activations ? 4.0 : 3.0;
    double dense = 24.0 * passes * b * s * l * h * h * (1.0 + s / (6.0 * h) + v / (16.0 * l * h));
    if (m->moe_layers <= 0) return dense;
    // Each MoE layer: the dense MLP's 16h^2 per token replaced by the active experts' and router's.
    double k = (double)m->moe_top_k, e = (double)m->moe_experts, fe = (double)m->moe_ffn_size;
    double matrices = m->moe_expert_matrices > 0 ? (double)m->moe_expert_matrices : 2.0;
    double active = 2.0 * matrices * k * h * fe + 2.0 * h * e;
    return dense + passes * b * s * (double)m->moe_layers * (active - 16.0 * h * h);
}

const char *neox_format_flops(double flops, char *buf, size_t size) {
    static const char *units[] = {"", "KFLOPS", "MFLOPS", "GFLOPS", "TFLOPS", "PFLOPS", "EFLOPS", "ZFLOPS"};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (flops < 1000.0 && flops > -1000.0) {
            snprintf(buf, size, "%3.1f%s", flops, units[i]);
            return buf;
        }
        flops /= 1000.0;
    }
    snprintf(buf, size, "%.1f%s", flops, "Yi");   // GPT-NeoX's suffix beyond zetta, kept as is
    return buf;
}
