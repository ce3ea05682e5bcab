# tests/moe_config.sh: the small MoE model of the multi-rank MoE tests (tests/mpi/moe.sh,
# tests/mpi/moe_expert_parallel.sh): 2 layers of 4 experts, 12 steps on $T/docs_text_document.
# moe_config NAME ACCUM ROUTER INTERVAL TOP_K EXTRA writes $T/NAME.yml (logs in $T/NAME/log,
# checkpoints in $T/NAME/ckpt), EXTRA appended to its keys.
moe_config() {
    mkdir -p "$T/$1"
    cat >"$T/$1.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true, "intermediate_size": 48, "make_vocab_size_divisible_by": 64,
  "moe_num_experts": 4, "moe_top_k": $5, "moe_router_type": "$3", "moe_expert_interval": $4,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "clip_grad": 1.0, "weight_decay": 0.01,
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": $2,
  "train_iters": 12, "eval_interval": 6, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer",
  "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": 6 $6
}
EOF
}
