# tests/mpi/qk_norm.sh: use_qk_layernorm under tensor parallelism. With norm: rmsnorm the norm is per
# head and its (heads, head_size) weight is cut by heads: tp2, tp2 + dp2 and pp2 follow one rank
# (losses and evaluations within 1e-5). With norm: layernorm the norm spans all of a token's heads,
# which GPT-NeoX would cut per rank: tp2 is refused naming the keys.
source tests/lib.sh

need_mpi "use_qk_layernorm layouts" || exit 0

words_dataset 400 5

config() {  # config NAME NORM ACCUM EXTRA
    mkdir -p "$T/$1"
    cat >"$T/$1.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "no_weight_tying": true, "norm": "$2", "use_qk_layernorm": true,
  "make_vocab_size_divisible_by": 64,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": $3,
  "train_iters": 12, "eval_interval": 6, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer",
  "log_dir": "$T/$1/log" $4
}
EOF
}

config one rmsnorm 4 ""
check "rmsnorm: one rank, 4 micro-batches of 2" "$TRAIN" -q "$T/one.yml"
for layout in "tp2 2 4" "tp2dp2 4 2" "pp2 2 4"; do
    set -- $layout
    case $1 in tp2|tp2dp2) extra=', "model_parallel_size": 2' ;; pp2) extra=', "pipe_parallel_size": 2' ;; esac
    config "$1" rmsnorm "$3" "$extra"
    check "rmsnorm: $1 on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/$1.yml"
    check "rmsnorm: $1 follows one rank (losses, evaluations within 1e-5)" \
        "$PY" tests/mpi/layouts_check.py same_losses "$T/one" "$T/$1"
done
config ln_tp2 layernorm 4 ', "model_parallel_size": 2'
check_fails "layernorm: tp2 is refused naming the keys" 2 "use_qk_layernorm with norm: layernorm.*model_parallel_size 2" \
    "$MPIEXEC" -n 2 "$TRAIN" -q "$T/ln_tp2.yml"
