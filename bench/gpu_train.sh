#!/usr/bin/env bash
# bench/gpu_train.sh: GPU training throughput of neox.c on GPT-NeoX 125M (the model of GPT-NeoX's
# configs/125M.yml: 12 layers, hidden 768, 12 heads, sequence 2048, rotary, layernorm, untied output
# layer; GPT-2 tokenizer, vocabulary 50257 padded to 50304), precision bfloat16 on the cuda backend,
# trained on Tiny Shakespeare. Run by tests/gpu/device-check.sh on a GPU host.
# It trains warmup + steps iterations with one record per step in metrics.jsonl and reports, over the
# steps after the warm-up (median; mean in brackets): tokens/s, model FLOP/s by GPT-NeoX's formula
# (lib/metrics/flops.c: no recomputation counted; activation checkpointing is off), and MFU against
# two peaks: the bf16 GEMM rate measured on the same GPU in the same session (bench/gpu_ops.c's
# 8192^3 cublasGemmEx; given as gemm_tflops= or measured here by running it) and the H200's nominal
# dense bf16 peak, 989 TFLOP/s. micro=auto tries micro-batches 32, 16 and 8 (one GPU, no gradient
# accumulation) and keeps the largest that trains (a larger one that fails, out of memory, is
# reported). The tries share a time cap (seconds=); the steps a try finished before it still count.
# Usage: bench/gpu_train.sh [key=value...]   keys (defaults):
#   micro (auto)  steps (20)  warmup (5)  seconds (150)  gemm_tflops (measured)  peak_tflops (989)
#   precision (bfloat16; fp8: the transformer layers' products on FP8 operands, sm_89 and newer: run it
#   beside a bfloat16 run in the same session and compare tokens/s; its MFU is still against the bf16
#   peaks)  backend (cuda)  data (../shared/data's gpt2 tokenizer and text folders, or a
#   folder holding vocab.json, merges.txt and tinyshakespeare_input.txt)
#   layers (12) hidden (768) heads (12) seq (2048)  (smaller values make a CPU dry run possible)
#   profile (0; 1: wall_clock_breakdown on, and the last per-op table by class printed: CUDA events
#   around every op, read once per 2048 ops, which the measured steps then include)
# After the measurement it prints bench/gpu_predict's roofline prediction for the same config (the
# H100's and H200's lines and the table by op class) when that program is built beside the tools
# (NEOX_PREDICT, default build/cuda/bench/gpu_predict), with the GEMM rate measured here.
# Environment: NEOX_BIN (default build/cuda/bin). Without a GPU and backend cuda it prints
# "gpu_train: no GPU: skipped" and exits 0.
set -uo pipefail
cd "$(dirname "$0")/.."
bench/cpu_info.sh
declare -A opt=([micro]=auto [steps]=20 [warmup]=5 [seconds]=150 [gemm_tflops]= [peak_tflops]=989 [precision]=bfloat16
                [backend]=cuda [data]= [layers]=12 [hidden]=768 [heads]=12 [seq]=2048 [profile]=0)
