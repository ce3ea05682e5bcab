# tests/tools/train_keys.sh: what a checkpoint leaves out. no_save_optim writes no optimizer/ tensors
# (the shard is smaller by them), a resume from it is exactly a resume with no_load_optim from a full
# checkpoint (fresh moments, bias correction from step 1), with a notice, and neox-convert verifies,
# reshards and exports it. no_save_rng stores no RNG state; the resume re-seeds: exactly a resume with
# no_load_rng from a full checkpoint (the dropout stream restarts from the config's seed), which
# differs from the exact resume, with a notice.
source tests/lib.sh

char_shakespeare "checkpoint keys" || exit 0

cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "no_weight_tying": true, "hidden_dropout": 0.1, "attention_dropout": 0.1,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "train_iters": 16, "eval_interval": 4, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
first() {  # first NAME [MORE JSON]: 8 iterations saved at 8 into $T/NAME
    echo "{\"save\": \"$T/$1\", \"checkpoint_factor\": 8, \"exit_interval\": 8 $2}" >"$T/$1.yml"
    $TRAIN -q "$T/model.yml" "$T/$1.yml"
}
then_resume() {  # then_resume NAME CHECKPOINT [MORE JSON]: 8 more iterations from it, logs in $T/NAME
    echo "{\"load\": \"$T/$2\", \"log_dir\": \"$T/$1\" $3}" >"$T/$1.yml"
    $TRAIN "$T/model.yml" "$T/$1.yml" >"$T/$1.out" 2>&1
}
check "8 iterations saved in full" first full
check "8 iterations saved with no_save_optim" first noopt ', "no_save_optim": true'
check "8 iterations saved with no_save_rng" first norng ', "no_save_rng": true'
full=$T/full/global_step8/rank_00000.h5 noopt=$T/noopt/global_step8/rank_00000.h5

# ---- no_save_optim ----
if command -v h5ls >/dev/null; then
    check "the full checkpoint holds the Adam moments" bash -c "h5ls -r '$full' | grep -q '^/optimizer/exp_avg_sq/'"
    check "no_save_optim: no optimizer/ tensors, every parameter there" bash -c \
        "! h5ls -r '$noopt' | grep -q '^/optimizer' &&
         [ \$(h5ls -r '$noopt' | grep -c '^/params/.*Dataset') = \$(h5ls -r '$full' | grep -c '^/params/.*Dataset') ]"
else
    skip "no_save_optim shard contents" "h5ls is not installed"
fi
# Adam keeps two moments per parameter: the shard without them is under 40% of the full one.
check "no_save_optim: the shard is smaller by the optimizer state" bash -c \
    "a=\$(stat -c %s '$full'); b=\$(stat -c %s '$noopt'); echo \"full \$a bytes, no_save_optim \$b bytes\"; [ \$((b * 10)) -lt \$((a * 4)) ]"
check "resume from the no_save_optim checkpoint" then_resume from-noopt noopt
check_output "the resume says the optimizer starts afresh" \
    'holds no optimizer state \(saved with no_save_optim\): the optimizer starts afresh' cat "$T/from-noopt.out"
check "resume from the full checkpoint with no_load_optim" then_resume noloadopt full ', "no_load_optim": true'
check "no_save_optim resume == no_load_optim resume (losses, norms, LRs, evaluations)" $LIB same \
    "$T/from-noopt/metrics.jsonl" "$T/noloadopt/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss
check "resume from the full checkpoint" then_resume exact full
check "...which differs from the exact resume (the moments mattered)" bash -c \
    "! $LIB same '$T/from-noopt/metrics.jsonl' '$T/exact/metrics.jsonl' train/grad_norm"
check_output "neox-convert verify: the no_save_optim checkpoint is sound" 'is sound' $CONVERT verify "$T/noopt"
check "neox-convert reshard it to tp2 + dp2 / ZeRO-1" \
    $CONVERT reshard --input "$T/noopt" --output "$T/noopt-tp2dp2" --tp 2 --dp 2 --zero 1
check_output "the resharded checkpoint is sound" 'is sound' $CONVERT verify "$T/noopt-tp2dp2"
check "neox-convert to-hf: both checkpoints export" bash -c \
    "$CONVERT to-hf --input '$T/noopt' --output '$T/hf-noopt' && $CONVERT to-hf --input '$T/full' --output '$T/hf-full'"
check "...to the same weights" cmp "$T/hf-noopt/model.safetensors" "$T/hf-full/model.safetensors"

# ---- no_save_rng ----
# state/train.json is stored as plain bytes in rank 0's shard.
check "no_save_rng: the run state stores no RNG state (no dropout counter)" bash -c \
    "grep -qa '\"dropout_rows\"' '$full' && ! grep -qa '\"dropout_rows\"' '$T/norng/global_step8/rank_00000.h5'"
check "resume from the no_save_rng checkpoint" then_resume from-norng norng
check_output "the resume says it re-seeds" \
    'holds no RNG state \(saved with no_save_rng\): re-seeding from the config.s seed 1234' cat "$T/from-norng.out"
check "resume from the full checkpoint with no_load_rng" then_resume noloadrng full ', "no_load_rng": true'
check "no_save_rng resume == no_load_rng resume" $LIB same "$T/from-norng/metrics.jsonl" "$T/noloadrng/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss
check "...which differs from the exact resume (other dropout masks)" bash -c \
    "! $LIB same '$T/from-norng/metrics.jsonl' '$T/exact/metrics.jsonl' train/lm_loss"
