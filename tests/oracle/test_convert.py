"""test_convert.py: neox-convert against Hugging Face transformers (the oracle).

- Export: tiny NeoX-style and Llama-style models trained by neox-train on Tiny Shakespeare are
  exported with `neox-convert to-hf`; transformers loads the folder (AutoModelForCausalLM, from
  config.json alone) and its logits on real text equal neox.c's (the model_parity driver on the
  exported weights with the sizes read from config.json) within 1e-5 of the largest logit; config.json
  carries the trained config's fields; bf16/fp16 exports equal torch's casts of the fp32 export; a
  sharded export (with its index) loads to the same logits.
- Import: transformers-created random models saved with safetensors (one file and sharded) are
  imported with `neox-convert from-hf --tp 2`, exported again, and give transformers' logits in
  neox.c; the re-exported tensors are bit-identical to the original ones; neox-train fine-tunes
  from the imported checkpoint.
"""
import json
import os
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file, save_file  # noqa: E402

from data_oracle import BIN  # noqa: E402

CONVERT = os.path.join(BIN, "neox-convert")
TRAIN = os.path.join(BIN, "neox-train")
PRE = os.path.join(BIN, "neox-preprocess")
DRIVER = "build/cpu/tests/drivers/model_parity"
TEXT = "../shared/data/text/tinyshakespeare_input.txt"
ENV = dict(os.environ, OMP_NUM_THREADS="2")


def run(*cmd):
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=ENV)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))}: exit {proc.returncode}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    if not os.path.exists(TEXT):
        pytest.skip(f"{TEXT} is absent")
    root = tmp_path_factory.mktemp("convert_corpus")
    with open(TEXT, encoding="utf-8") as f:
        text = f.read()[:60000]
    with open(root / "s.jsonl", "w") as f:
        for para in text.split("\n\n"):
            if para.strip():
                f.write(json.dumps({"text": para}) + "\n")
    run(PRE, "--input", root / "s.jsonl", "--output-prefix", root / "char", "--tokenizer-type", "CharLevelTokenizer",
        "--append-eod")
    tokens = np.fromfile(root / "char_text_document.bin", dtype=np.uint16)
    return str(root / "char_text_document"), tokens


MODELS = {
    "neox-parallel-gelu-untied": dict(pos_emb="rotary", rotary_pct=0.25, gpt_j_residual=True, no_weight_tying=True),
    "neox-sequential-tanh-tied": dict(pos_emb="rotary", rotary_pct=0.5, gpt_j_residual=False, no_weight_tying=False,
                                      bias_gelu_fusion=True, rotary_emb_base=500),
    "llama-gqa-swiglu": dict(pos_emb="rotary", rotary_pct=1.0, norm="rmsnorm", activation="swiglu", num_kv_heads=2, intermediate_size=96, mlp_multiple_of=16,
                             use_bias_in_attn_linear=False, use_bias_in_mlp=False, gpt_j_residual=False,
                             no_weight_tying=True),
}


def train(tmp_path, prefix, model):
    config = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=32, max_position_embeddings=32,
                  init_method="small_init", output_layer_init_method="wang_init",
                  optimizer={"type": "Adam", "params": {"lr": 0.01}}, train_micro_batch_size_per_gpu=2,
                  train_iters=3, eval_interval=1000, lr_decay_style="constant", data_path=prefix,
                  tokenizer_type="CharLevelTokenizer", save=str(tmp_path / "ckpt"), checkpoint_factor=3,
                  log_dir=str(tmp_path / "log"), **model)
    (tmp_path / "train.yml").write_text(json.dumps(config))
    run(TRAIN, "-q", tmp_path / "train.yml")
    return tmp_path / "ckpt"


# hidden_act -> GPT-NeoX's activation: elementwise in GPTNeoXForCausalLM; in LlamaForCausalLM the
# function of the gate in down(act(gate(x)) * up(x)), i.e. GPT-NeoX's gated activations.
NEOX_ACT = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu", "silu": "silu",
            "mish": "mish"}
LLAMA_ACT = {"silu": "swiglu", "gelu": "geglu", "relu": "reglu", "sigmoid": "glu", "linear": "bilinear"}


