# tests/mpi/prefetch.sh: num_workers >= 1 reads each next micro-batch on a background thread
# (lib/data/prefetch.c); the losses, gradient norms and evaluations must be bit-identical to
# num_workers 0 (every batch read when the step needs it): on one rank with gradient accumulation and
# evaluations between steps, under pipeline x data parallelism (pp2 x dp2, where the first and
# last stages read), and across a resume.
source tests/lib.sh

command -v "$MPIEXEC" >/dev/null || { skip "data prefetch" "$MPIEXEC is not installed"; exit 0; }
char_shakespeare "data prefetch" || exit 0
export OMP_NUM_THREADS=1
cat >"$T/model.yml" <<YML
{
  "num_layers": 2, "hidden_size": 32, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "norm": "layernorm", "pos_emb": "rotary", "optimizer": {"type": "Adam", "params": {"lr": 0.003}},
  "lr_decay_style": "constant", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
  "train_iters": 24, "eval_interval": 5, "eval_iters": 2, "log_interval": 1, "seed": 9, "split": "90,8,2",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
YML
run() {  # run NAME RANKS EXTRA_JSON
    echo "{\"log_dir\": \"$T/$1\" $3}" >"$T/$1.yml"
    if [ "$2" = 1 ]; then $TRAIN -q "$T/model.yml" "$T/$1.yml"; else $MPIEXEC -n "$2" $TRAIN -q "$T/model.yml" "$T/$1.yml"; fi
}
KEYS=train/lm_loss,train/grad_norm,validation/lm_loss
check "one rank, num_workers 0" run sync 1 ', "num_workers": 0'
check "one rank, num_workers 2 (the default)" run ahead 1 ''
check "one rank: prefetching gives bit-identical losses, norms and evaluations" $LIB same "$T/sync/metrics.jsonl" "$T/ahead/metrics.jsonl" $KEYS
PP=', "pipe_parallel_size": 2'
check "pp2 x dp2, num_workers 0" run sync4 4 "$PP, \"num_workers\": 0"
check "pp2 x dp2, num_workers 4" run ahead4 4 "$PP, \"num_workers\": 4"
check "pp2 x dp2: bit-identical with and without prefetch" $LIB same "$T/sync4/metrics.jsonl" "$T/ahead4/metrics.jsonl" $KEYS
CK="\"save\": \"$T/ck\", \"load\": \"$T/ck\", \"checkpoint_factor\": 12"
check "prefetching: 12 steps, checkpoint" run resumed 1 ", $CK, \"exit_interval\": 12"
check "prefetching: resumed for 12 more" run resumed 1 ", $CK"
check "a resume with prefetch continues bit-identically" $LIB same "$T/sync/metrics.jsonl" "$T/resumed/metrics.jsonl" $KEYS
echo '{"num_workers": -1}' >"$T/bad.yml"
check_fails "a negative num_workers is refused by name" 2 "num_workers" $TRAIN -q "$T/model.yml" "$T/bad.yml"
