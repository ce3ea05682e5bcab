"""lm_eval_cli.py ARGS...: lm-evaluation-harness's own command line (`lm_eval ARGS...`) in the oracle
environment. transformers 4.49 imports torch.optim.lr_scheduler.LRScheduler, the name torch 2.0 gave
_LRScheduler; Debian's torch 1.13 has only the old name, so it is aliased before the harness loads
transformers. Nothing else changes; the hub is never contacted (offline)."""
import os
import sys

import torch.optim.lr_scheduler as schedulers

if not hasattr(schedulers, "LRScheduler"):
    schedulers.LRScheduler = schedulers._LRScheduler
for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(var, "1")

from lm_eval.__main__ import cli_evaluate  # noqa: E402

if __name__ == "__main__":
    sys.argv[0] = "lm_eval"
    cli_evaluate()