def driver_args(cfg):
    """The model_parity driver's description of the model config.json describes (read here, independently)."""
    hs = cfg["hidden_size"] // cfg["num_attention_heads"]
    if cfg["model_type"] == "gpt_neox":
        args = dict(norm="layernorm", eps=cfg["layer_norm_eps"], rotary_dims=int(hs * cfg["rotary_pct"]),
                    rotary_base=cfg["rotary_emb_base"], parallel=int(cfg["use_parallel_residual"]),
                    act=NEOX_ACT[cfg["hidden_act"]], attn_bias=int(cfg["attention_bias"]),
                    mlp_bias=1, kv_heads=cfg["num_attention_heads"])
    else:
        args = dict(norm="rmsnorm", eps=cfg["rms_norm_eps"], rotary_dims=hs, rotary_base=cfg["rope_theta"], parallel=0,
                    act=LLAMA_ACT[cfg.get("hidden_act", "silu")], attn_bias=int(cfg.get("attention_bias", False)), mlp_bias=int(cfg.get("mlp_bias", False)),
                    kv_heads=cfg["num_key_value_heads"])
    if cfg["model_type"] == "qwen2":
        args.update(attn_bias=1, attn_out_bias=0)
    if cfg["model_type"] == "mistral" and cfg.get("sliding_window"):
        args.update(window=cfg["sliding_window"])  # keys a query sees, itself included, as transformers counts
    scaling = cfg.get("rope_scaling")
    if scaling:
        args.update(rope_type=scaling["rope_type"], rope_factor=scaling["factor"])
        if scaling["rope_type"] == "llama3":
            args.update(rope_low=scaling["low_freq_factor"], rope_high=scaling["high_freq_factor"],
                        rope_orig=scaling["original_max_position_embeddings"])
    args.update(vocab=cfg["vocab_size"], hidden=cfg["hidden_size"], layers=cfg["num_hidden_layers"],
                heads=cfg["num_attention_heads"], ffn=cfg["intermediate_size"], max_pos=cfg["max_position_embeddings"],
                tied=int(cfg.get("tie_word_embeddings", False)))
    return [f"{k}={v}" for k, v in args.items()]


def neox_logits(tmp_path, folder, ids):
    """neox.c's logits for the weights in FOLDER/model.safetensors (the model_parity driver)."""
    if not os.access(DRIVER, os.X_OK):
        pytest.fail(f"{DRIVER} is missing (run 'make test-drivers')")
    cfg = json.loads((folder / "config.json").read_text())
    save_file({"input_ids": ids, "targets": ids.clone()}, str(tmp_path / "inputs.safetensors"))
    run(DRIVER, folder / "model.safetensors", tmp_path / "inputs.safetensors", tmp_path / "out.safetensors",
        *driver_args(cfg))
    return load_file(str(tmp_path / "out.safetensors"))["logits"]


def hf_logits(folder_or_model, ids):
    model = folder_or_model
    if not isinstance(model, torch.nn.Module):
        model = transformers.AutoModelForCausalLM.from_pretrained(str(folder_or_model), torch_dtype=torch.float32)
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def close(ours, ref, what):
    assert ours.shape == ref.shape, f"{what}: shape {tuple(ours.shape)} vs {tuple(ref.shape)}"
    err, scale = (ours - ref).abs().max().item(), ref.abs().max().item()
    assert err <= 1e-5 * scale, f"{what}: max difference {err:.3g} exceeds 1e-5 of max |ref| {scale:.3g}"


