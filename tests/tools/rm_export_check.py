"""rm_export_check.py: a reward model's Hugging Face export against transformers (tests/tools/train_rm.sh).

  rm_export_check.py HF_DIR HF_Z_DIR PAIRS_PREFIX WORK_DIR

HF_DIR and HF_Z_DIR are `neox-convert to-hf --pad-token-id` exports of reward models trained without and
with z_loss on pairs whose sides end with EOD twice, only the second labelled (tests/tools/dpo_pairs.py
rm). A sequence's reward is then the value at the input position of the first EOD: transformers'
...ForSequenceClassification, given the side without its last token (and, for half the rows, a
shorter prefix right-padded with the pad token), reads it at the last non-pad token. Checks:
- the folder loads as ...ForSequenceClassification with one label, score.weight (1, hidden) and the
  pad token id given;
- its logits equal neox.c's values at the same positions (the model_parity driver on the exported
  weights, value_head=1) within 1e-5 in fp32;
- it ranks the held-out pairs (chosen above rejected for at least 90% of them);
- the z_loss model's rewards are smaller (mean square under half the other's)."""
import json
import os
import sys

import numpy as np
import torch
import transformers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "oracle"))
from data_oracle import read_indexed  # noqa: E402
import test_model_parity as parity  # noqa: E402

PAD = 1


def documents(prefix):
    sizes, pointers, _, tokens = read_indexed(prefix)
    itemsize = tokens.dtype.itemsize
    return [tokens[p // itemsize: p // itemsize + n].astype(np.int64) for p, n in zip(pointers, sizes)]


def load(hf_dir):
    config = json.load(open(os.path.join(hf_dir, "config.json")))
    assert config["architectures"][0].endswith("ForSequenceClassification"), config["architectures"]
    assert config["pad_token_id"] == PAD, config
    model = transformers.AutoModelForSequenceClassification.from_pretrained(hf_dir, torch_dtype=torch.float32)
    assert type(model).__name__ == config["architectures"][0] and model.config.num_labels == 1
    assert model.score.weight.shape == (1, model.config.hidden_size) and model.score.bias is None
    return model.eval()


def batch(chosen, rejected):
    """Rows: every chosen side, then every rejected side, without the last token; odd rows cut shorter
    and padded. Returns ids (2N, T) and each row's reward position."""
    rows = [d[:-1] for d in chosen] + [d[:-1] for d in rejected]
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), PAD, dtype=torch.int64)
    last = []
    for i, r in enumerate(rows):
        n = len(r) - (5 if i % 2 else 0)
        ids[i, :n] = torch.from_numpy(r[:n])
        last.append(n - 1)
    return ids, last


def neox_values(model, hf_dir, ids, last, work):
    """neox.c's value at each row's reward position, from the exported weights."""
    os.makedirs(work, exist_ok=True)
    kind = "neox" if model.config.model_type == "gpt_neox" else "llama"
    mask = torch.zeros(ids.shape)
    for i, pos in enumerate(last):
        mask[i, pos] = 1.0
    weights = load_file(os.path.join(hf_dir, "model.safetensors"))
    save_file(weights, os.path.join(work, "weights.safetensors"))
    save_file({"input_ids": ids, "targets": ids.clone(), "loss_mask": mask}, os.path.join(work, "inputs.safetensors"))
    import subprocess
    out = os.path.join(work, "out.safetensors")
    cmd = [parity.DRIVER, os.path.join(work, "weights.safetensors"), os.path.join(work, "inputs.safetensors"), out]
    cmd += parity.driver_args(kind, model.config, {}) + ["value_head=1"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    values = load_file(out)["values"]
    return torch.stack([values[i, pos] for i, pos in enumerate(last)])


def main(hf_dir, hf_z_dir, prefix, work):
    chosen, rejected = documents(prefix + "_chosen_document"), documents(prefix + "_rejected_document")
    ids, last = batch(chosen, rejected)
    squares = []
    for i, d in enumerate((hf_dir, hf_z_dir)):
        model = load(d)
        with torch.no_grad():
            logits = model(input_ids=ids).logits.squeeze(-1)
        ours = neox_values(model, d, ids, last, os.path.join(work, str(i)))
        err = (ours - logits).abs().max().item()
        assert err <= 1e-5 * max(1.0, logits.abs().max().item()), f"{d}: max difference {err:.3g}"
        with torch.no_grad():  # full sequences, no padding: the rewards training compared
            full = torch.tensor(np.stack([c[:-1] for c in chosen] + [r[:-1] for r in rejected]))
            rewards = model(input_ids=full).logits.squeeze(-1)
        n = len(chosen)
        accuracy = (rewards[:n] > rewards[n:]).float().mean().item()
        squares.append((rewards ** 2).mean().item())
        print(f"{d}: max |transformers - neox.c| {err:.3g}, held-out accuracy {accuracy:.3f}, "
              f"mean squared reward {squares[-1]:.4g}")
        assert accuracy >= 0.9, accuracy
    assert squares[1] < 0.5 * squares[0], squares


if __name__ == "__main__":
    main(*sys.argv[1:5])
