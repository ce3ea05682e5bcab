"""GPT-NeoX's Transformer Engine layers (te_mha, te_layernorm_mlp) against a torch restatement of
Transformer Engine's formulas: a whole model written here from TE's definitions, with the parameter
names GPT-NeoX's TE path gives its checkpoints, runs forward and backward on random weights; the C
driver tests/drivers/model_parity.c runs neox.c's model on the same weights, mapped to neox.c's names
as docs/model.md ("Transformer Engine") says, and the logits, loss and every gradient must agree to
1e-5 of each tensor's largest magnitude. And a model trained with the TE keys by neox-train exports
(neox-convert to-hf) to a folder transformers loads, whose logits equal neox.c's.

Restated (transformer_engine/pytorch, transformer_engine/common/util/math.h):
- MultiheadAttention (input_layernorm=False, fuse_qkv_params=True, bias=True, causal): one qkv
  Linear whose output is interleaved per head [q_h; k_h; v_h] (qkv_weight_interleaved, TE's
  default), GPT-NeoX's rotary embedding applied rotate-half style to the leading rotary dims of q and
  k, softmax(q k^T / sqrt(head size)) over the causal keys, then the proj Linear.
- LayerNormMLP: its own norm (LayerNorm eps 1e-5 with a bias, or RMSNorm eps 1e-8), fc1, the
  activation (TE's gelu is the tanh approximation; a gated one acts on fc1's first half and
  multiplies by the second; fc1 is 2 x ffn_hidden_size wide), fc2.
"""
import json
import math
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
from safetensors.torch import load_file, save_file  # noqa: E402

import test_convert  # noqa: E402  (the export test's training, driver and transformers helpers)
from test_convert import corpus  # noqa: E402,F401  (its Tiny Shakespeare fixture)

DRIVER = "build/cpu/tests/drivers/model_parity"
B, T, VOCAB, C, HEADS, LAYERS = 2, 9, 64, 32, 4, 2
HS = C // HEADS


def te_gelu(x):  # transformer_engine/common/util/math.h: gelu
    return x * (0.5 + 0.5 * torch.tanh(x * (0.79788456 + 0.03567741 * x * x)))


ACTS = {"gelu": (te_gelu, False), "geglu": (te_gelu, True), "swiglu": (torch.nn.functional.silu, True),
        "relu": (torch.relu, False), "reglu": (torch.relu, True)}


def norm(x, w, b, kind):
    if kind == "layernorm":
        return torch.nn.functional.layer_norm(x, (C,), w, b, eps=1e-5)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-8) * w


