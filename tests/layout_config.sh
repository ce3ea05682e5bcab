# tests/layout_config.sh: the small model of the MPI layout tests (tests/mpi/layouts.sh, tests/mpi/zero3.sh,
# tests/mpi/comm_accounting.sh, tests/mpi/comm_options.sh, tests/mpi/commtopo.sh): config NAME KIND MICRO ACCUM ITERS EXTRA writes
# $T/NAME.yml training on $T/docs_text_document with logs in $T/NAME/log, checkpoints in $T/NAME/ckpt;
# train_layout NAME RANKS trains it.
# LAYERS (default 4), CKPT_FACTOR (default 10), EVAL_INTERVAL (default 10), POS_EMB (default rotary; neox kind), NORM (default layernorm;
# neox kind), OPTIMIZER (the optimizer key's JSON, default Adam with lr 0.003), VOCAB_DIVISOR
# (make_vocab_size_divisible_by, default 64) and DATA_KEYS (the data and tokenizer keys, default the
# character-level $T/docs_text_document) change those keys.
# config NAME KIND MICRO ACCUM ITERS EXTRA: KIND neox (layernorm, gelu, parallel residual, tied) or llama.
config() {
    local arch optimizer='{"type": "Adam", "params": {"lr": 0.003}}' data='"data_path": "'"$T"'/docs_text_document", "tokenizer_type": "CharLevelTokenizer"'
    [ -n "${OPTIMIZER:-}" ] && optimizer=$OPTIMIZER
    [ -n "${DATA_KEYS:-}" ] && data=$DATA_KEYS  # (set here: a default inside ${...:-} in a heredoc loses its quotes)
    if [ "$2" = neox ]; then
        arch='"norm": "'"${NORM:-layernorm}"'", "activation": "gelu", "gpt_j_residual": true, "pos_emb": "'"${POS_EMB:-rotary}"'", "rotary_pct": 0.5'
    else
        arch='"norm": "rmsnorm", "activation": "swiglu", "num_kv_heads": 2, "no_weight_tying": true, "pos_emb": "rotary",
              "use_bias_in_attn_linear": false, "use_bias_in_mlp": false, "use_bias_in_norms": false, "intermediate_size": 96'
    fi
    cat >"$T/$1.yml" <<EOF
{
  "num_layers": ${LAYERS:-4}, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  $arch, "make_vocab_size_divisible_by": ${VOCAB_DIVISOR:-64},
  "optimizer": $optimizer, "lr_decay_style": "cosine", "warmup": 0.1,
  "clip_grad": 1.0, "weight_decay": 0.01,
  "train_micro_batch_size_per_gpu": $3, "gradient_accumulation_steps": $4,
  "train_iters": $5, "eval_interval": ${EVAL_INTERVAL:-10}, "eval_iters": 2, "log_interval": 1,
  $data,
  "log_dir": "$T/$1/log", "save": "$T/$1/ckpt", "checkpoint_factor": ${CKPT_FACTOR:-10} $6
}
EOF
}

# kill_rank_mid_run NAME: trains $T/NAME.yml on 2 ranks ($MPIEXEC, $TRAIN) and, once its first
# checkpoint exists (or after 30 s), kills rank 1 with SIGKILL. Sets KILL_VICTIM (the killed pid;
# empty when none was found), KILL_STATUS (the job's exit status) and KILL_TOOK (seconds from the kill
# to the job's end; the job is itself killed after 60 s).
kill_rank_mid_run() {
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/$1.yml" >"$T/$1.out" 2>&1 &
    local launcher=$! watchdog start
    for _ in $(seq 150); do [ -f "$T/$1/ckpt/latest" ] && break; sleep 0.2; done
    KILL_VICTIM=$(for p in $(pgrep -f "neox-train -q $T/$1.yml"); do
        grep -qz '^PMI_RANK=1$' "/proc/$p/environ" 2>/dev/null && echo "$p"; done | head -1)
    start=$(date +%s)
    [ -n "$KILL_VICTIM" ] && kill -9 "$KILL_VICTIM"
    ( sleep 60; kill -9 "$launcher" 2>/dev/null ) &
    watchdog=$!
    wait "$launcher"
    KILL_STATUS=$?
    kill "$watchdog" 2>/dev/null
    KILL_TOOK=$(( $(date +%s) - start ))
}

# train_layout NAME RANKS: trains $T/NAME.yml on RANKS ranks (through mpiexec when more than one).
train_layout() {
    local launch=()
    [ "$2" -gt 1 ] && launch=("$MPIEXEC" -n "$2")
    check "$1: train on $2 rank(s)" "${launch[@]}" "$TRAIN" -q "$T/$1.yml"
}

# train_export NAME RANKS: trains $T/NAME.yml on RANKS ranks (its start-up report kept in $T/NAME.out)
# and exports the final parameters to $T/NAME/hf.
train_export() {
    check "$1: train on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" "$T/$1.yml"
    cp "$_last_out" "$T/$1.out"
    check "$1: export" "$CONVERT" to-hf --input "$T/$1/ckpt" --output "$T/$1/hf"
}