def text_ids(tokens):
    return torch.tensor(tokens[100:164].astype(np.int64)).reshape(2, 32)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_export_parity(name, corpus, tmp_path):
    prefix, tokens = corpus
    model = MODELS[name]
    ckpt = train(tmp_path, prefix, model)
    out = tmp_path / "hf"
    run(CONVERT, "to-hf", "--input", ckpt, "--output", out)
    cfg = json.loads((out / "config.json").read_text())
    llama = model.get("activation") == "swiglu"
    assert cfg["architectures"] == ["LlamaForCausalLM" if llama else "GPTNeoXForCausalLM"]
    assert cfg["num_hidden_layers"] == 2 and cfg["hidden_size"] == 32 and cfg["num_attention_heads"] == 4
    assert cfg["tie_word_embeddings"] == (not model["no_weight_tying"])
    if llama:
        assert cfg["num_key_value_heads"] == 2
    else:
        assert cfg["rotary_pct"] == model["rotary_pct"] and cfg["use_parallel_residual"] == model["gpt_j_residual"]
        assert cfg["hidden_act"] == ("gelu_new" if model.get("bias_gelu_fusion") else "gelu")
        assert cfg["rotary_emb_base"] == model.get("rotary_emb_base", 10000) and cfg["intermediate_size"] == 128
    gen = json.loads((out / "generation_config.json").read_text())
    assert gen["eos_token_id"] == cfg["eos_token_id"]
    ids = text_ids(tokens)
    ref = hf_logits(out, ids)
    close(neox_logits(tmp_path, out, ids), ref, f"{name}: logits")

    # Casts: what torch makes of the fp32 export.
    fp32 = load_file(str(out / "model.safetensors"))
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        run(CONVERT, "to-hf", "--input", ckpt, "--output", tmp_path / dtype, "--dtype", dtype)
        cast = load_file(str(tmp_path / dtype / "model.safetensors"))
        assert cast.keys() == fp32.keys()
        for k, v in fp32.items():
            assert cast[k].dtype == torch_dtype and torch.equal(cast[k], v.to(torch_dtype)), f"{dtype} {k}"

    # A sharded export: several files and an index, loaded to the same logits.
    run(CONVERT, "to-hf", "--input", ckpt, "--output", tmp_path / "sharded", "--max-shard-size", "40K")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    files = set(index["weight_map"].values())
    assert len(files) > 1 and set(index["weight_map"]) == set(fp32)
    close(hf_logits(tmp_path / "sharded", ids), ref, f"{name}: sharded export logits")


def random_hf_model(kind, vocab, hidden_act=None, **extra):
    torch.manual_seed(7)
    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64)
    if kind == "neox":
        cfg = transformers.GPTNeoXConfig(intermediate_size=80, rotary_pct=0.5, use_parallel_residual=False,
                                         hidden_act=hidden_act or "gelu_new", tie_word_embeddings=False, **common, **extra)
        model = transformers.GPTNeoXForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(intermediate_size=48, num_key_value_heads=2, tie_word_embeddings=True,
                                       rope_theta=extra.pop("rope_theta", 1000.0), hidden_act=hidden_act or "silu",
                                       **common, **extra)
        model = transformers.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if "norm" in n and n.endswith("weight") else 0.0) + 0.15 * torch.randn_like(p))
    return model.float()


@pytest.mark.parametrize("kind,shard", [("neox", None), ("llama", "20KB")])
def test_import_tp2(kind, shard, corpus, tmp_path):
    prefix, tokens = corpus
    model = random_hf_model(kind, 512)
    src = tmp_path / "src"
    model.save_pretrained(str(src), safe_serialization=True, **({"max_shard_size": shard} if shard else {}))
    assert (src / "model.safetensors.index.json").exists() == bool(shard)
    save = tmp_path / "imported"
    run(CONVERT, "from-hf", "--input", src, "--output", save, "--tp", "2")
    shards = sorted(p.name for p in (save / "global_step0").iterdir())
    assert shards == ["manifest.json", "rank_00000.h5", "rank_00001.h5"]
    run(CONVERT, "verify", save)
    out = tmp_path / "exported"
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    original = {n: p.detach() for n, p in model.named_parameters()}
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == original.keys()
    for n, p in original.items():
        assert torch.equal(exported[n], p), f"{n} changed in the round trip"
    ids = text_ids(tokens)
    close(neox_logits(tmp_path, out, ids), hf_logits(model, ids), f"{kind}: logits of the imported model")

    # neox-train fine-tunes from it: model.yml as it is, with the user's own run file in place of
    # run.yml (its seq_length, batch and load are theirs to choose; this folder has no tokenizer).
    run_yml = (save / "run.yml").read_text()
    assert f'load: "{save}"' in run_yml and "finetune: true" in run_yml
    data = dict(data_path=prefix, tokenizer_type="CharLevelTokenizer", train_micro_batch_size_per_gpu=2,
                load=str(save), finetune=True,
                train_iters=2, eval_interval=1000, log_dir=str(tmp_path / "ft"), log_interval=1,
                optimizer={"type": "Adam", "params": {"lr": 0.001}}, lr_decay_style="constant",
                seq_length=32)
    (tmp_path / "data.yml").write_text(json.dumps(data))
    proc = run(TRAIN, save / "model.yml", tmp_path / "data.yml")
    assert "loaded checkpoint" in proc.stderr
    losses = [r["train/lm_loss"] for r in map(json.loads, (tmp_path / "ft" / "metrics.jsonl").read_text().splitlines())
              if "train/lm_loss" in r]
    assert len(losses) == 2 and all(np.isfinite(losses))


