# tests/tools/train.sh: neox-train end to end on Tiny Shakespeare. A tiny GPT-2-tokenized model
# must learn (loss well below the unigram entropy, computed here from the token counts) and be
# deterministic; a char-level model checks exact resume (2N straight == N + resume + N, with and
# without gradient accumulation and dropout, with Lion, madgrad_wd, SM3 and cpu_torch_adam, by
# exit_interval and by SIGTERM), kill -9 during a
# save, the checkpoint contents, refusing a checkpoint of another model shape, and the files.
source tests/lib.sh

PRE=$NEOX_BIN/neox-preprocess
need_shared "neox-train" || exit 0
[ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "neox-train" "no Tiny Shakespeare in $DATA/text"; exit 0; }

$LIB paragraphs "$DATA/text/tinyshakespeare_input.txt" "$T/shakespeare.jsonl"
check "preprocess Tiny Shakespeare (GPT-2)" $PRE --input "$T/shakespeare.jsonl" --output-prefix "$T/gpt2" \
    --tokenizer-type GPT2BPETokenizer --vocab-file "$DATA/tokenizers/gpt2/vocab.json" \
    --merge-file "$DATA/tokenizers/gpt2/merges.txt" --append-eod
check "preprocess Tiny Shakespeare (char-level)" $PRE --input "$T/shakespeare.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod

# ---- learning and determinism (configs/tiny-shakespeare.yml with the data paths of this test) ----
sed -e '/"data_path"/d' -e '/"vocab_file"/d' -e '/"merge_file"/d' -e '/"log_interval"/d' -e 's/"train_iters": 200/"train_iters": 300/' \
    -e 's/"train_micro_batch_size_per_gpu": 8/"train_micro_batch_size_per_gpu": 4/' \
    configs/tiny-shakespeare.yml >"$T/shakespeare.yml"
gpt2_data() {  # gpt2_data NAME [MORE JSON]
    echo "{\"data_path\": \"$T/gpt2_text_document\", \"vocab_file\": \"$DATA/tokenizers/gpt2/vocab.json\",
      \"merge_file\": \"$DATA/tokenizers/gpt2/merges.txt\", \"log_dir\": \"$T/$1\", \"log_interval\": 1 $2}" >"$T/$1.yml"
}
gpt2_data learn
check "train tiny model on Tiny Shakespeare" $TRAIN -q "$T/shakespeare.yml" "$T/learn.yml"
check "loss falls well below the unigram entropy" $LIB learned "$T/learn/metrics.jsonl" "$T/gpt2_text_document.bin" 0.4
gpt2_data again ', "exit_interval": 25'
check "second run (25 steps)" $TRAIN -q "$T/shakespeare.yml" "$T/again.yml"
check "two runs give identical losses" $LIB same "$T/learn/metrics.jsonl" "$T/again/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/learning_rate 25

# ---- exact resume on the char-level model ----
char_config() {  # char_config FILE ACCUMULATION DROPOUT
    cat >"$1" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "init_method": "small_init", "output_layer_init_method": "wang_init",
  "hidden_dropout": $3, "attention_dropout": $3,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": $2,
  "train_iters": 20, "eval_interval": 5, "eval_iters": 2, "log_interval": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
}
KEYS=train/lm_loss,train/grad_norm,train/learning_rate,validation/lm_loss,test/lm_loss
resume_case() {  # resume_case NAME ACCUMULATION DROPOUT [OPTIMIZER_JSON]
    local d=$T/$1
    mkdir -p "$d"
    char_config "$d/model.yml" "$2" "$3"
    # (another optimizer: merged over the model's, as a later config file overrides a key)
    [ -n "${4:-}" ] && python3 -c 'import json, sys; c = json.load(open(sys.argv[1])); c["optimizer"] = json.loads(sys.argv[2])
json.dump(c, open(sys.argv[1], "w"))' "$d/model.yml" "$4"
    echo "{\"log_dir\": \"$d/straight\"}" >"$d/straight.yml"
    echo "{\"log_dir\": \"$d/resumed\", \"save\": \"$d/ckpt\", \"load\": \"$d/ckpt\", \"checkpoint_factor\": 10, \"exit_interval\": 10}" >"$d/first.yml"
    echo "{\"log_dir\": \"$d/resumed\", \"save\": \"$d/ckpt\", \"load\": \"$d/ckpt\", \"checkpoint_factor\": 10}" >"$d/second.yml"
    check "$1: 20 steps straight" $TRAIN -q "$d/model.yml" "$d/straight.yml"
    check "$1: 10 steps, exit_interval" $TRAIN -q "$d/model.yml" "$d/first.yml"
    check_output "$1: latest names global_step10" '^global_step10$' cat "$d/ckpt/latest"
    check "$1: resume for 10 more" $TRAIN -q "$d/model.yml" "$d/second.yml"
    check "$1: bit-identical losses, norms, LRs and evaluations" $LIB same "$d/straight/metrics.jsonl" \
        "$d/resumed/metrics.jsonl" $KEYS
}
resume_case resume-plain 1 0.0
resume_case resume-accum-dropout 3 0.1
# The optimizers' own state (Lion's momentum; madgrad_wd's sums, x0 and its step-dependent weight;
# SM3's row and column accumulators and momentum; cpu_torch_adam's moments on the host) resumes bit
# for bit too.
resume_case resume-lion 1 0.0 '{"type": "lion", "params": {"lr": 0.0003, "betas": [0.9, 0.99]}}'
resume_case resume-madgrad 2 0.0 '{"type": "madgrad_wd", "params": {"lr": 0.01, "momentum": 0.9}}'
resume_case resume-sm3 2 0.0 '{"type": "sm3", "params": {"lr": 0.01, "momentum": 0.9}}'
resume_case resume-cpu-torch-adam 1 0.0 '{"type": "cpu_torch_adam", "params": {"lr": 0.003}}'
if command -v h5ls >/dev/null; then
    check "madgrad_wd's shard holds its three state buffers" \
        bash -c "h5ls -r '$T/resume-madgrad/ckpt/global_step20/rank_00000.h5' | grep -q '/optimizer/x0/embed_out.weight' &&
                 h5ls -r '$T/resume-madgrad/ckpt/global_step20/rank_00000.h5' | grep -q '/optimizer/grad_sum_sq/embed_out.weight' &&
                 h5ls -r '$T/resume-madgrad/ckpt/global_step20/rank_00000.h5' | grep -q '/optimizer/s/embed_out.weight'"
