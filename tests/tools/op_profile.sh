# tests/tools/op_profile.sh: the per-op profile and the GPU step prediction. neox-train with
# wall_clock_breakdown on (the CPU backend and the emulated device) prints the table by op class
# beside the timer lines and writes log_dir/op_profile.json, whose GEMM and attention FLOPs must equal
# the products restated from the model's shapes in tests/tools/op_profile.py, whose times are
# positive and within the iterations', and whose layer split covers every layer. bench/gpu_predict's
# dry trace must equal a computed step's call for call, and its predicted FLOPs, TFLOP/s and MFU must
# agree with the restatement and GPT-NeoX's formula; its step's residual adds and norms are the
# fused ones docs/model.md describes (counted per layer, with and without hidden dropout).
source tests/lib.sh

char_shakespeare "per-op profile" || exit 0
PREDICT=${PREDICT:-build/cpu/bench/gpu_predict}

# L=2 H=64 heads 4, seq 64, micro-batch 4; the char tokenizer's vocabulary pads to 512.
cat >"$T/model.yml" <<EOF
{
  "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "no_weight_tying": true, "gpt_j_residual": false,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "gradient_clipping": 1.0, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
  "train_iters": 6, "log_interval": 3, "do_valid": false, "do_test": false, "split": "100,0,0",
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
for backend in cpu emulated; do
    for precision in fp32 bfloat16; do
        name=$backend-$precision
        echo "{\"log_dir\": \"$T/$name\", \"compute_backend\": \"$backend\", \"precision\": \"$precision\",
               \"wall_clock_breakdown\": true}" >"$T/$name.yml"
        check "$name: trains with wall_clock_breakdown" sh -c "$TRAIN '$T/model.yml' '$T/$name.yml' >'$T/$name.out' 2>&1"
        check "$name: the op table is printed at each log line" \
            test "$(grep -c "^op profile per iteration over 3 ($backend, wall clock):" "$T/$name.out")" = 2
        check "$name: op_profile.json against the restated FLOPs, times and layers" \
            python3 tests/tools/op_profile.py train "$T/$name" 2 64 4 64 4 512 6
    done
done
check "without wall_clock_breakdown no table and no op_profile.json" sh -c \
    "echo '{\"log_dir\": \"$T/off\"}' >'$T/off.yml' && $TRAIN '$T/model.yml' '$T/off.yml' >'$T/off.out' 2>&1 &&
     ! grep -q '^op profile' '$T/off.out' && [ ! -e '$T/off/op_profile.json' ]"
check "the profile changes no result (losses and gradient norms as without it)" \
    $LIB same "$T/off/metrics.jsonl" "$T/cpu-fp32/metrics.jsonl" train/lm_loss,train/grad_norm

# gpu_predict on the same model in bf16: the dry trace equals the computed one, and the numbers agree.
sed 's/"tokenizer_type": "CharLevelTokenizer"/&, "precision": "bfloat16"/' "$T/model.yml" >"$T/predict.yml"
check "gpu_predict: runs with the trace check" sh -c "$PREDICT '$T/predict.yml' vocab=512 check=1 >'$T/predict.out'"
check "gpu_predict: predicted FLOPs, TFLOP/s and MFU consistent" \
    python3 tests/tools/op_profile.py predict "$T/predict.out" 2 64 4 64 4 512
check "gpu_predict: the built-in 125M, 350M and 1.3B" sh -c \
    "$PREDICT table=0 >'$T/builtin.out' && [ \$(grep -c '^predict: H[12]00 ' '$T/builtin.out') = 6 ]"
check "gpu_predict: attention priced on the route's implementation (cuDNN by default, the own kernels with cudnn=0)" sh -c \
    "$PREDICT >'$T/route-cudnn.out' && $PREDICT cudnn=0 >'$T/route-own.out' &&
     python3 tests/tools/op_profile.py route '$T/route-cudnn.out' '$T/route-own.out'"
check "gpu_predict: the MLP's GELU fused into its products where cuDNN is (cudnn_mlp=1), its passes apart without" sh -c \
    "$PREDICT table=2 >'$T/mlp-fused.out' && $PREDICT table=2 cudnn_mlp=0 >'$T/mlp-apart.out' &&
     python3 tests/tools/op_profile.py mlp '$T/mlp-fused.out' '$T/mlp-apart.out'"
# The branches' residual adds carry the row-parallel biases and make the next norm; under hidden
# dropout the biases are added before the mask, on their own.
check "gpu_predict: the residual adds fused with the biases and the next norms" sh -c \
    "$PREDICT '$T/predict.yml' vocab=512 table=2 >'$T/residual.out' &&
     python3 tests/tools/op_profile.py residual '$T/residual.out' 2 0"
sed 's/"precision": "bfloat16"/&, "hidden_dropout": 0.1/' "$T/predict.yml" >"$T/dropout.yml"
check "gpu_predict: under hidden dropout the biases are added before the mask, the add and norm still fused" sh -c \
    "$PREDICT '$T/dropout.yml' vocab=512 table=2 >'$T/residual-dropout.out' &&
     python3 tests/tools/op_profile.py residual '$T/residual-dropout.out' 2 1"
check_fails "gpu_predict: an unknown key is refused" 2 "unknown key in 'gpus=2'" $PREDICT gpus=2
