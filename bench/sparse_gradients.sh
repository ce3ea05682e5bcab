#!/usr/bin/env bash
# bench/sparse_gradients.sh [ranks...]: what sparse_gradients saves on a real vocabulary. GPT-2's
# tokenizer (50257 ids, padded to 50304) on 697 Common Crawl documents (dolma sample), an untied
# 2-layer model of hidden H (default 64; rows sent scale with nothing but the batch, bytes with H),
# micro-batch 2 x 512 tokens per rank, dense and sparse runs of 2 and 4 steps on each rank count
# (default 2 4); per step (the difference / 2) the data group's bytes from log_dir/comm_stats.json:
# dense all-reduce, sparse all-gathers, rows touched, and the same scaled to hidden 768 (GPT-2 small).
# Then dense and sparse train STEPS (default 20) steps with validation at the end: the median step
# time after the first 2 steps and the validation loss each reached.
set -eu
cd "$(dirname "$0")/.."
bench/cpu_info.sh
ranks=("${@:-2 4}"); [ $# -eq 0 ] && ranks=(2 4)
H=${H:-64}
BIN=build/cpu/bin MPIEXEC=${MPIEXEC:-mpiexec.mpich}
T=$(mktemp -d /tmp/neox-sparse-bench.XXXXXX); trap 'rm -rf "$T"' EXIT
D=../shared/data
$BIN/neox-preprocess --input $D/jsonl/dolma_cc_sample_697docs.jsonl.gz --output-prefix "$T/cc" \
    --tokenizer-type GPT2BPETokenizer --vocab-file $D/tokenizers/gpt2/vocab.json \
    --merge-file $D/tokenizers/gpt2/merges.txt --append-eod >/dev/null 2>&1
for p in "${ranks[@]}"; do
    for mode in dense sparse; do
        for n in 2 4 ${STEPS:-20}; do
            cat >"$T/$mode$p-$n.yml" <<EOC
{"num_layers": 2, "hidden_size": $H, "num_attention_heads": 4, "seq_length": 512, "max_position_embeddings": 512,
 "no_weight_tying": true, "pos_emb": "rotary", "sparse_gradients": $([ $mode = sparse ] && echo true || echo false),
 "optimizer": {"type": "Adam", "params": {"lr": 0.0006}}, "train_micro_batch_size_per_gpu": 2,
 "gradient_accumulation_steps": 1, "train_iters": $n, "eval_interval": $n, "eval_iters": 4, "split": "949,50,1", "log_interval": 1,
 "data_path": "$T/cc_text_document", "tokenizer_type": "GPT2BPETokenizer",
 "vocab_file": "$D/tokenizers/gpt2/vocab.json", "merge_file": "$D/tokenizers/gpt2/merges.txt",
 "log_dir": "$T/$mode$p-$n/log"}
EOC
            OMP_NUM_THREADS=1 $MPIEXEC -n "$p" $BIN/neox-train -q "$T/$mode$p-$n.yml" >"$T/$mode$p-$n.out" 2>&1
        done
    done
    .venv/bin/python - "$T" "$p" "$H" <<'EOPY'
import json, sys
T, p, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def step(mode, op, field):
    a, b = (json.load(open(f"{T}/{mode}{p}-{n}/log/comm_stats.json"))["ranks"][0]["groups"]["data"] for n in (2, 4))
    return (b.get(op, {}).get(field, 0) - a.get(op, {}).get(field, 0)) / 2
V = 50304
emb = 4 * V * H
ar_d, ar_s = step("dense", "all_reduce", "sent"), step("sparse", "all_reduce", "sent")
ag = step("sparse", "all_gather", "bytes"); ag_sent = step("sparse", "all_gather", "sent")
rows = (ag - 4 * p) / (4 + 4 * H)
emb_sent = 2 * (p - 1) / p * emb
print(f"dp{p}, hidden {H}: rows touched per step (all ranks) {rows:.0f} of {V} ({rows / p:.0f} per rank); "
      f"data group sent per step: dense {ar_d:,.0f} B, sparse {ar_s + ag_sent:,.0f} B "
      f"(embedding: {emb_sent:,.0f} B all-reduce -> {ag_sent:,.0f} B all-gathers, 1/{emb_sent / ag_sent:.1f})")
s768 = (p - 1) / p * (4 * p + rows * (4 + 4 * 768)); e768 = 2 * (p - 1) / p * 4 * V * 768
print(f"  at hidden 768 (GPT-2 small): embedding {e768:,.0f} B -> {s768:,.0f} B per step, 1/{e768 / s768:.1f}")
EOPY
    .venv/bin/python - "$T" "$p" "${STEPS:-20}" <<'EOPY'
import json, statistics, sys
T, p, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for mode in ("dense", "sparse"):
    rows = [json.loads(l) for l in open(f"{T}/{mode}{p}-{n}/log/metrics.jsonl")]
    t = statistics.median(r["runtime/iteration_time"] for r in rows if "runtime/iteration_time" in r and r["iteration"] > 2)
    valid = [r["validation/lm_loss"] for r in rows if "validation/lm_loss" in r][-1]
    print(f"  dp{p} {mode:6} {n} steps: median step {t * 1000:.1f} ms, validation loss {valid:.6f}")
EOPY
done