# Each activation a Hugging Face class can hold: imported, it gives transformers' logits in neox.c
# and exports back to the same hidden_act and bit-identical tensors.
@pytest.mark.parametrize("kind,hidden_act,activation", [
    ("neox", "relu", "relu"), ("neox", "silu", "silu"), ("neox", "mish", "mish"), ("llama", "gelu", "geglu"),
    ("llama", "relu", "reglu"), ("llama", "sigmoid", "glu"), ("llama", "linear", "bilinear")])
def test_import_activation(kind, hidden_act, activation, corpus, tmp_path):
    _, tokens = corpus
    model = random_hf_model(kind, 512, hidden_act)
    src, save, out = tmp_path / "src", tmp_path / "imported", tmp_path / "exported"
    model.save_pretrained(str(src), safe_serialization=True)
    run(CONVERT, "from-hf", "--input", src, "--output", save)
    assert f"activation: {activation}\n" in (save / "model.yml").read_text()
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    assert json.loads((out / "config.json").read_text())["hidden_act"] == hidden_act
    exported = load_file(str(out / "model.safetensors"))
    for n, p in model.named_parameters():
        assert torch.equal(exported[n], p.detach()), f"{n} changed in the round trip"
    ids = text_ids(tokens)
    close(neox_logits(tmp_path, out, ids), hf_logits(model, ids), f"{kind} {hidden_act}: logits of the imported model")


@pytest.mark.parametrize("kind,hidden_act", [("neox", "tanh"), ("llama", "gelu_new")])
def test_import_refuses_activation(kind, hidden_act, tmp_path):
    src = tmp_path / "src"
    random_hf_model(kind, 512, hidden_act).save_pretrained(str(src), safe_serialization=True)
    proc = subprocess.run([CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out"], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 2 and f"hidden_act '{hidden_act}' is not supported" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# Llama-3-style configs: rope_theta 500000, tied embeddings and rope_scaling (llama3, linear) carried
# through from-hf and to-hf, with transformers' logits in neox.c.
LLAMA3_SCALING = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)


@pytest.mark.parametrize("kind,scaling", [("llama", LLAMA3_SCALING), ("llama", dict(rope_type="linear", factor=4.0)),
                                          ("neox", dict(rope_type="linear", factor=2.0))])
def test_import_rope_scaling(kind, scaling, corpus, tmp_path):
    _, tokens = corpus
    extra = dict(rope_scaling=scaling) if kind == "neox" else dict(rope_scaling=scaling, rope_theta=500000.0)
    model = random_hf_model(kind, 512, **extra)
    src, save, out = tmp_path / "src", tmp_path / "imported", tmp_path / "exported"
    model.save_pretrained(str(src), safe_serialization=True)
    run(CONVERT, "from-hf", "--input", src, "--output", save)
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["rope_scaling"] == scaling
    if kind == "llama":
        assert cfg["rope_theta"] == 500000.0 and cfg["tie_word_embeddings"] is True
    exported = load_file(str(out / "model.safetensors"))
    for n, p in model.named_parameters():
        assert torch.equal(exported[n], p.detach()), f"{n} changed in the round trip"
    ids = text_ids(tokens)
    close(neox_logits(tmp_path, out, ids), hf_logits(model, ids), f"{kind} {scaling['rope_type']}: logits")
    close(hf_logits(out, ids), hf_logits(model, ids), f"{kind} {scaling['rope_type']}: exported model's logits")


@pytest.mark.parametrize("scaling,field", [(dict(rope_type="yarn", factor=4.0), "rope_scaling.rope_type 'yarn'"),
                                           (dict(rope_type="dynamic", factor=2.0), "rope_scaling.rope_type 'dynamic'"),
                                           (dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0), "original_max_position_embeddings")])
