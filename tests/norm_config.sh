# tests/norm_config.sh: the small model of the norm tests (tests/tools/train_scalenorm.sh,
# tests/tools/train_nonparametric_norm.sh), trained on Tiny Shakespeare at sequence length 64.
# model NAME NORM_KEYS writes $T/NAME.yml with those norm keys; train_model MODEL NAME JSON trains
# $T/MODEL.yml + JSON with logs in $T/NAME; run NAME JSON trains $T/model.yml (as
# check_resume_and_emulated calls it).
model() {
    cat >"$T/$1.yml" <<EOF2
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, $2,
  "pos_emb": "rotary", "rotary_pct": 0.5, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "checkpoint_factor": 15
}
EOF2
}
train_model() {
    echo "{\"log_dir\": \"$T/$2\", \"seq_length\": 64, \"max_position_embeddings\": 64 $3}" >"$T/$2.yml"
    $TRAIN -q "$T/$1.yml" "$T/$2.yml"
}
run() { train_model model "$@"; }
