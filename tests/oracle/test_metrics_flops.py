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
