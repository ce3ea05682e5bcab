# tests/tools/train_te.sh: GPT-NeoX's Transformer Engine keys through the tools. GPT-NeoX's
# 1-3B-transformer-engine.yml loads unchanged and its notices name, of the te_* keys, only the FP8
# ones (they configure precision fp8, and it trains in bfloat16). Shrunk to a tiny model beside 1-3B.yml shrunk alike, it trains 10
# steps and exports to Hugging Face with the same tensor names and shapes as 1-3B.yml. Each key's
# effect: te_layernorm_mlp's gelu is Transformer Engine's tanh approximation, so the TE run differs
# from 1-3B.yml's and equals 1-3B.yml with bias_gelu_fusion (tanh gelu) bit for bit, which also shows
# te_mha selecting the same attention; te_columnparallel and te_rowparallel train as Megatron's
# linears, bit for bit; te_layernorm_mlp's gated halves are each ffn_hidden_size wide (not 2/3 of it
# for both); the combinations
# TE's modules cannot hold are refused by name, and so is te_fp8_mha (FP8 attention); from-hf imports the gelu
# export back as the tanh gelu and refuses the tanh geglu one by name. (The arithmetic against a
# torch restatement of Transformer Engine's formulas: tests/oracle/test_te_parity.py.)
source tests/lib.sh

TE_CFG=$CONFIGS/1-3B-transformer-engine.yml
[ -f "$TE_CFG" ] || { skip "Transformer Engine config" "$TE_CFG is absent"; exit 0; }
T=$TEST_TMP

check_output "1-3B-transformer-engine.yml loads unchanged (te_mha, te_layernorm_mlp used)" \
    "^te_layernorm_mlp += true  # .*1-3B-transformer-engine.yml:23$" \
    "$TRAIN" -q --print-config "$TE_CFG" "$CONFIGS/local_setup.yml"
check "the notices name exactly the FP8 te_* keys as having no effect, as configuring precision fp8" python3 - "$TRAIN" "$TE_CFG" "$CONFIGS/local_setup.yml" <<'PY'
import re, subprocess, sys
err = subprocess.run([sys.argv[1], "--print-config"] + sys.argv[2:], capture_output=True, text=True).stderr
notice = [l for l in err.splitlines() if "no effect" in l]
print(notice)
te = sorted(k for line in notice for k in re.findall(r"\b(te_\w+)", line))
assert te == sorted("te_fp8_format te_fp8_wgrad te_fp8_amax_history_len te_fp8_amax_compute_algo te_fp8_margin".split()), te
assert all("configure precision fp8" in line for line in notice if "te_" in line), notice
PY

char_shakespeare "Transformer Engine training" || exit 0

shrink() {  # shrink SOURCE NAME JSON: SOURCE as a tiny model with local paths, JSON's keys on top, in $T/NAME.yml
    .venv/bin/python - "$1" "$T/$2.yml" "$2" "$3" "$T" <<'PY'
import json, sys
import yaml
sys.path.insert(0, "tests/tools")
import train_lib
src, out, name, extra, tmp = sys.argv[1:]
c = yaml.safe_load(open(src))
c.update(num_layers=2, hidden_size=64, num_attention_heads=4, seq_length=48, max_position_embeddings=48,
         train_micro_batch_size_per_gpu=4, train_iters=10, lr_decay_iters=10, eval_interval=5, eval_iters=1,
         log_interval=1, checkpoint_factor=10, save=f"{tmp}/{name}_ckpt", log_dir=f"{tmp}/{name}",
         tokenizer_type="CharLevelTokenizer", data_path=f"{tmp}/char_text_document")
c["optimizer"]["params"]["lr"] = 0.002
c.update(json.loads(extra))
train_lib.write_config(c, out)
PY
}
train() {  # train SOURCE NAME JSON: shrinks and trains 10 steps
    shrink "$1" "$2" "$3" && $TRAIN -q "$T/$2.yml"
}
PLAIN_CFG=$CONFIGS/1-3B.yml

check "the shrunk 1-3B-transformer-engine.yml (fp16, recomputation, ZeRO-1) trains 10 steps" train "$TE_CFG" te '{}'
check "its loss is logged, finite and falling" python3 -c "
import json, math
l = [r['train/lm_loss'] for r in map(json.loads, open('$T/te/metrics.jsonl')) if 'train/lm_loss' in r]
print(l)
assert len(l) == 10 and all(math.isfinite(x) for x in l) and l[-1] < l[0], l"
check "the shrunk 1-3B.yml trains 10 steps" train "$PLAIN_CFG" plain '{}'
check "te_layernorm_mlp changes the run (Transformer Engine's gelu is the tanh approximation)" python3 -c "
import json
a, b = ([r['train/lm_loss'] for r in map(json.loads, open(p)) if 'train/lm_loss' in r] for p in ('$T/te/metrics.jsonl', '$T/plain/metrics.jsonl'))
print(a[:3], b[:3])
assert len(a) == len(b) == 10 and a != b"
check "1-3B.yml with bias_gelu_fusion (tanh gelu) trains 10 steps" train "$PLAIN_CFG" tanh '{"bias_gelu_fusion": true}'
check "the TE run equals it bit for bit (te_mha: the same attention; LayerNormMLP: the tanh gelu)" \
    $LIB same "$T/te/metrics.jsonl" "$T/tanh/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
check "te_columnparallel and te_rowparallel: 10 steps" train "$TE_CFG" telinear \
    '{"te_columnparallel": true, "te_rowparallel": true}'
check "te_columnparallel and te_rowparallel train as Megatron's linears, bit for bit" \
    $LIB same "$T/te/metrics.jsonl" "$T/telinear/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
