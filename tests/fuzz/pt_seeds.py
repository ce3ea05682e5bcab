"""Seeds of the pt fuzz target (tests/fuzz/corpus/pt): small files torch.save writes as GPT-NeoX's
checkpoints hold them: a model-states file (an OrderedDict of parameters, with views: a transpose,
a slice, fp16 and a strided bf16 copy) and a ZeRO optimizer-states file (a flat fp32 partition, Adam's
moments as views of one buffer, param_groups), and each one's data.pkl bare (the target unpickles an
input that is not a zip by itself).
  pt_seeds.py OUT_DIR"""
import collections
import sys
import zipfile

import torch

out = sys.argv[1]
g = torch.Generator().manual_seed(0)
base = torch.randn(4, 6, generator=g)
torch.save({"module": collections.OrderedDict([("w", base), ("w_t", base.t()), ("rows", base[1:3]), ("h", base.half()),
                                               ("b", base.bfloat16()[:, ::2])]),
            "iteration": 3, "lr": 1e-3, "ids": torch.arange(5), "tags": {"a"}, "raw": b"\x00\xff",
            "t": (1, 2.5, None, True)}, f"{out}/model_states.pt")
flat = torch.randn(24, generator=g)
torch.save({"optimizer_state_dict": {
    "loss_scaler": None, "single_partition_of_fp32_groups": [flat[:12]],
    "base_optimizer_state": {"state": {0: {"step": 3, "exp_avg": flat[12:], "exp_avg_sq": flat[12:] * flat[12:]}},
                             "param_groups": [{"lr": 0.001, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0,
                                               "params": [0]}]}},
    "ds_version": "0.14.4"}, f"{out}/optim_states.pt")
for name in ("model_states", "optim_states"):
    with zipfile.ZipFile(f"{out}/{name}.pt") as z, open(f"{out}/{name}.pkl", "wb") as f:
        f.write(z.read(f"{name}/data.pkl"))
