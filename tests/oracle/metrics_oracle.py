"""metrics_oracle.py: shared helpers of tests/oracle/test_metrics_*.py — finding the C driver and
GPT-NeoX's FLOPs formula restated in Python from megatron/logging.py get_flops."""
import os
import subprocess

import pytest

DRIVER = "build/cpu/tests/drivers/metrics_driver"


def driver(*args):
    if not os.access(DRIVER, os.X_OK):
        pytest.fail(f"{DRIVER} is missing: run 'make' first")
    return subprocess.run([DRIVER, *map(str, args)], check=True, capture_output=True, text=True).stdout


def gpt_neox_flops(layers, hidden, vocab, seq, batch, checkpoint_activations):
    """FLOPs per iteration: 24 f B s l h^2 (1 + s/(6h) + V/(16 l h)), f = 4 with checkpointing else 3."""
    f = 4 if checkpoint_activations else 3
    return 24 * f * batch * seq * layers * hidden**2 * (1.0 + seq / (6.0 * hidden) + vocab / (16.0 * layers * hidden))