for arg in "$@"; do
    key=${arg%%=*}
    [[ $arg == *=* && -n ${opt[$key]+x} ]] || { echo "bench/gpu_train.sh: bad argument '$arg'" >&2; exit 2; }
    opt[$key]=${arg#*=}
done
BIN=${NEOX_BIN:-build/cuda/bin}
TRAIN=$BIN/neox-train
[ -x "$TRAIN" ] || { echo "bench/gpu_train.sh: $TRAIN is missing (make CUDA=1 tools)" >&2; exit 1; }
if [ "${opt[backend]}" = cuda ] && ! "$TRAIN" -V 2>/dev/null | grep -qE 'cuda \([0-9]+ devices?:'; then
    echo "gpu_train: no GPU: skipped"; exit 0
fi
if [ -n "${opt[data]}" ]; then
    vocab=${opt[data]}/vocab.json merges=${opt[data]}/merges.txt text=${opt[data]}/tinyshakespeare_input.txt
else
    d=${SHARED:-../shared}/data
    vocab=$d/tokenizers/gpt2/vocab.json merges=$d/tokenizers/gpt2/merges.txt text=$d/text/tinyshakespeare_input.txt
fi
for f in "$vocab" "$merges" "$text"; do [ -f "$f" ] || { echo "bench/gpu_train.sh: $f is missing (data=)" >&2; exit 1; }; done

work=$(mktemp -d "${TMPDIR:-/tmp}/neox-gpubench.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$BIN/neox-preprocess" --input "$text" --output-prefix "$work/text" --tokenizer-type GPT2BPETokenizer \
    --vocab-file "$vocab" --merge-file "$merges" --append-eod >"$work/preprocess.log" 2>&1 \
    || { cat "$work/preprocess.log" >&2; exit 1; }

# The bf16 GEMM rate MFU is measured against.
gemm=${opt[gemm_tflops]}
if [ -z "$gemm" ] && [ -x build/cuda/bench/gpu_ops ]; then
    gemm=$(timeout 60 build/cuda/bench/gpu_ops | awk '/^gemm bf16/ {for (i = 1; i < NF; i++) if ($(i + 1) == "TFLOP/s") print $i}')
fi
echo "# $("$TRAIN" -V | sed -n 's/^backends: //p')"
echo "# model: layers ${opt[layers]}, hidden ${opt[hidden]}, heads ${opt[heads]}, seq ${opt[seq]}; ${opt[precision]} on ${opt[backend]}; " \
     "${opt[warmup]} warm-up + ${opt[steps]} measured steps, at most ${opt[seconds]} s in all"
echo "# peaks: measured bf16 GEMM ${gemm:-not measured} TFLOP/s, nominal ${opt[peak_tflops]} TFLOP/s"

# config MICRO: the 125M run with micro-batch MICRO.
config() {
    cat >"$work/m$1.yml" <<EOF
{
  "num_layers": ${opt[layers]}, "hidden_size": ${opt[hidden]}, "num_attention_heads": ${opt[heads]},
  "seq_length": ${opt[seq]}, "max_position_embeddings": ${opt[seq]},
  "norm": "layernorm", "pos_emb": "rotary", "no_weight_tying": true, "gpt_j_residual": false,
  "init_method": "small_init", "output_layer_init_method": "wang_init",
  "optimizer": {"type": "Adam", "params": {"lr": 0.0006, "betas": [0.9, 0.95], "eps": 1.0e-8}},
  "min_lr": 0.00006, "lr_decay_style": "cosine", "warmup": 0.01, "gradient_clipping": 1.0, "weight_decay": 0.1,
  "hidden_dropout": 0.0, "attention_dropout": 0.0, "checkpoint_activations": false,
  "precision": "${opt[precision]}", "compute_backend": "${opt[backend]}",
  "train_micro_batch_size_per_gpu": $1, "gradient_accumulation_steps": 1,
  "train_iters": $((opt[warmup] + opt[steps])), "log_interval": 1,
  "split": "100,0,0", "do_valid": false, "do_test": false, "eval_interval": 1000000, "eval_iters": 0,
  "data_path": "$work/text_text_document", "tokenizer_type": "GPT2BPETokenizer",
  "vocab_file": "$vocab", "merge_file": "$merges", "log_dir": "$work/log$1", "wall_clock_breakdown": $([ "${opt[profile]}" = 1 ] && echo true || echo false)
}
EOF
}

# try MICRO: trains under what is left of the time cap. 0: at least one step after the warm-up was
# recorded; 1: the trainer failed (out of memory, say: a smaller micro-batch may fit); 2: out of time.
deadline=$(( $(date +%s) + opt[seconds] ))
try() {
    config "$1"
    timeout "$((deadline - $(date +%s)))" "$TRAIN" "$work/m$1.yml" >"$work/train$1.log" 2>&1
    local s=$? done
    done=$(grep -c '"train/lm_loss"' "$work/log$1/metrics.jsonl" 2>/dev/null)
    echo "micro-batch $1: exit $s ($([ $s = 124 ] && echo 'time cap reached; ')${done:-0} steps recorded)"
    [ "${done:-0}" -gt "${opt[warmup]}" ] && return 0
    [ $s = 124 ] && return 2
    tail -n 3 "$work/train$1.log" | sed 's/^/#   /'
    return 1
}
if [ "${opt[micro]}" = auto ]; then candidates=(32 16 8); else candidates=("${opt[micro]}"); fi
micro=
for m in "${candidates[@]}"; do
    [ "$(date +%s)" -lt "$deadline" ] || break
    try "$m"; case $? in 0) micro=$m; break ;; 2) break ;; esac
