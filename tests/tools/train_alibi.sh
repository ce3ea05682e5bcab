# tests/tools/train_alibi.sh: pos_emb alibi through the tools. A model with GPT-NeoX's ALiBi biases
# trains on Tiny Shakespeare at a sequence length beyond any learned table and learns; it evaluates
# past its training length (ALiBi's point: no position table to outgrow); generation with the KV
# cache gives the text recomputation gives; it resumes bit for bit on the emulated device as on the
# CPU; Hugging Face export is refused by name and writes nothing. (Numerics against a torch
# restatement: tests/oracle/test_model_parity.py::test_alibi_parity; tensor parallelism:
# tests/mpi/layouts.sh.)
source tests/lib.sh

char_shakespeare "ALiBi" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 96, "num_attention_heads": 6,
  "pos_emb": "alibi", "gpt_j_residual": true, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 30, "eval_interval": 10, "eval_iters": 2, "log_interval": 1, "attention_dropout": 0.1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer", "checkpoint_factor": 15
}
EOF
run() {  # run NAME JSON: trains model.yml + JSON with logs in $T/NAME, at sequence length 96
    echo "{\"log_dir\": \"$T/$1\", \"seq_length\": 96, \"max_position_embeddings\": 96 $2}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}

check "ALiBi (6 heads): 30 steps" run straight ", \"save\": \"$T/ckpt\""
check "ALiBi: the loss falls" $LIB falls "$T/straight/metrics.jsonl" 30 0.7
check_resume_and_emulated

# Evaluation past the training length: nothing to outgrow.
echo "{\"load\": \"$T/ckpt\", \"seq_length\": 192, \"max_position_embeddings\": 192}" >"$T/long.yml"
check_output "perplexity at twice the training length" "test" $EVAL -q --tasks valid,test --results-prefix - \
    "$T/model.yml" "$T/long.yml"

check_cached_generation "$T/model.yml" "$T/long.yml"

check_fails "to-hf refuses ALiBi by name" 2 "pos_emb 'alibi'" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
check "the refused export wrote nothing" test ! -e "$T/hf"
check_output "inspect names the position embedding" "alibi" $CONVERT inspect "$T/ckpt"
