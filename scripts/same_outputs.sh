#!/usr/bin/env bash
# same_outputs.sh: do two builds of the tools give the same results? For a change meant to leave
# behaviour unchanged (a restructuring): the same preprocessing, training (fp32, bf16, fp16 with loss
# scaling, dropout, accumulation; SGD; two data-parallel ranks with 16-bit wire formats, ZeRO-1,
# PowerSGD and 1-bit Adam), Hugging Face export in three dtypes, import back, and evaluation run with each build,
# then the outputs are compared: per-step losses exactly, every checkpoint tensor with h5diff (the
# /config group is left out: it records the run's own paths), every exported file byte for byte.
#   scripts/same_outputs.sh BIN_A BIN_B [WORK]   (BIN_*: folders holding the four tools; needs ../shared)
# Exit status 0 when everything is the same; the differences are listed otherwise.
set -euo pipefail
A=$1 B=$2 WORK=${3:-$(mktemp -d "${TMPDIR:-/tmp}/same-outputs.XXXXXX")}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DATA=${SHARED:-$ROOT/../shared}/data
A=$(cd "$A" && pwd) B=$(cd "$B" && pwd)

run() {  # run BIN OUT
    local bin=$1 out=$2
    rm -rf "$out" && mkdir -p "$out"
    python3 "$ROOT/tests/tools/train_lib.py" paragraphs "$DATA/text/tinyshakespeare_input.txt" "$out/s.jsonl"
    "$bin/neox-preprocess" --input "$out/s.jsonl" --output-prefix "$out/char" --tokenizer-type CharLevelTokenizer \
        --append-eod --workers 2 >/dev/null 2>&1
    cat >"$out/model.yml" <<YML
{ "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "seq_length": 64, "max_position_embeddings": 64,
  "pos_emb": "rotary", "rotary_pct": 0.25, "gpt_j_residual": true, "no_weight_tying": true,
  "min_lr": 0.0003, "weight_decay": 0.01, "lr_decay_style": "cosine", "warmup": 0.1, "gradient_clipping": 1.0,
  "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "hidden_dropout": 0.1,
  "attention_dropout": 0.1, "train_iters": 20, "eval_interval": 10, "eval_iters": 2, "log_interval": 1,
  "checkpoint_factor": 10, "data_path": "$out/char_text_document", "tokenizer_type": "CharLevelTokenizer" }
YML
    local name extra ranks adam='"optimizer": {"type": "Adam", "params": {"lr": 0.003, "betas": [0.9, 0.95], "eps": 1.0e-8}}'
    while read -r name ranks extra; do
        case $extra in *'"optimizer"'*) ;; *) extra=", $adam $extra" ;; esac
        echo "{\"log_dir\": \"$out/$name\", \"save\": \"$out/$name/ckpt\" $extra}" >"$out/$name.yml"
        if [ "$ranks" = 1 ]; then "$bin/neox-train" -q "$out/model.yml" "$out/$name.yml" </dev/null
        else mpiexec -n "$ranks" "$bin/neox-train" -q "$out/model.yml" "$out/$name.yml" </dev/null; fi
    done <<'RUNS'
fp32 1
bf16 1 , "precision": "bfloat16"
fp16 1 , "fp16": {"enabled": true, "initial_scale_power": 20}
dp2bf16 2 , "communication_data_type": "bf16", "zero_optimization": {"stage": 1}
dp2fp16 2 , "communication_data_type": "fp16"
powersgd 2 , "gradient_compression": "powersgd", "gradient_compression_rank": 2
sgd 1 , "optimizer": {"type": "sgd", "params": {"lr": 0.01, "momentum": 0.9}}
onebitadam 2 , "optimizer": {"type": "OneBitAdam", "params": {"lr": 0.003, "freeze_step": 8, "weight_decay": 0.01}}
RUNS
    for dt in fp32 bf16 fp16; do "$bin/neox-convert" to-hf --input "$out/fp32/ckpt" --output "$out/hf_$dt" --dtype $dt >/dev/null 2>&1; done
    for dt in bf16 fp16; do "$bin/neox-convert" from-hf --input "$out/hf_$dt" --output "$out/back_$dt" >/dev/null 2>&1; done
    echo "{\"load\": \"$out/fp32/ckpt\", \"eval_results_prefix\": \"$out/eval\"}" >"$out/eval.yml"
    "$bin/neox-eval" -q "$out/model.yml" "$out/eval.yml" --tasks wikitext --data-dir "$DATA/eval" --limit 3 2>/dev/null |
        grep '|' >"$out/eval.txt"
}

run "$A" "$WORK/a"
run "$B" "$WORK/b"
differ=0 compared=0
say() { echo "$*"; differ=$((differ + 1)); }
for name in fp32 bf16 fp16 dp2bf16 dp2fp16 powersgd sgd onebitadam; do
    compared=$((compared + 1))
    for side in a b; do
        [ "$(grep -c '"train/lm_loss"' "$WORK/$side/$name/metrics.jsonl" 2>/dev/null)" = 20 ] ||
            say "run $name of build $side did not log 20 training losses"
    done
    cmp -s <(grep -o '"train/lm_loss": *[^,]*' "$WORK/a/$name/metrics.jsonl") \
           <(grep -o '"train/lm_loss": *[^,]*' "$WORK/b/$name/metrics.jsonl") || say "losses differ: $name"
done
while read -r shard; do
    compared=$((compared + 1))
    h5diff --exclude-path /config "$WORK/a/$shard" "$WORK/b/$shard" >/dev/null 2>&1 || say "checkpoint differs: $shard"
done < <(cd "$WORK/a" && find . -name '*.h5' | sort)
while read -r f; do
    compared=$((compared + 1))
    cmp -s "$WORK/a/$f" "$WORK/b/$f" || say "export differs: $f"
done < <(cd "$WORK/a" && find hf_* -type f | sort)
compared=$((compared + 1)); cmp -s "$WORK/a/eval.txt" "$WORK/b/eval.txt" || say "evaluation differs"
echo "$compared outputs compared, $differ differ (in $WORK)"
[ "$differ" = 0 ]