done
[ -n "$micro" ] || { echo "result: no micro-batch trained past the warm-up"; exit 1; }

python3 - "$work/log$micro/metrics.jsonl" "${opt[warmup]}" "${gemm:-0}" "${opt[peak_tflops]}" "$micro" "${opt[seq]}" <<'EOF'
import json, statistics, sys
path, warmup, gemm, peak, micro, seq = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
rows = [r for r in map(json.loads, open(path)) if "runtime/iteration_time" in r and r["iteration"] > warmup]
def stat(key, scale=1.0):
    v = [r[key] * scale for r in rows if r.get(key) is not None]
    return (statistics.median(v), statistics.mean(v)) if v else (float("nan"), float("nan"))
tok, flops = stat("runtime/tokens_per_sec"), stat("runtime/flops_per_sec_per_gpu", 1e-12)
ms = stat("runtime/iteration_time", 1e3)
print(f"steps measured: {len(rows)} (iterations {rows[0]['iteration']}..{rows[-1]['iteration']}), micro-batch {micro} x seq {seq}"
      f" = {micro * seq} tokens per step, {ms[0]:.1f} ms per step [{ms[1]:.1f}]")
print(f"tokens/s: {tok[0]:.0f} [{tok[1]:.0f}]")
print(f"model TFLOP/s (GPT-NeoX formula): {flops[0]:.2f} [{flops[1]:.2f}]")
mfu_gemm = f"{flops[0] / gemm:.1%} [{flops[1] / gemm:.1%}] of the measured bf16 GEMM rate {gemm:.1f} TFLOP/s" if gemm > 0 else "n/a (bf16 GEMM rate not measured)"
print(f"MFU: {mfu_gemm}; {flops[0] / peak:.1%} [{flops[1] / peak:.1%}] of the nominal {peak:.0f} TFLOP/s")
trainer = stat("runtime/mfu")
if trainer[0] == trainer[0]:  # the trainer's own MFU, against its table of data-sheet peaks
    print(f"MFU as the trainer logs it (runtime/mfu): {trainer[0]:.1%} [{trainer[1]:.1%}]")
print("result: " + json.dumps({"micro_batch": micro, "seq": seq, "steps": len(rows), "ms_per_step": round(ms[0], 2),
                               "tokens_per_s": round(tok[0]), "model_tflops": round(flops[0], 2), "gemm_bf16_tflops": gemm,
                               "mfu_vs_gemm": round(flops[0] / gemm, 4) if gemm > 0 else None, "mfu_vs_peak": round(flops[0] / peak, 4)}))
EOF
if [ "${opt[profile]}" = 1 ]; then  # the last table by op class the trainer printed
    awk '/^op profile per iteration/ {n = 0} /^op profile per iteration/ || /^  [a-z]/ {t[n++] = $0} END {for (i = 0; i < n; i++) print t[i]}' \
        "$work/train$micro.log" | sed 's/^/measured /'
fi
PREDICT=${NEOX_PREDICT:-build/cuda/bench/gpu_predict}
if [ -x "$PREDICT" ]; then
    measured_on=H200; "$TRAIN" -V 2>/dev/null | grep -q 'H100' && measured_on=H100
    "$PREDICT" "$work/m$micro.yml" micro="$micro" ${gemm:+gemm_tflops=$gemm measured_on=$measured_on} || echo "gpu_predict: failed"
fi
