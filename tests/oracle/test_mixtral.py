"""test_mixtral.py: Hugging Face's MixtralForCausalLM through neox.c, with transformers as the oracle.

A tiny Mixtral with random weights is built here (no download) and saved with save_pretrained.

- `neox-convert from-hf` imports it as GPT-NeoX keys (moe_num_experts, moe_top_k, the topk router with
  moe_topk_renormalize, swiglu experts of width intermediate_size, GQA, rope_theta, rms_norm_eps,
  untied, sliding_window); `to-hf` gives back every tensor bit for bit and a config.json that
  transformers loads as the same MixtralConfig.
- neox.c's logits, loss and every parameter gradient on those weights (the model_parity driver, told
  the model by config.json as read here) are transformers' within 1e-5, top-1 and top-2, with and
  without a sliding window.
- neox-train fine-tunes the import a few steps; the export of the result gives in transformers the
  logits neox.c computes.
- What neox.c cannot compute is refused naming the field: router_jitter_noise, output_router_logits
  with an auxiliary loss (import); GPT-NeoX's ungated, unrenormalised or Sinkhorn MoE (export).
"""
import json
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

# The convert tests' tools, environment and char-level Tiny Shakespeare fixture.
from test_convert import CONVERT, DRIVER, ENV, TRAIN, corpus  # noqa: E402,F401
VOCAB = 512  # holds the character-level tokenizer's ids


def run(*cmd, status=0):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV)
    assert proc.returncode == status, f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stderr}"
    return proc


def mixtral(top_k=2, experts=4, sliding_window=None, **extra):
    torch.manual_seed(11 + top_k)
    cfg = transformers.MixtralConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=40, max_position_embeddings=64,
                                     rms_norm_eps=1e-5, rope_theta=1000000.0, tie_word_embeddings=False,
                                     num_local_experts=experts, num_experts_per_tok=top_k,
                                     sliding_window=sliding_window, **extra)
    model = transformers.MixtralForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if "norm" in n and n.endswith("weight") else 0.0) + 0.15 * torch.randn_like(p))
            if n.endswith("block_sparse_moe.gate.weight"):
                p.mul_(4)  # decisive scores, so that the routing matters
    model.config._attn_implementation = "eager"
    return model.float()


def driver_args(cfg, training=1):
    """The model_parity driver's description of the Mixtral config.json describes (read here)."""
    args = dict(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                heads=cfg["num_attention_heads"], kv_heads=cfg["num_key_value_heads"], ffn=cfg["intermediate_size"],
                max_pos=cfg["max_position_embeddings"], norm="rmsnorm", eps=cfg["rms_norm_eps"],
                rotary_dims=cfg["hidden_size"] // cfg["num_attention_heads"], rotary_base=cfg["rope_theta"],
                parallel=0, act="swiglu", attn_bias=0, mlp_bias=0, tied=int(cfg["tie_word_embeddings"]),
                moe_experts=cfg["num_local_experts"], moe_top_k=cfg["num_experts_per_tok"], moe_interval=1,
                moe_ffn=cfg["intermediate_size"], moe_router="topk", moe_renorm=1, training=training)
    if cfg.get("sliding_window"):
        args.update(window=cfg["sliding_window"])
    return [f"{k}={v}" for k, v in args.items()]


def neox_outputs(tmp_path, folder, ids, targets, mask):
    """neox.c's logits, loss and gradients for the weights in FOLDER/model.safetensors."""
    if not os.access(DRIVER, os.X_OK):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    cfg = json.loads((folder / "config.json").read_text())
    save_file({"input_ids": ids, "targets": targets, "loss_mask": mask}, str(tmp_path / "inputs.safetensors"))
    run(DRIVER, folder / "model.safetensors", tmp_path / "inputs.safetensors", tmp_path / "out.safetensors",
        *driver_args(cfg))
    return load_file(str(tmp_path / "out.safetensors"))


def close(ours, ref, what):
    """Within 1e-5 of the tensor's largest magnitude, or of 1e-3 for one that is zero in exact arithmetic
    (a top-1 router's gradient: torch's p / p leaves rounding noise of 1e-10 where neox.c has 0)."""
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    err, scale = (ours - ref).abs().max().item(), ref.abs().max().item()
    assert err <= 1e-5 * max(scale, 1e-3), f"{what}: max difference {err:.3g} exceeds 1e-5 of max |ref| {scale:.3g}"


