# tests/small_model.sh: the small model the tools tests train on Tiny Shakespeare (the norm tests
# through tests/norm_config.sh, tests/tools/train_moe.sh, tests/tools/train_mixtral.sh): 2 layers of
# hidden 64 with 4 heads, Adam with a cosine schedule, 30 steps of micro-batch 4, an evaluation every
# 10 and a checkpoint every 15. small_model NAME KEYS writes $T/NAME.yml with the architecture KEYS
# (a JSON fragment) beside those; it needs char_shakespeare's dataset in $T.
small_model() {
    cat >"$T/$1.yml" <<EOF2
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, $2,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "checkpoint_factor": 15
}
EOF2
}
