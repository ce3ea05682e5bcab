#!/usr/bin/env bash
# bench/grad_stats.sh: what the logging keys cost a training step on one CPU rank. The same small
# model (char-level Tiny Shakespeare; LAYERS x HIDDEN, default 4 x 256, seq 128, micro-batch 4) trains
# ITERS steps (default 30) with nothing logged beyond the defaults, then with each of log_grad_norm,
# log_grad_pct_zeros, log_optimizer_states, log_gradient_noise_scale (n_batches 5) and log_param_norm
# on its own, then all of them, in REPEAT rounds (default 3) interleaved so load drifts hit every
# variant alike. Per variant: the median over rounds of the median elapsed ms per iteration (log_interval 1,
# steps after the first 3) and its ratio to the plain run. Off, each key costs one untaken branch per
# hook (no code of its own runs), so the plain run is also the "off" figure.
set -eu
cd "$(dirname "$0")/.."
bench/cpu_info.sh
LAYERS=${LAYERS:-4} HIDDEN=${HIDDEN:-256} ITERS=${ITERS:-30} REPEAT=${REPEAT:-3}
BIN=build/cpu/bin
T=$(mktemp -d /tmp/neox-gradstats-bench.XXXXXX); trap 'rm -rf "$T"' EXIT
D=../shared/data
python3 tests/tools/train_lib.py paragraphs "$D/text/tinyshakespeare_input.txt" "$T/shakespeare.jsonl"
$BIN/neox-preprocess --input "$T/shakespeare.jsonl" --output-prefix "$T/char" \
    --tokenizer-type CharLevelTokenizer --append-eod >/dev/null 2>&1
variants=(plain log_grad_norm log_grad_pct_zeros log_optimizer_states log_gradient_noise_scale log_param_norm all)
extra() {
    case $1 in
        plain) echo "" ;;
        all) echo ', "log_grad_norm": true, "log_grad_pct_zeros": true, "log_optimizer_states": true,
                   "log_gradient_noise_scale": true, "log_param_norm": true' ;;
        *) echo ", \"$1\": true" ;;
    esac
}
for r in $(seq "$REPEAT"); do
    for v in "${variants[@]}"; do
        cat >"$T/$v.yml" <<EOC
{"num_layers": $LAYERS, "hidden_size": $HIDDEN, "num_attention_heads": 8, "seq_length": 128,
 "max_position_embeddings": 128, "pos_emb": "rotary", "optimizer": {"type": "Adam", "params": {"lr": 0.0006}},
 "train_micro_batch_size_per_gpu": 4, "train_iters": $ITERS, "eval_interval": 100000, "do_valid": false,
 "do_test": false, "log_interval": 1, "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer",
 "log_dir": "$T/$v-$r" $(extra "$v")}
EOC
        $BIN/neox-train -q "$T/$v.yml" >/dev/null 2>&1
    done
done
.venv/bin/python - "$T" "$REPEAT" "${variants[@]}" <<'EOPY'
import json, statistics, sys
T, repeat, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def ms(v, r):
    times = [json.loads(l)["runtime/iteration_time"] for l in open(f"{T}/{v}-{r}/metrics.jsonl")
             if "runtime/iteration_time" in l]
    return 1000 * statistics.median(times[3:])
med = {v: statistics.median(ms(v, r) for r in range(1, repeat + 1)) for v in variants}
print(f"{'variant':28s} {'ms/iter':>9s} {'ratio':>7s}")
for v in variants:
    print(f"{v:28s} {med[v]:9.1f} {med[v] / med['plain']:7.3f}")
EOPY