fi
if command -v h5ls >/dev/null; then
    check "SM3's shard holds a matrix's row and column accumulators, a vector's, and the momentum" \
        bash -c "h5ls -r '$T/resume-sm3/ckpt/global_step20/rank_00000.h5' >'$T/sm3.ls' &&
                 grep -q '/optimizer/sm3_rows/embed_out.weight .*{512}' '$T/sm3.ls' &&
                 grep -q '/optimizer/sm3_cols/embed_out.weight .*{64}' '$T/sm3.ls' &&
                 grep -q '/optimizer/sm3_rows/gpt_neox.final_layer_norm.bias .*{64}' '$T/sm3.ls' &&
                 ! grep -q '/optimizer/sm3_cols/gpt_neox.final_layer_norm' '$T/sm3.ls' &&
                 grep -q '/optimizer/momentum_buffer/embed_out.weight' '$T/sm3.ls'"
fi
check "neox-convert verify reads a madgrad_wd checkpoint's state" $CONVERT verify "$T/resume-madgrad/ckpt/global_step20"
check "neox-convert verify reads an SM3 checkpoint's state" $CONVERT verify "$T/resume-sm3/ckpt/global_step20"
check_fails "neox-convert reshard refuses an SM3 checkpoint, naming the accumulators it cannot carry" 2 \
    "holds sm3 optimizer state, whose row and column accumulators reshard does not carry" \
    $CONVERT reshard --input "$T/resume-sm3/ckpt/global_step20" --output "$T/sm3-tp2" --tp 2

# SIGTERM: the step in flight finishes, a checkpoint is saved, exit status 3; resuming continues exactly.
d=$T/resume-accum-dropout
echo "{\"log_dir\": \"$d/signal\", \"save\": \"$d/sigckpt\", \"load\": \"$d/sigckpt\", \"train_iters\": 20, \"checkpoint_factor\": 100}" >"$d/signal.yml"
sed 's/"train_iters": 20, //' "$d/model.yml" >"$d/model-noiters.yml"
sig_run() {
    $TRAIN -q "$d/model-noiters.yml" "$d/signal.yml" >"$d/signal.out" 2>&1 &
    local pid=$! n=0
    while [ "$(grep -c train/lm_loss "$d/signal/metrics.jsonl" 2>/dev/null || echo 0)" -lt 3 ] && [ $n -lt 600 ]; do
        sleep 0.05; n=$((n + 1))
    done
    kill -TERM $pid
    wait $pid
    local status=$?
    [ $status = 3 ] || { echo "exit status $status, expected 3"; cat "$d/signal.out"; return 1; }
    [ -f "$d/sigckpt/latest" ] || { echo "no checkpoint after SIGTERM"; return 1; }
    grep -q 'stop requested by a signal' "$d/signal.out"
}
check "SIGTERM: finish the step, save, exit 3" sig_run
check "SIGTERM: resume to the end" $TRAIN -q "$d/model-noiters.yml" "$d/signal.yml"
check "SIGTERM: losses identical to the straight run" $LIB same "$d/straight/metrics.jsonl" "$d/signal/metrics.jsonl" \
    train/lm_loss,train/grad_norm,train/learning_rate

