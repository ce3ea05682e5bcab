"""Seeds of the pt fuzz target (tests/fuzz/corpus/pt): small files torch.save writes as GPT-NeoX's
checkpoints hold them: a model-states file (an OrderedDict of parameters, with views: a transpose,
a slice, fp16 and a strided bf16 copy) and a ZeRO optimizer-states file (a flat fp32 partition, Adam's
moments as views of one buffer, param_groups, and the objects DeepSpeed pickles: its loss scaler, the
ZeRO stage enum, fragment addresses; numpy's RNG state as GPT-NeoX saves it), and each one's data.pkl bare (the target unpickles an
input that is not a zip by itself).
  pt_seeds.py OUT_DIR"""
import collections
import os
import sys
import zipfile

import numpy as np
import torch

os.environ.setdefault("DS_ACCELERATOR", "cpu")
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402

out = sys.argv[1]
g = torch.Generator().manual_seed(0)
base = torch.randn(4, 6, generator=g)
torch.save({"module": collections.OrderedDict([("w", base), ("w_t", base.t()), ("rows", base[1:3]), ("h", base.half()),
                                               ("b", base.bfloat16()[:, ::2])]),
            "iteration": 3, "lr": 1e-3, "ids": torch.arange(5), "tags": {"a"}, "raw": b"\x00\xff",
            "t": (1, 2.5, None, True), "np_rng_state": np.random.RandomState(1).get_state()}, f"{out}/model_states.pt")
flat = torch.randn(24, generator=g)
torch.save({"optimizer_state_dict": {
    "loss_scaler": DynamicLossScaler(init_scale=2**16, scale_factor=2.0, scale_window=1000),
    "zero_stage": ZeroStageEnum.optimizer_states, "single_partition_of_fp32_groups": [flat[:12]],
    "param_slice_mappings": [collections.OrderedDict([("sequential.0.word_embeddings.weight", fragment_address(12, 0))])],
    "base_optimizer_state": {"state": {0: {"step": 3, "exp_avg": flat[12:], "exp_avg_sq": flat[12:] * flat[12:]}},
                             "param_groups": [{"lr": 0.001, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0,
                                               "params": [0]}]}},
    "ds_version": "0.14.4"}, f"{out}/optim_states.pt")
for name in ("model_states", "optim_states"):
    with zipfile.ZipFile(f"{out}/{name}.pt") as z, open(f"{out}/{name}.pkl", "wb") as f:
        f.write(z.read(f"{name}/data.pkl"))