def batch(T=24):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, VOCAB, (2, T), generator=g)
    targets = torch.randint(0, VOCAB, (2, T), generator=g)
    mask = (torch.rand((2, T), generator=g) > 0.3).float()
    return ids, targets, mask


def import_export(model, tmp_path):
    src, save, out = tmp_path / "src", tmp_path / "imported", tmp_path / "exported"
    model.save_pretrained(str(src), safe_serialization=True)
    run(CONVERT, "from-hf", "--input", src, "--output", save)
    run(CONVERT, "verify", save)
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    return src, save, out


def assert_same_tensors(folder, model):
    exported = load_file(str(folder / "model.safetensors"))
    original = {n: p.detach() for n, p in model.named_parameters()}
    assert exported.keys() == original.keys()
    for n, p in original.items():
        assert torch.equal(exported[n], p), f"{n} changed in the round trip"


CASES = {"top2": dict(top_k=2), "top1": dict(top_k=1), "top2-window": dict(top_k=2, sliding_window=8)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_mixtral_import_parity(case, tmp_path):
    model = mixtral(**CASES[case])
    src, save, out = import_export(model, tmp_path)
    yml = (save / "model.yml").read_text()
    top_k, window = CASES[case]["top_k"], CASES[case].get("sliding_window")
    for line in ["moe_num_experts: 4", f"moe_top_k: {top_k}", "moe_router_type: topk", "moe_topk_renormalize: true",
                 "moe_expert_interval: 1", "activation: swiglu", "intermediate_size: 40", "num_kv_heads: 2",
                 "rotary_emb_base: 1000000", "rms_norm_epsilon: 1.0e-05", "no_weight_tying: true", "norm: rmsnorm"]:
        assert line + "\n" in yml, f"{line!r} not in model.yml:\n{yml}"
    assert ("sliding_window_width: 7\n" in yml) == bool(window), yml

    # The export: the same tensors, and transformers reads the same configuration back.
    assert_same_tensors(out, model)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["MixtralForCausalLM"] and cfg["model_type"] == "mixtral"
    back = transformers.AutoConfig.from_pretrained(str(out)).to_dict()
    want = transformers.AutoConfig.from_pretrained(str(src)).to_dict()
    for key in ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "rope_theta", "sliding_window", "num_experts_per_tok", "num_local_experts", "output_router_logits",
                "router_jitter_noise", "tie_word_embeddings", "attention_dropout"]:
        assert back[key] == want[key], f"config.json's {key}: {back[key]!r}, was {want[key]!r}"

    # neox.c's logits, loss and gradients on the exported weights are transformers'.
    ids, targets, mask = batch()
    got = neox_outputs(tmp_path, out, ids, targets, mask)
    model.train()
    logits = model(input_ids=ids).logits
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
    loss = (losses * mask.reshape(-1)).sum() / mask.sum()
    loss.backward()
    close(got["logits"], logits.detach(), "logits")
    close(got["loss"], loss.detach().reshape(1), "loss")
    names = [n for n, _ in model.named_parameters()]
    assert sorted(k[5:] for k in got if k.startswith("grad.")) == sorted(names)
    for n, p in model.named_parameters():
        close(got["grad." + n], p.grad if p.grad is not None else torch.zeros_like(p), "gradient of " + n)
    # The renormalisation matters: top-2 routers get gradients, a top-1 router none (its weight is 1).
    gate = got["grad.model.layers.0.block_sparse_moe.gate.weight"]
    assert (gate.abs().max().item() > 1e-6) == (top_k > 1)
    if window:  # the window binds: without it the logits differ
        wide = mixtral(**{**CASES[case], "sliding_window": None})
        wide.load_state_dict(model.state_dict())
        wide.config._attn_implementation = "eager"
        assert (wide(input_ids=ids).logits - logits).abs().max().item() > 1e-3