def test_import_refuses_rope_scaling(scaling, field, tmp_path):
    src = tmp_path / "src"
    model = random_hf_model("llama", 512)
    model.config.rope_scaling = scaling  # set after construction: transformers validates at __init__
    model.save_pretrained(str(src), safe_serialization=True)
    proc = subprocess.run([CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out"], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 2 and field in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def random_mistral_model(sliding_window):
    torch.manual_seed(11)
    cfg = transformers.MistralConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                     sliding_window=sliding_window, rope_theta=1000000.0)
    model = transformers.MistralForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if "norm" in n and n.endswith("weight") else 0.0) + 0.15 * torch.randn_like(p))
    return model.float()


# MistralForCausalLM: a window that covers every position (v0.3's null, or >= max_position_embeddings)
# is Llama's block, exported back as LlamaForCausalLM; a shorter one (v0.1's) is sliding_window_width
# (one less: GPT-NeoX's mask keeps keys i - W .. i), exported back as MistralForCausalLM with the same
# sliding_window. Either way transformers' logits (its own sliding-window mask) are neox.c's.
@pytest.mark.parametrize("window,width", [(None, None), (64, None), (16, 15), (5, 4)])
def test_import_mistral(window, width, corpus, tmp_path):
    _, tokens = corpus
    model = random_mistral_model(window)
    model.config._attn_implementation = "eager"
    src, save, out = tmp_path / "src", tmp_path / "imported", tmp_path / "exported"
    model.save_pretrained(str(src), safe_serialization=True)
    run(CONVERT, "from-hf", "--input", src, "--output", save)
    model_yml = (save / "model.yml").read_text()
    assert (f"sliding_window_width: {width}\n" in model_yml) if width is not None else "sliding_window" not in model_yml
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    cfg = json.loads((out / "config.json").read_text())
    if width is None:
        assert cfg["architectures"] == ["LlamaForCausalLM"]
    else:
        assert cfg["architectures"] == ["MistralForCausalLM"] and cfg["sliding_window"] == window
    exported = load_file(str(out / "model.safetensors"))
    for n, p in model.named_parameters():
        assert torch.equal(exported[n], p.detach()), f"{n} changed in the round trip"
    ids = text_ids(tokens)
    close(neox_logits(tmp_path, out, ids), hf_logits(model, ids), f"mistral window {window}: logits")
    if width is not None:  # the window binds: without it the logits differ
        full = transformers.MistralForCausalLM(transformers.MistralConfig(**{**model.config.to_dict(), "sliding_window": None}))
        full.load_state_dict(model.state_dict())
        assert (hf_logits(full.float(), ids) - hf_logits(model, ids)).abs().max() > 1e-3


