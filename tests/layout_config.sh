# tests/layout_config.sh: the small model of the MPI layout tests (tests/mpi/layouts.sh,
# tests/mpi/comm_accounting.sh, tests/mpi/comm_options.sh, tests/mpi/commtopo.sh): config NAME KIND MICRO ACCUM ITERS EXTRA writes
# $T/NAME.yml training on $T/docs_text_document with logs in $T/NAME/log, checkpoints in $T/NAME/ckpt.
# LAYERS (default 4), CKPT_FACTOR (default 10), POS_EMB (default rotary; neox kind), VOCAB_DIVISOR
# (make_vocab_size_divisible_by, default 64) and DATA_KEYS (the data and tokenizer keys, default the
# character-level $T/docs_text_document) change those keys.
# config NAME KIND MICRO ACCUM ITERS EXTRA: KIND neox (layernorm, gelu, parallel residual, tied) or llama.
config() {
    local arch
    if [ "$2" = neox ]; then
        arch='"norm": "layernorm", "activation": "gelu", "gpt_j_residual": true, "pos_emb": "'"${POS_EMB:-rotary}"'", "rotary_pct": 0.5'
    else
        arch='"norm": "rmsnorm", "activation": "swiglu", "num_kv_heads": 2, "no_weight_tying": true, "pos_emb": "rotary",
              "use_bias_in_attn_linear": false, "use_bias_in_mlp": false, "use_bias_in_norms": false, "intermediate_size": 96'
    fi
    cat >"$T/$1.yml" <<EOF
{
  "num_layers": ${LAYERS:-4}, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  $arch, "make_vocab_size_divisible_by": ${VOCAB_DIVISOR:-64},
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "clip_grad": 1.0, "weight_decay": 0.01,
  "train_micro_batch_size_per_gpu": $3, "gradient_accumulation_steps": $4,
  "train_iters": $5, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  ${DATA_KEYS:-"data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer"},
  "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": ${CKPT_FACTOR:-10} $6
}
EOF
}
