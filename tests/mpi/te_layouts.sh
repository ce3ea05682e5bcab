# tests/mpi/te_layouts.sh: GPT-NeoX's Transformer Engine keys under tensor and pipeline parallelism.
# te_mha, te_layernorm_mlp, te_columnparallel and te_rowparallel with Transformer Engine's tanh gelu
# and with its gated geglu (fc1 twice the unscaled width, cut by heads and columns as any MLP):
# tp2 and pp2 follow one rank (losses and evaluations within 1e-5).
source tests/lib.sh

need_mpi "Transformer Engine layouts" || exit 0

words_dataset 400 5

config() {  # config NAME ACTIVATION ACCUM EXTRA
    mkdir -p "$T/$1"
    cat >"$T/$1.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.5, "no_weight_tying": true, "activation": "$2",
  "te_mha": true, "te_layernorm_mlp": true, "te_columnparallel": true, "te_rowparallel": true,
  "make_vocab_size_divisible_by": 64,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}}, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": $3,
  "train_iters": 12, "eval_interval": 6, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/docs_text_document", "tokenizer_type": "CharLevelTokenizer",
  "log_dir": "$T/$1/log" $4
}
EOF
}

for act in gelu geglu; do
    config "one_$act" "$act" 4 ""
    check "$act: one rank, 4 micro-batches of 2" "$TRAIN" -q "$T/one_$act.yml"
    for layout in "tp2 2 4" "pp2 2 4"; do
        set -- $layout
        case $1 in tp2) extra=', "model_parallel_size": 2' ;; pp2) extra=', "pipe_parallel_size": 2' ;; esac
        config "${1}_$act" "$act" "$3" "$extra"
        check "$act: $1 on $2 ranks" "$MPIEXEC" -n "$2" "$TRAIN" -q "$T/${1}_$act.yml"
        check "$act: $1 follows one rank (losses, evaluations within 1e-5)" \
            "$PY" tests/mpi/layouts_check.py same_losses "$T/one_$act" "$T/${1}_$act"
    done
done