# ---- checkpoint contents and shape checks ----
c=$T/resume-plain/ckpt/global_step20
check "checkpoint has a manifest and one shard" test -f "$c/manifest.json" -a -f "$c/rank_00000.h5"
if command -v h5ls >/dev/null; then
    check_output "shard holds params, Adam moments, state, config and input YAML" \
        'gpt_neox.embed_in.weight' h5ls -r "$c/rank_00000.h5"
    check "shard holds exp_avg_sq, state/train.json, config/effective.json, config/input" \
        bash -c "h5ls -r '$c/rank_00000.h5' | grep -q '/optimizer/exp_avg_sq/embed_out.weight' &&
                 h5ls -r '$c/rank_00000.h5' | grep -q '/state/train.json' &&
                 h5ls -r '$c/rank_00000.h5' | grep -q '/config/effective.json' &&
                 h5ls -r '$c/rank_00000.h5' | grep -q '/config/input/0-model.yml'"
else
    skip "shard contents" "h5ls is not installed"
fi
d=$T/resume-plain
sed 's/"hidden_size": 64/"hidden_size": 32/' "$d/model.yml" >"$d/narrow.yml"
echo "{\"load\": \"$d/ckpt\"}" >"$d/load.yml"
check_fails "a checkpoint of another model shape is refused, naming the key" 2 'hidden_size = 64 .*config gives 32' \
    $TRAIN -q "$d/narrow.yml" "$d/load.yml"
echo "{\"load\": \"$d/ckpt\", \"finetune\": true, \"train_iters\": 2, \"log_dir\": \"$d/ft\"}" >"$d/finetune.yml"
sed 's/"train_iters": 20, //' "$d/model.yml" >"$d/model2.yml"
check "finetune: loads the weights and starts at iteration 1" bash -c \
    "$TRAIN -q '$d/model2.yml' '$d/finetune.yml' && grep -q '\"iteration\":1,' '$d/ft/metrics.jsonl'"

# ---- kill -9 during a save: latest still names the previous complete checkpoint, which loads ----
d=$T/kill
mkdir -p "$d"
char_config "$d/model.yml" 1 0.0
sed -i 's/"train_iters": 20, //' "$d/model.yml"
kill_during_save() {
    local try hit=0
    for try in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
        rm -rf "$d/ckpt"
        echo "{\"save\": \"$d/ckpt\", \"checkpoint_factor\": 1, \"train_iters\": 100000}" >"$d/run.yml"
        $TRAIN -q "$d/model.yml" "$d/run.yml" >/dev/null 2>&1 &
        local pid=$!
        local n=0
        while [ ! -f "$d/ckpt/latest" ] && [ $n -lt 3000 ]; do sleep 0.01; n=$((n + 1)); done
        sleep 0.$((RANDOM % 50))
        kill -9 $pid; wait $pid 2>/dev/null
        local latest newest
        latest=$(sed 's/global_step//' "$d/ckpt/latest")
        # A save in progress is a temporary directory global_stepN.tmp.*, switched into place when complete.
        newest=$(ls "$d/ckpt" | sed -n 's/^global_step\([0-9]*\).*/\1/p' | sort -n | tail -1)
        [ -f "$d/ckpt/global_step$latest/manifest.json" ] || { echo "latest ($latest) has no manifest"; return 1; }
        if [ "$newest" -gt "$latest" ]; then hit=1; break; fi
    done
    [ $hit = 1 ] || { echo "the kill never landed inside a save in 20 tries"; return 1; }
    echo "killed while saving global_step$newest; latest is global_step$latest"
    echo "{\"load\": \"$d/ckpt\", \"train_iters\": $((latest + 1)), \"override_lr_scheduler\": true, \"log_dir\": \"$d/after\"}" >"$d/after.yml"
    $TRAIN -q "$d/model.yml" "$d/after.yml" >/dev/null || return 1
    grep -q "\"iteration\":$((latest + 1))," "$d/after/metrics.jsonl"
}
check "kill -9 during a save leaves latest on a complete checkpoint that loads" kill_during_save

# ---- failures ----
# (50 non-finite steps in a row: tests/tools/robustness.sh, from weights holding NaN.)
check_fails "a config without data is refused" 2 'no data: set data_path' $TRAIN -q configs/tiny-test.yml
echo "{\"data_path\": \"$T/missing_text_document\"}" >"$T/missing.yml"
check_fails "a missing dataset names the file" 1 'missing_text_document' $TRAIN -q configs/tiny-test.yml "$T/missing.yml"
