# tests/tools/train_qk_norm.sh: use_qk_layernorm through the tools. A model with GPT-NeoX's
# query/key LayerNorm trains on Tiny Shakespeare and learns, differently from the same model without
# it; it resumes bit for bit and the emulated device gives the CPU's losses bit for bit; the
# checkpoint holds one (heads, head_size) norm per layer; generation with the KV cache gives the text
# recomputation gives; the RMSNorm variant trains; GQA is refused naming the keys and Hugging Face
# export by name. (Numerics against a torch restatement: tests/oracle/test_model_parity.py::
# test_qk_layernorm_parity; tensor parallelism: tests/mpi/qk_norm.sh.)
source tests/lib.sh

char_shakespeare "use_qk_layernorm" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "checkpoint_factor": 15
}
EOF
run() {  # run NAME JSON: trains model.yml + JSON with logs in $T/NAME
    echo "{\"log_dir\": \"$T/$1\" $2}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}
QK=', "use_qk_layernorm": true'
check "use_qk_layernorm (layernorm): 30 steps" run straight "$QK, \"save\": \"$T/ckpt\""
check "the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.7
check "without the norm: 30 steps" run plain ""
check "the norm changes the run" python3 - "$T/straight/metrics.jsonl" "$T/plain/metrics.jsonl" <<'PY'
import json, sys
a, b = ([r["train/lm_loss"] for r in map(json.loads, open(p)) if "train/lm_loss" in r] for p in sys.argv[1:])
assert a[0] != b[0] and a[-1] != b[-1], (a[:2], b[:2])
PY
check_resume_and_emulated "$QK"
check_output "the checkpoint holds each layer's norm of (heads, head_size)" \
    "params/gpt_neox\.layers\.1\.attention\.qk_layernorm\.weight +4x16 " \
    $CONVERT inspect "$T/ckpt"
echo "{\"load\": \"$T/ckpt\" $QK}" >"$T/load.yml"
echo "{\"load\": \"$T/ckpt\"}" >"$T/load_plain.yml"
check_fails "a checkpoint with the norm does not load without it" 2 "use_qk_layernorm = 1 but the config gives 0" \
    $EVAL -q --tasks valid --results-prefix - "$T/model.yml" "$T/load_plain.yml"

check_cached_generation "$T/model.yml" "$T/load.yml"
check "rmsnorm (a norm per head): 30 steps" run rms "$QK, \"norm\": \"rmsnorm\""
check_fails "GQA is refused naming the keys" 2 "use_qk_layernorm needs num_kv_heads = num_attention_heads" \
    run gqa "$QK, \"num_kv_heads\": 2"
check_fails "to-hf refuses the shared norm by name" 2 "use_qk_layernorm" \
    $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "the refused export wrote nothing" test ! -e "$T/hf"
