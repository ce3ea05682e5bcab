# tests/tools/profile.sh: profile and memory_profiling on one rank (docs/metrics.md, "Profiling a
# run"). A run with profile_step_start 1 and profile_step_stop 3 writes log_dir/trace_rank0.json,
# trace-event JSON whose ranges nest, with two step ranges (iterations 2 and 3), each holding both
# micro-batches' forward and backward, the layers' ranges and the optimizer, and the checkpoint save
# between them; on the emulated device too. memory_profiling writes a snapshot after each step of the
# window whose regions equal memory_plan.json's and whose owners hold the parameters and Adam's
# moments the model's shape gives (tests/tools/profile_check.py restates them). A run that ends
# inside the window writes the steps it ran; without the keys nothing is written and the losses are
# the profiled run's; a window that is empty, a missing path and a missing log_dir are refused.
source tests/lib.sh

char_shakespeare "profiling" || exit 0

# L=2 H=64, vocabulary 512 untied: 2 x (12 H^2 + 13 H) + 2 H + 2 x 512 H = 165632 parameters.
PARAMS=165632
cat >"$T/model.yml" <<YML
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "no_weight_tying": true, "gpt_j_residual": false,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
  "train_iters": 4, "log_interval": 1, "do_valid": false, "do_test": false, "split": "100,0,0",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
YML
WINDOW='"profile_step_start": 1, "profile_step_stop": 3'
for backend in cpu emulated; do
    echo "{\"log_dir\": \"$T/$backend\", \"compute_backend\": \"$backend\", \"profile\": true, $WINDOW,
           \"memory_profiling\": true, \"memory_profiling_path\": \"$T/$backend-mem\",
           \"save\": \"$T/$backend-ckpt\", \"checkpoint_factor\": 2}" >"$T/$backend.yml"
    check "$backend: trains with profile and memory_profiling" \
        sh -c "$TRAIN '$T/model.yml' '$T/$backend.yml' >'$T/$backend.out' 2>&1"
    check "$backend: the trace parses, nests, and holds steps 2 and 3 with their micro-batches and layers" \
        python3 tests/tools/profile_check.py trace "$T/$backend" 1 1 3 2 0-1
    check "$backend: the checkpoint save of iteration 2 is in the trace" python3 -c "
import json, sys
events = json.load(open('$T/$backend/trace_rank0.json'))['traceEvents']
sys.exit(sum(e['name'] == 'checkpoint save' for e in events) != 1)"
    check "$backend: snapshots after iterations 2 and 3 against memory_plan.json and the model's shape" \
        python3 tests/tools/profile_check.py memory "$T/$backend-mem" "$T/$backend" 1 2,3 $PARAMS
    check "$backend: no snapshot outside the window" test "$(ls "$T/$backend-mem" | wc -l)" = 2
done

echo "{\"log_dir\": \"$T/short\", \"profile\": true, \"profile_step_start\": 2, \"profile_step_stop\": 9}" >"$T/short.yml"
check "a run ending inside the window writes its trace at the end" \
    sh -c "$TRAIN '$T/model.yml' '$T/short.yml' >'$T/short.out' 2>&1"
check "... with the steps of the window it ran (3 and 4)" python3 tests/tools/profile_check.py trace "$T/short" 1 2 4 2 0-1

echo "{\"log_dir\": \"$T/off\"}" >"$T/off.yml"
check "without profile no trace" sh -c \
    "$TRAIN '$T/model.yml' '$T/off.yml' >'$T/off.out' 2>&1 && ! ls '$T/off' | grep -q trace"
check "profiling changes no result (losses and gradient norms as without it)" \
    $LIB same "$T/off/metrics.jsonl" "$T/cpu/metrics.jsonl" train/lm_loss,train/grad_norm

echo "{\"log_dir\": \"$T/bad\", \"profile\": true, \"profile_step_start\": 3, \"profile_step_stop\": 3}" >"$T/empty.yml"
check_fails "an empty window is refused, naming both keys" 2 \
    "profile_step_stop \(3\) must be greater than profile_step_start \(3\)" $TRAIN "$T/model.yml" "$T/empty.yml"
echo '{"memory_profiling": true}' >"$T/nopath.yml"
check_fails "memory_profiling without memory_profiling_path is refused" 2 "memory_profiling: set memory_profiling_path" \
    $TRAIN "$T/model.yml" "$T/nopath.yml"
echo '{"profile": true}' >"$T/nolog.yml"
check_fails "profile without log_dir is refused" 2 "profile: set log_dir" $TRAIN "$T/model.yml" "$T/nolog.yml"