check_output "the checkpoint records the tanh gelu" "gelu \(tanh\)" $CONVERT inspect "$T/te_ckpt"

# Hugging Face export: the tensor names and shapes of 1-3B.yml's export, GPTNeoXForCausalLM with
# hidden_act gelu_new (the tanh gelu).
check "to-hf exports the TE run" $CONVERT to-hf --input "$T/te_ckpt" --output "$T/te_hf"
check "to-hf exports the 1-3B.yml run" $CONVERT to-hf --input "$T/plain_ckpt" --output "$T/plain_hf"
check "the two exports hold the same tensor names, shapes and dtypes" python3 - "$T/te_hf" "$T/plain_hf" <<'PY'
import glob, json, struct, sys
def tensors(folder):
    out = {}
    for path in glob.glob(folder + "/*.safetensors"):
        with open(path, "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        out.update({k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return out
te, plain = (tensors(f) for f in sys.argv[1:])
print(len(te), sorted(te)[:4])
assert te == plain and "gpt_neox.layers.1.post_attention_layernorm.weight" in te and "gpt_neox.layers.1.attention.query_key_value.weight" in te
a, b = (json.load(open(f + "/config.json")) for f in sys.argv[1:])
assert a["architectures"] == b["architectures"] == ["GPTNeoXForCausalLM"]
assert a["hidden_act"] == "gelu_new" and b["hidden_act"] == "gelu", (a["hidden_act"], b["hidden_act"])
assert {k: v for k, v in a.items() if k != "hidden_act"} == {k: v for k, v in b.items() if k != "hidden_act"}
PY

# Gated activations: LayerNormMLP's first projection is 2 x ffn_hidden_size wide (halves of 4h = 256
# here), where GPT-NeoX's own is 2/3 of 4h for both halves (85 each); geglu's gelu is the tanh one, exported as gelu_pytorch_tanh.
GATED='"activation": "geglu", "norm": "rmsnorm", "rms_norm_epsilon": 1.0e-8, "train_iters": 2, "lr_decay_iters": 2, "checkpoint_factor": 2, "eval_interval": 2'
check "te_layernorm_mlp with geglu: 2 steps" train "$TE_CFG" tegeglu "{$GATED}"
check_output "its gate and up projections are 256 wide (ffn_hidden_size 4h, unscaled), geglu (tanh)" \
    "params/model\.layers\.1\.mlp\.gate_proj\.weight +256x64 " $CONVERT inspect "$T/tegeglu_ckpt"
check_output "the checkpoint records geglu (tanh)" "geglu \(tanh\)" $CONVERT inspect "$T/tegeglu_ckpt"
check "GPT-NeoX's own MLP (te_layernorm_mlp false) with geglu: 2 steps" train "$TE_CFG" geglu \
    "{$GATED, \"te_layernorm_mlp\": false}"
check_output "its halves share 2/3 of 4h (170): gate 85 wide" "params/model\.layers\.1\.mlp\.gate_proj\.weight +85x64 " \
    $CONVERT inspect "$T/geglu_ckpt"
check "to-hf exports the TE geglu run" $CONVERT to-hf --input "$T/tegeglu_ckpt" --output "$T/tegeglu_hf"
check "as a Llama-family model with hidden_act gelu_pytorch_tanh and intermediate_size 256" python3 -c "
import json
c = json.load(open('$T/tegeglu_hf/config.json'))
print(c['hidden_act'], c['intermediate_size'])
assert c['hidden_act'] == 'gelu_pytorch_tanh' and c['intermediate_size'] == 256"
check_fails "from-hf refuses to import it as GPT-NeoX's exact geglu, naming hidden_act" 2 \
    "hidden_act 'gelu_pytorch_tanh' in a gated MLP is not imported" $CONVERT from-hf --input "$T/tegeglu_hf" --output "$T/tegeglu_back"
check "the TE gelu run's export imports back (bias_gelu_fusion: the tanh gelu)" \
    $CONVERT from-hf --input "$T/te_hf" --output "$T/te_back"
check_output "as the tanh gelu" "^bias_gelu_fusion: true" cat "$T/te_back/model.yml"

# What Transformer Engine's modules cannot hold is refused by name, before any training.
refused() {  # refused WHAT PATTERN JSON
    shrink "$TE_CFG" refused "$3"
    check_fails "$1" 2 "$2" $TRAIN -q "$T/refused.yml"
}
refused "te_fp8_mha is refused naming FP8 training" "te_fp8_mha.*FP8" '{"te_fp8_mha": true}'
refused "te_layernorm_mlp with another layernorm_epsilon is refused naming it" \
    "te_layernorm_mlp: .*epsilon 1e-05 whatever layernorm_epsilon says" '{"layernorm_epsilon": 1.0e-6}'
refused "te_layernorm_mlp with use_bias_in_mlp false is refused" "te_layernorm_mlp: .*use_bias_in_mlp" \
    '{"use_bias_in_mlp": false}'
refused "te_layernorm_mlp with an activation TE lacks is refused naming it" \
    "activation 'silu' with te_layernorm_mlp" '{"activation": "silu"}'
refused "te_layernorm_mlp with mlp_multiple_of is refused naming it" "mlp_multiple_of 256 with te_layernorm_mlp" \
    '{"mlp_multiple_of": 256}'
refused "te_layernorm_mlp with MoE is refused" "te_layernorm_mlp: .*Mixture-of-Experts" '{"moe_num_experts": 2}'
refused "te_mha with learned positions is refused naming rotary" "te_mha: .*pos_emb rotary" '{"pos_emb": "learned"}'
refused "te_mha with use_qk_layernorm is refused" "te_mha: .*use_qk_layernorm" '{"use_qk_layernorm": true}'