def test_import_mistral_refuses_zero_window(tmp_path):
    src = tmp_path / "src"
    random_mistral_model(16).save_pretrained(str(src), safe_serialization=True)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "sliding_window": 0}))
    proc = subprocess.run([CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out"], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 2, proc.stderr
    assert "'sliding_window' is not a positive integer" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def random_qwen2_model(**extra):
    torch.manual_seed(13)
    cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=64,
                                   rope_theta=1000000.0, tie_word_embeddings=True, **extra)
    model = transformers.Qwen2ForCausalLM(cfg)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_((1.0 if "norm" in n and n.endswith("weight") else 0.0) + 0.15 * torch.randn_like(p))
    return model.float()


# Qwen2ForCausalLM (q/k/v biases, no output bias): imported with transformers' logits, exported back
# as Qwen2ForCausalLM with the same tensors; its sliding window (use_sliding_window) is refused.
def test_import_qwen2(corpus, tmp_path):
    _, tokens = corpus
    model = random_qwen2_model()
    src, save, out = tmp_path / "src", tmp_path / "imported", tmp_path / "exported"
    model.save_pretrained(str(src), safe_serialization=True)
    run(CONVERT, "from-hf", "--input", src, "--output", save)
    assert "use_bias_in_attn_output: false\n" in (save / "model.yml").read_text()
    run(CONVERT, "to-hf", "--input", save, "--output", out)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen2ForCausalLM"] and cfg["use_sliding_window"] is False
    exported = load_file(str(out / "model.safetensors"))
    assert exported.keys() == {n for n, _ in model.named_parameters()}
    for n, p in model.named_parameters():
        assert torch.equal(exported[n], p.detach()), f"{n} changed in the round trip"
    ids = text_ids(tokens)
    ref = hf_logits(model, ids)
    close(neox_logits(tmp_path, out, ids), ref, "qwen2: logits of the imported model")
    close(hf_logits(out, ids), ref, "qwen2: the exported model's logits")


def test_import_qwen2_refuses_sliding_window(tmp_path):
    src = tmp_path / "src"
    random_qwen2_model(use_sliding_window=True, sliding_window=16).save_pretrained(str(src), safe_serialization=True)
    proc = subprocess.run([CONVERT, "from-hf", "--input", src, "--output", tmp_path / "out"], capture_output=True,
                          text=True, env=ENV)
    assert proc.returncode == 2 and "use_sliding_window" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


TOKENIZERS = "../shared/data/tokenizers"
HOSTILE = ["", "  leading spaces", "trailing  ", "tabs\tand\r\nCRLF", "<|endoftext|>mid<|endoftext|>",
           "Ünïcödé — ‘quotes’ 日本語 🤖 e\u0301", "x" * 300, "  \n\n  ", "numbers 12345 3.14 -7"]


def export_texts():
    texts = list(HOSTILE)
    for name in ("tinyshakespeare_input.txt", "enwik8_first100.txt"):
        path = os.path.join("../shared/data/text", name)
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(20000)
        texts += [text[i:i + 700] for i in range(0, len(text), 700)]
    return texts


@pytest.mark.parametrize("kind", ["20B", "20B-prefix-space", "gpt2"])
def test_export_tokenizer(kind, corpus, tmp_path):
    """transformers' AutoTokenizer on the exported folder encodes as HF tokenizers does on the
    original tokenizer file, and knows the end-of-document token."""
    tokenizers = pytest.importorskip("tokenizers")
    prefix, _ = corpus
    if kind == "gpt2":
        files = dict(tokenizer_type="GPT2BPETokenizer", vocab_file=f"{TOKENIZERS}/gpt2/vocab.json",
                     merge_file=f"{TOKENIZERS}/gpt2/merges.txt")
        oracle_file = f"{TOKENIZERS}/gpt2/gpt2_tokenizer.json"
    else:
        oracle_file = f"{TOKENIZERS}/neox/20B_tokenizer.json"
        if kind == "20B-prefix-space":
            spec = json.loads(open(oracle_file, encoding="utf-8").read())
            spec["pre_tokenizer"]["add_prefix_space"] = True
            oracle_file = str(tmp_path / "prefix_tokenizer.json")
            (tmp_path / "prefix_tokenizer.json").write_text(json.dumps(spec))
        files = dict(tokenizer_type="HFTokenizer", vocab_file=oracle_file)
    config = dict(num_layers=1, hidden_size=16, num_attention_heads=2, seq_length=32, max_position_embeddings=32,
                  pos_emb="rotary", optimizer={"type": "Adam", "params": {"lr": 0.01}}, train_micro_batch_size_per_gpu=1,
                  train_iters=1, eval_interval=1000, lr_decay_style="constant", data_path=prefix,
                  save=str(tmp_path / "ckpt"), checkpoint_factor=1, **files)
    (tmp_path / "train.yml").write_text(json.dumps(config))
    run(TRAIN, "-q", tmp_path / "train.yml")
    out = tmp_path / "hf"
    run(CONVERT, "to-hf", "--input", tmp_path / "ckpt", "--output", out)
    oracle = tokenizers.Tokenizer.from_file(oracle_file)
    ours = transformers.AutoTokenizer.from_pretrained(str(out))
    for text in export_texts():
        assert ours(text)["input_ids"] == oracle.encode(text).ids, f"{kind}: {text[:60]!r}"
    cfg = json.loads((out / "config.json").read_text())
    assert ours.eos_token_id == cfg["eos_token_id"] == oracle.token_to_id("<|endoftext|>")
    assert ours.model_max_length == 32