def rotary(x, dims, base=10000.0):
    # GPT-NeoX's RotaryEmbedding tables (emb = cat(freqs, freqs)), applied as TE's
    # apply_rotary_pos_emb: t * cos + rotate_half(t) * sin on the leading dims.
    inv = 1.0 / (base ** (torch.arange(0, dims, 2).float() / dims))
    freqs = torch.outer(torch.arange(x.shape[2]).float(), inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    rot, rest = x[..., :dims], x[..., dims:]
    half = torch.cat((-rot[..., dims // 2:], rot[..., :dims // 2]), dim=-1)
    return torch.cat((rot * emb.cos() + half * emb.sin(), rest), dim=-1)


def te_mha(x, p, rot_dims):
    qkv = x @ p["attention.qkv.weight"].T + p["attention.qkv.bias"]
    q, k, v = qkv.view(B, T, HEADS, 3, HS).permute(3, 0, 2, 1, 4)  # each (B, heads, T, HS)
    q, k = rotary(q, rot_dims), rotary(k, rot_dims)
    scores = q @ k.transpose(-1, -2) / math.sqrt(HS)
    scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    att = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, T, C)
    return att @ p["attention.proj.weight"].T + p["attention.proj.bias"]


def te_layernorm_mlp(x, p, kind, act):
    fn, gated = ACTS[act]
    h = norm(x, p["mlp.layer_norm_weight"], p.get("mlp.layer_norm_bias"), kind)
    h = h @ p["mlp.fc1_weight"].T + p["mlp.fc1_bias"]
    if gated:
        a, b = h.chunk(2, dim=-1)
        h = fn(a) * b
    else:
        h = fn(h)
    return h @ p["mlp.fc2_weight"].T + p["mlp.fc2_bias"]


def te_params(kind, act, ffn):
    """Random weights under GPT-NeoX's TE checkpoint names (per layer) and the model's own."""
    g = torch.Generator().manual_seed(4321)
    gated = ACTS[act][1]

    def r(*shape, scale=0.15, around=0.0):
        return (around + scale * torch.randn(*shape, generator=g)).requires_grad_()

    p = {"embed": r(VOCAB, C), "final_norm.weight": r(C, scale=0.2, around=1.0), "out": r(VOCAB, C)}
    if kind == "layernorm":
        p["final_norm.bias"] = r(C, scale=0.1)
    for l in range(LAYERS):
        layer = {"input_layernorm.weight": r(C, scale=0.2, around=1.0), "mlp.layer_norm_weight": r(C, scale=0.2, around=1.0),
                 "attention.qkv.weight": r(3 * C, C), "attention.qkv.bias": r(3 * C, scale=0.1),
                 "attention.proj.weight": r(C, C), "attention.proj.bias": r(C, scale=0.1),
                 "mlp.fc1_weight": r((2 if gated else 1) * ffn, C), "mlp.fc1_bias": r((2 if gated else 1) * ffn, scale=0.1),
                 "mlp.fc2_weight": r(C, ffn), "mlp.fc2_bias": r(C, scale=0.1)}
        if kind == "layernorm":
            layer["input_layernorm.bias"] = r(C, scale=0.1)
            layer["mlp.layer_norm_bias"] = r(C, scale=0.1)
        p.update({f"layers.{l}.{k}": v for k, v in layer.items()})
    return p


def te_forward(p, ids, kind, act, rot_dims):
    """GPT-NeoX's layer with te_mha and te_layernorm_mlp (megatron/model/transformer.py, sequential
    residual): x = x + attn(input_layernorm(x)); x = x + LayerNormMLP(x)."""
    x = p["embed"][ids]
    for l in range(LAYERS):
        lp = {k[len(f"layers.{l}."):]: v for k, v in p.items() if k.startswith(f"layers.{l}.")}
        x = x + te_mha(norm(x, lp["input_layernorm.weight"], lp.get("input_layernorm.bias"), kind), lp, rot_dims)
        x = x + te_layernorm_mlp(x, lp, kind, act)
    x = norm(x, p["final_norm.weight"], p.get("final_norm.bias"), kind)
    return x @ p["out"].T


def neox_names(p, naming, ffn, gated):
    """GPT-NeoX's TE names -> neox.c's (Hugging Face's): {neox.c name: (TE name, row slice or per-head part)}."""
    out = {}
    if naming == "neox":
        out.update({"gpt_neox.embed_in.weight": ("embed", None), "embed_out.weight": ("out", None),
                    "gpt_neox.final_layer_norm.weight": ("final_norm.weight", None),
                    "gpt_neox.final_layer_norm.bias": ("final_norm.bias", None)})
        per_layer = {"input_layernorm.weight": "input_layernorm.weight", "input_layernorm.bias": "input_layernorm.bias",
                     "attention.query_key_value.weight": "attention.qkv.weight",
                     "attention.query_key_value.bias": "attention.qkv.bias",
                     "attention.dense.weight": "attention.proj.weight", "attention.dense.bias": "attention.proj.bias",
                     "post_attention_layernorm.weight": "mlp.layer_norm_weight",
                     "post_attention_layernorm.bias": "mlp.layer_norm_bias",
                     "mlp.dense_h_to_4h.weight": "mlp.fc1_weight", "mlp.dense_h_to_4h.bias": "mlp.fc1_bias",
                     "mlp.dense_4h_to_h.weight": "mlp.fc2_weight", "mlp.dense_4h_to_h.bias": "mlp.fc2_bias"}
        for l in range(LAYERS):
            out.update({f"gpt_neox.layers.{l}.{n}": (f"layers.{l}.{t}", None) for n, t in per_layer.items()})
        return out
    out.update({"model.embed_tokens.weight": ("embed", None), "lm_head.weight": ("out", None),
                "model.norm.weight": ("final_norm.weight", None)})
    for l in range(LAYERS):
        pre, te = f"model.layers.{l}.", f"layers.{l}."
        out[pre + "input_layernorm.weight"] = (te + "input_layernorm.weight", None)
        out[pre + "post_attention_layernorm.weight"] = (te + "mlp.layer_norm_weight", None)
        for i, part in enumerate("qkv"):  # TE's fused QKV is interleaved per head
            for what in ("weight", "bias"):
                out[f"{pre}self_attn.{part}_proj.{what}"] = (f"{te}attention.qkv.{what}", ("head", i))
        out[pre + "self_attn.o_proj.weight"] = (te + "attention.proj.weight", None)
        out[pre + "self_attn.o_proj.bias"] = (te + "attention.proj.bias", None)
        for what, suffix in (("weight", "_weight"), ("bias", "_bias")):  # fc1 = [act half (gate); up]
            out[f"{pre}mlp.gate_proj.{what}"] = (f"{te}mlp.fc1{suffix}", slice(0, ffn))
            out[f"{pre}mlp.up_proj.{what}"] = (f"{te}mlp.fc1{suffix}", slice(ffn, 2 * ffn))
            out[f"{pre}mlp.down_proj.{what}"] = (f"{te}mlp.fc2{suffix}", None)
    return out


def take(t, part):
    if part is None:
        return t
    if isinstance(part, slice):
        return t[part]
    return t.view(HEADS, 3, HS, *t.shape[1:])[:, part[1]].reshape(HEADS * HS, *t.shape[1:])


# name: (norm, activation, naming, ffn_hidden_size, rotary dims)
CASES = {
    # GPT-NeoX's 1-3B-transformer-engine.yml, small: layernorm, gelu (TE's tanh), partial rotary.
    "layernorm-gelu": ("layernorm", "gelu", "neox", 4 * C, HS // 4),
    # te_layernorm_mlp's own width for gated activations: 2 x ffn_hidden_size columns, not 2/3 of it.
    "rmsnorm-geglu": ("rmsnorm", "geglu", "llama", 4 * C, HS),
    "rmsnorm-swiglu": ("rmsnorm", "swiglu", "llama", 40, HS),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_te_layers_parity(case, tmp_path):
    kind, act, naming, ffn, rot_dims = CASES[case]
    gated = ACTS[act][1]
    p = te_params(kind, act, ffn)
    g = torch.Generator().manual_seed(99)
    ids = torch.randint(0, VOCAB, (B, T), generator=g)
    targets = torch.randint(0, VOCAB, (B, T), generator=g)
    mask = (torch.rand((B, T), generator=g) > 0.3).float()
    mask[0, 0] = 1.0
    logits = te_forward(p, ids, kind, act, rot_dims)
    losses = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
    loss = (losses * mask.reshape(-1)).sum() / mask.sum()
    loss.backward()

    names = neox_names(p, naming, ffn, gated)
    assert sorted({t for t, _ in names.values()}) == sorted(p), "every TE parameter maps to neox.c's names"
    save_file({n: take(p[t].detach(), part).contiguous() for n, (t, part) in names.items()},
              str(tmp_path / "weights.safetensors"))
    save_file({"input_ids": ids, "targets": targets, "loss_mask": mask}, str(tmp_path / "inputs.safetensors"))
    act_arg = {"gelu": "gelu_tanh", "geglu": "geglu_tanh"}.get(act, act)
    args = dict(norm=kind, eps=1e-5 if kind == "layernorm" else 1e-8, rotary_dims=rot_dims, parallel=0, act=act_arg,
                attn_bias=1, mlp_bias=1, kv_heads=HEADS, vocab=VOCAB, hidden=C, layers=LAYERS, heads=HEADS, ffn=ffn,
                max_pos=64, tied=0)
    if not os.access(DRIVER, os.X_OK):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    cmd = [DRIVER, str(tmp_path / "weights.safetensors"), str(tmp_path / "inputs.safetensors"),
           str(tmp_path / "out.safetensors")] + [f"{k}={v}" for k, v in args.items()]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert proc.returncode == 0, proc.stderr
    out = load_file(str(tmp_path / "out.safetensors"))

    def close(ours, ref, what):
        scale, err = ref.abs().max().item(), (ours - ref).abs().max().item()
        assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
        assert err <= 1e-5 * max(scale, 1e-6), f"{what}: max difference {err:.3g} exceeds 1e-5 of max |ref| {scale:.3g}"

    close(out["logits"], logits.detach(), "logits")
    close(out["loss"], loss.detach().reshape(1), "loss")
    assert sorted(k[5:] for k in out if k.startswith("grad.")) == sorted(names)
    for n, (t, part) in names.items():
        close(out["grad." + n], take(p[t].grad, part), "gradient of " + n)
    if act in ("gelu", "geglu"):  # TE's gelu is not the exact erf gelu GPT-NeoX's own MLP uses
        exact = torch.nn.functional.gelu(torch.linspace(-3, 3, 61))
        assert (te_gelu(torch.linspace(-3, 3, 61)) - exact).abs().max() > 1e-4


# ---- export ------------------------------------------------------------------------------------
# A model trained with the TE keys exports as the model it is: transformers loads the folder from
# config.json alone (GPT-NeoX names with hidden_act gelu_new; Llama names with gelu_pytorch_tanh and
# the unscaled width; rms_norm_epsilon at GPT-NeoX's default 1e-8, TE's) and its logits on real text
# equal neox.c's on the exported weights.
TE_MODELS = {
    "te-layernorm-gelu": (dict(pos_emb="rotary", rotary_pct=0.25, gpt_j_residual=False, no_weight_tying=True,
                               te_mha=True, te_layernorm_mlp=True), "GPTNeoXForCausalLM", "gelu_new", 128),
    "te-rmsnorm-geglu": (dict(pos_emb="rotary", rotary_pct=1.0, norm="rmsnorm",
                              activation="geglu", intermediate_size=48, gpt_j_residual=False, no_weight_tying=True,
                              te_mha=True, te_layernorm_mlp=True, te_columnparallel=True, te_rowparallel=True),
                         "LlamaForCausalLM", "gelu_pytorch_tanh", 48),
}


@pytest.mark.parametrize("name", sorted(TE_MODELS))
def test_te_export_transformers(name, corpus, tmp_path, monkeypatch):
    model, arch, act, width = TE_MODELS[name]
    prefix, tokens = corpus
    ckpt = test_convert.train(tmp_path, prefix, model)
    out = tmp_path / "hf"
    test_convert.run(test_convert.CONVERT, "to-hf", "--input", ckpt, "--output", out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == [arch] and cfg["hidden_act"] == act and cfg["intermediate_size"] == width, cfg
    monkeypatch.setitem(test_convert.LLAMA_ACT, "gelu_pytorch_tanh", "geglu_tanh")
    ids = test_convert.text_ids(tokens)
    test_convert.close(test_convert.neox_logits(tmp_path, out, ids), test_convert.hf_logits(out, ids), f"{name}: logits")
