"""GPT-NeoX's model-FLOPs formula in lib/metrics/flops.c against the formula restated in Python."""
import pytest

from metrics_oracle import driver, gpt_neox_flops

CASES = [
    # layers, hidden, padded vocab, seq, global batch, checkpoint_activations
    (2, 64, 128, 32, 4, 0),
    (2, 64, 128, 32, 4, 1),
    (6, 512, 50304, 512, 8, 0),        # the CPU training benchmark's model (bench/train_cpu.sh)
    (24, 1024, 50304, 2048, 1024, 1),   # Pythia-410M-like
    (44, 6144, 50432, 2048, 1538, 1),   # GPT-NeoX-20B
    (1, 8, 1, 1, 1, 0),
]


@pytest.mark.parametrize("case", CASES)
def test_flops_per_iteration_matches_formula(case):
    got = float(driver("flops", *case))
    want = gpt_neox_flops(*case)
    assert got == pytest.approx(want, rel=1e-12)


def test_20b_magnitude():
    # GPT-NeoX-20B at 1538 x 2048 tokens per step: about 6 * 20e9 * 3.15e6 * 4/3 FLOPs
    got = float(driver("flops", 44, 6144, 50432, 2048, 1538, 1))
    assert 4.5e17 < got < 6.5e17


def active_flops(layers, hidden, vocab, seq, batch, ckpt, moe_layers, top_k, experts, width, matrices=2):
    """Model FLOPs of a Mixture of Experts counted from the parameters each token activates:
    2 FLOPs per active weight per token forward (times 3, or 4 with recomputation), plus GPT-NeoX's
    attention-score and output-layer terms. Attention's linears hold 4h^2 weights; a dense MLP
    GPT-NeoX's assumed 2 x 4h^2; a MoE layer top_k experts of `matrices` h x width matrices each (2
    ungated, 3 gated as Mixtral's w1, w3, w2) and the E x h router."""
    f = 4 if ckpt else 3
    attention = 4 * hidden**2
    dense_mlp = 8 * hidden**2
    moe_mlp = top_k * matrices * hidden * width + experts * hidden
    weights = layers * attention + (layers - moe_layers) * dense_mlp + moe_layers * moe_mlp
    per_token = 2 * weights + layers * 4 * seq * hidden + 1.5 * hidden * vocab
    return f * batch * seq * per_token


MOE_CASES = [
    # layers, hidden, vocab, seq, batch, ckpt, MoE layers, top_k, experts, expert width
    (2, 32, 512, 32, 8, 0, 2, 2, 4, 48),      # tests/mpi/moe_expert_parallel.sh's model
    (12, 768, 50304, 2048, 32, 1, 12, 1, 8, 3072),  # GPT-NeoX's 125M-dmoe shape, Sinkhorn top-1
    (12, 768, 50304, 2048, 32, 0, 6, 2, 16, 3072),  # every second layer, top-2
    (2, 64, 512, 64, 8, 0, 2, 2, 8, 256, 3),   # gated experts (Mixtral's), top-2
]


@pytest.mark.parametrize("case", MOE_CASES)
def test_moe_flops_count_active_parameters(case):
    got = float(driver("flops", *case))
    assert got == pytest.approx(active_flops(*case), rel=1e-12)
    # fewer FLOPs than the dense formula when a token's experts are narrower than the 4h MLP
    dense = gpt_neox_flops(*case[:6])
    matrices = case[10] if len(case) > 10 else 2
    assert (got < dense) == (case[7] * case[9] * 2 * matrices * case[1] + 2 * case[1] * case[8] < 16 * case[1] ** 2)