def test_mixtral_fine_tune_export(corpus, tmp_path):
    """A few AdamW steps of neox-train on the import; transformers gives the export neox.c's logits."""
    prefix, tokens = corpus
    model = mixtral(top_k=2)
    _, save, _ = import_export(model, tmp_path)
    data = dict(data_path=prefix, tokenizer_type="CharLevelTokenizer", train_micro_batch_size_per_gpu=2,
                load=str(save), finetune=True, train_iters=4, eval_interval=1000, log_dir=str(tmp_path / "ft"),
                log_interval=1, optimizer={"type": "Adam", "params": {"lr": 0.003}}, lr_decay_style="constant",
                seq_length=32, save=str(tmp_path / "tuned"), checkpoint_factor=4)
    (tmp_path / "data.yml").write_text(json.dumps(data))
    run(TRAIN, "-q", save / "model.yml", tmp_path / "data.yml")
    out = tmp_path / "tuned_hf"
    run(CONVERT, "to-hf", "--input", tmp_path / "tuned", "--output", out)
    tuned = transformers.AutoModelForCausalLM.from_pretrained(str(out), torch_dtype=torch.float32)
    assert type(tuned).__name__ == "MixtralForCausalLM"
    changed = load_file(str(out / "model.safetensors"))
    assert any(not torch.equal(changed[n], p.detach()) for n, p in model.named_parameters() if ".experts." in n)
    ids = torch.tensor(tokens[100:164].astype(np.int64)).reshape(2, 32)
    tuned.config._attn_implementation = "eager"
    with torch.no_grad():
        ref = tuned.eval()(input_ids=ids).logits
    close(neox_outputs(tmp_path, out, ids, ids.clone(), torch.ones(2, 32))["logits"], ref, "fine-tuned logits")


@pytest.mark.parametrize("extra,field", [(dict(router_jitter_noise=0.1), "router_jitter_noise"),
                                         (dict(output_router_logits=True), "output_router_logits"),
                                         (dict(num_local_experts=1, num_experts_per_tok=1), "num_local_experts")])
def test_mixtral_import_refuses(extra, field, tmp_path):
    src, extra = tmp_path / "src", dict(extra)
    top_k, experts = extra.pop("num_experts_per_tok", 2), extra.pop("num_local_experts", 4)
    mixtral(top_k=top_k, experts=experts, **extra).save_pretrained(str(src), safe_serialization=True)
    proc = run(CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out", status=2)
    assert f"'{field}'" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


MOE_BASE = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=32, max_position_embeddings=32,
                norm="rmsnorm", pos_emb="rotary", rotary_pct=1.0, activation="swiglu", intermediate_size=40,
                use_bias_in_attn_linear=False, use_bias_in_mlp=False, no_weight_tying=True, moe_num_experts=4,
                moe_top_k=2, moe_router_type="topk", moe_topk_renormalize=True)


@pytest.mark.parametrize("change,field", [
    (dict(activation="gelu", norm="layernorm", use_bias_in_mlp=True), "activation"),
    (dict(moe_topk_renormalize=False), "moe_topk_renormalize"),
    (dict(moe_router_type="sinkhorn", moe_topk_renormalize=False), "moe_router_type"),
    (dict(moe_expert_interval=2), "moe_expert_interval"),
])
def test_gpt_neox_moe_export_refused(change, field, corpus, tmp_path):
    """GPT-NeoX's MoE (ungated, unrenormalised, Sinkhorn, or not on every layer): no transformers class."""
    prefix, _ = corpus
    config = dict(MOE_BASE, **change, train_micro_batch_size_per_gpu=2, train_iters=1, eval_interval=1000,
                  optimizer={"type": "Adam", "params": {"lr": 0.001}}, lr_decay_style="constant", data_path=prefix,
                  tokenizer_type="CharLevelTokenizer", save=str(tmp_path / "ckpt"), checkpoint_factor=1,
                  log_dir=str(tmp_path / "log"))
    (tmp_path / "train.yml").write_text(json.dumps(config))
    run(TRAIN, "-q", tmp_path / "train.yml")
    proc = run(CONVERT, "to-hf", "--input", tmp_path / "ckpt", "--output", tmp_path / "hf", status=2)
    assert f"MixtralForCausalLM cannot hold this Mixture of Experts: {field}" in proc.stderr, proc.stderr
    assert not (tmp_path / "hf").exists()
