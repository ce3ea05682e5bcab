# tests/tools/ckpt_faults.sh: what the tools load and write can be trusted. A checkpoint whose shard
# has a flipped bit, a few changed bytes or a truncation is refused, naming the shard, by training,
# evaluation and every conversion before HDF5 reads it (under the sanitizer build: no report, no
# signal exit); a run state with out-of-range fields is refused naming the field; a manifest
# declaring ranks it does not list is refused; kill -9 during saves (also saving again into another
# directory's iterations) always leaves a `latest` that verifies and resumes; a full disk or a
# read-only output directory is a clear error naming the output, with no temporary and nothing
# complete-looking left; temporaries of killed processes are removed by the next run; SIGHUP ends
# the trainer with a checkpoint as SIGTERM does and removes a preprocess run's temporaries.
# (Symlinks planted at temporary names and name collisions: tests/unit/test_core.c.)
source tests/lib.sh

PRE=$NEOX_BIN/neox-preprocess
need_shared "checkpoint faults" || exit 0
[ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "checkpoint faults" "no Tiny Shakespeare in $DATA/text"; exit 0; }

python3 tests/tools/train_lib.py paragraphs "$DATA/text/tinyshakespeare_input.txt" "$T/s.jsonl"
check "preprocess (char-level)" $PRE --input "$T/s.jsonl" --output-prefix "$T/char" --tokenizer-type CharLevelTokenizer --append-eod
# model.yml HIDDEN ITERS: a tiny char-level model; the load and save directories come from other files.
model_yml() {
    cat <<EOF
{
  "num_layers": 2, "hidden_size": $1, "num_attention_heads": 4, "seq_length": 32, "max_position_embeddings": 32,
  "pos_emb": "rotary", "rotary_pct": 0.25, "no_weight_tying": true,
  "optimizer": {"type": "Adam", "params": {"lr": 0.003}},
  "train_micro_batch_size_per_gpu": 4, "train_iters": $2, "log_interval": 100, "eval_interval": 1000, "eval_iters": 1,
  "data_path": "$T/char_text_document", "tokenizer_type": "CharLevelTokenizer"
}
EOF
}
model_yml 32 6 >"$T/model.yml"
yml() { echo "$2" >"$T/$1.yml"; echo "$T/$1.yml"; }  # yml NAME JSON: writes $T/NAME.yml, prints its path
check "train 6 iterations, saving at 3 and 6" $TRAIN -q "$T/model.yml" "$(yml save "{\"save\": \"$T/ckpt\", \"checkpoint_factor\": 3}")"
check "reshard to tp2 (two shard files)" $CONVERT reshard --input "$T/ckpt" --output "$T/tp2" --tp 2
check_output "the tp2 checkpoint verifies" "is sound" $CONVERT verify "$T/tp2"

# refused NAME PATTERN CMD...: CMD exits 1 (not a signal), stderr matches PATTERN and holds no
# sanitizer report.
refused() {
    local name=$1 pattern=$2; shift 2
    "$@" >/dev/null 2>"$_last_out"
    local got=$?
    if [ "$got" != 1 ]; then echo "exit status $got, expected 1" >>"$_last_out"; _report 1 "$name" "$_last_out"
    elif grep -qE 'Sanitizer|runtime error' "$_last_out"; then _report 1 "$name (sanitizer report)" "$_last_out"
    elif ! grep -qE -- "$pattern" "$_last_out"; then echo "stderr does not match: $pattern" >>"$_last_out"; _report 1 "$name" "$_last_out"
    else _report 0 "$name"; fi
}

# every_loader LABEL CKPT PATTERN: train (resume), eval, inspect, reshard and to-hf all refuse CKPT.
every_loader() {
    local label=$1 ck=$2 pattern=$3 bin=${LOADER_BIN:-$NEOX_BIN}
    yml load_bad "{\"load\": \"$ck\"}" >/dev/null
    refused "$label: train refuses it" "$pattern" $bin/neox-train -q "$T/model.yml" "$T/load_bad.yml"
    refused "$label: eval refuses it" "$pattern" $bin/neox-eval -q "$T/model.yml" "$T/load_bad.yml" --results-prefix -
    refused "$label: inspect refuses it" "$pattern" $bin/neox-convert inspect "$ck"
    rm -rf "$T/out_rs" "$T/out_hf"
    refused "$label: reshard refuses it" "$pattern" $bin/neox-convert reshard --input "$ck" --output "$T/out_rs" --pp 2
    refused "$label: to-hf refuses it" "$pattern" $bin/neox-convert to-hf --input "$ck" --output "$T/out_hf"
    [ ! -e "$T/out_rs" ] && [ ! -e "$T/out_hf" ] || echo "not ok - $label: an output was left"
}

# ---- bit flips, changed bytes and truncations in every shard -----------------------------------------
# The sanitizer build (make SANITIZE=1 tools) when there is one: no report and no signal exit.
if [ -x build/san/bin/neox-train ] && [ -x build/san/bin/neox-eval ] && [ -x build/san/bin/neox-convert ]; then
    LOADER_BIN=build/san/bin
    export ASAN_OPTIONS=detect_leaks=0:exitcode=86 UBSAN_OPTIONS=print_stacktrace=1
else
    skip "bit flips under the sanitizer build" "build/san/bin has no tools (make SANITIZE=1 tools)"
fi
flip() {  # flip FILE OFFSET: xors one bit of the byte at OFFSET
    python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1)[0]; f.seek(int(sys.argv[2])); f.write(bytes([b ^ 0x10]))' "$1" "$2"
}
for shard in rank_00000.h5 rank_00001.h5; do
    size=$(stat -c %s "$T/tp2/global_step6/$shard")
    for offset in 0 100 $((size / 2)) $((size - 1)); do
        rm -rf "$T/bad" && cp -r "$T/tp2" "$T/bad" && flip "$T/bad/global_step6/$shard" $offset
        every_loader "$shard bit flip at byte $offset" "$T/bad" "$shard: CRC-32 [0-9a-f]{8}, manifest.json says [0-9a-f]{8} \(corrupt\)"
    done
    rm -rf "$T/bad" && cp -r "$T/tp2" "$T/bad"
    printf 'NEOXNEOXNEOXNEOX' | dd of="$T/bad/global_step6/$shard" bs=1 seek=$((size / 3)) conv=notrunc status=none
    every_loader "$shard: 16 bytes changed" "$T/bad" "$shard: CRC-32 .*\(corrupt\)"
    rm -rf "$T/bad" && cp -r "$T/tp2" "$T/bad" && truncate -s $((size - 4096)) "$T/bad/global_step6/$shard"
    every_loader "$shard truncated" "$T/bad" "$shard: $((size - 4096)) bytes, manifest.json says $size \(truncated"
done
unset ASAN_OPTIONS UBSAN_OPTIONS LOADER_BIN

# ---- the run state and the manifest are validated ---------------------------------------------------
# edit_state CKPT OLD NEW: replaces OLD by NEW (the same length) in the stored state/train.json of
# rank 0's shard and records the shard's new size and CRC-32 in the manifest (zlib, from Python).
edit_state() {
    python3 - "$@" <<'PY'
import json, sys, zlib
ck, old, new = sys.argv[1], sys.argv[2].encode(), sys.argv[3].encode()
assert len(old) == len(new)
d = f"{ck}/global_step6"
data = open(f"{d}/rank_00000.h5", "rb").read()
assert data.count(old) == 1, (old, data.count(old))
data = data.replace(old, new)
open(f"{d}/rank_00000.h5", "wb").write(data)
m = json.load(open(f"{d}/manifest.json"))
for f in m["files"]:
    if f["name"] == "rank_00000.h5":
        f["bytes"], f["crc32"] = len(data), "%08x" % zlib.crc32(data)
json.dump(m, open(f"{d}/manifest.json", "w"), indent=2)
PY
}
while IFS='|' read -r old new pattern; do
    rm -rf "$T/st" && cp -r "$T/ckpt" "$T/st" && edit_state "$T/st" "$old" "$new"
    refused "run state $new: train refuses it" "state/train.json: $pattern" $TRAIN -q "$T/model.yml" "$(yml load_st "{\"load\": \"$T/st\"}")"
    refused "run state $new: eval refuses it" "state/train.json: $pattern" $EVAL -q "$T/model.yml" "$T/load_st.yml" --results-prefix -
    refused "run state $new: verify refuses it" "state/train.json: $pattern" $CONVERT verify "$T/st"
done <<'EOF'
"optimizer_steps": 6,|"optimizer_steps":-1,|optimizer_steps = -1 must be >= 0
"train_samples": 24,|"train_samples": -8,|train_samples = -8 must be >= 0
"iteration": 6,|"iteration":-5,|iteration = -5 must be >= 0
"seed": 1234,|"seed":"123",|seed must be an integer
EOF
rm -rf "$T/ranks" && cp -r "$T/tp2" "$T/ranks"
sed -i 's/"world_size": 2/"world_size": 4/; s/"model_parallel_size": 2/"model_parallel_size": 4/' "$T/ranks/global_step6/manifest.json"
refused "verify refuses a manifest declaring 4 ranks and listing 2" "manifest.json: world_size is 4 but no shard file of rank 2" \
    $CONVERT verify "$T/ranks"

# ---- kill -9 during saves ------------------------------------------------------------------------------
# A larger model (shards of about 13 MB, so saving dominates the run) saved at every iteration. A
# and B both hold iterations 1..12. Each run loads A's iteration L-1, where B/latest names L, and
# saves L, L+1, ... into B: its first save replaces the very checkpoint B/latest names. It is
# killed at a different moment of that save each time (counted from the first change in B).
model_yml 192 12 >"$T/big.yml"
check "kill -9: A holds iterations 1..12" $TRAIN -q "$T/big.yml" "$(yml fill_a "{\"save\": \"$T/A\", \"checkpoint_factor\": 1}")"
cp -r "$T/A" "$T/B"
yml a_to_b "{\"load\": \"$T/A\", \"save\": \"$T/B\", \"checkpoint_factor\": 1}" >/dev/null
yml from_b "{\"load\": \"$T/B\"}" >/dev/null
bad=0
for delay in 0 0.01 0.02 0.04 0.07 0.1 0.15 0.2 0.3 0.5; do
    L=$(sed 's/global_step//' "$T/B/latest")
    echo "global_step$((L - 1))" >"$T/A/latest"
    touch "$T/started"
    $TRAIN -q "$T/big.yml" "$T/a_to_b.yml" >/dev/null 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null && [ -z "$(find "$T/B" -newer "$T/started" -print -quit)" ]; do sleep 0.005; done
    sleep $delay
    kill -9 $pid 2>/dev/null
    wait $pid 2>/dev/null
    if ! $CONVERT verify "$T/B" >"$_last_out" 2>&1 || ! $TRAIN -q "$T/big.yml" "$T/from_b.yml" >>"$_last_out" 2>&1; then
        bad=1; echo "after a kill $delay s into a save (latest: $(cat "$T/B/latest"))" >>"$_last_out"; break
    fi
done
_report $bad "kill -9 while replacing the checkpoint B/latest names: every time latest names one that verifies and resumes" "$_last_out"
left=$(ls "$T/B" | grep -c '\.tmp\.')
check "a save into B after the kills" bash -c "$TRAIN '$T/big.yml' '$T/a_to_b.yml' 2>'$T/after.err'"
check "... removes the $left temporaries the killed runs left" bash -c "! ls '$T/B' | grep -q '\.tmp\.'"
check_output "... naming each in a notice" "^$left\$" bash -c "grep -c 'a temporary left by process' '$T/after.err' || :"

# ---- stale temporaries and SIGHUP ------------------------------------------------------------------
dead=$(( $(cat /proc/sys/kernel/pid_max) - 1 ))
kill -0 $dead 2>/dev/null && dead=$((dead - 1))
stale="$T/rs_out.tmp.$dead.AbC123.$(hostname)"
mkdir -p "$stale/global_step6" && echo x >"$stale/global_step6/rank_00000.h5"
check_fails "a conversion's temporary left by a dead process is removed, named in a notice" 0 \
    "removed .*rs_out\.tmp\.$dead\.AbC123.*no longer running" $CONVERT reshard --input "$T/ckpt" --output "$T/rs_out" --tp 2
check "... and is gone" test ! -e "$stale"
mkfifo "$T/fifo"
for sig in KILL HUP; do
    rm -f "$T/pfx"*
    sleep 30 >"$T/fifo" &
    holder=$!
    $PRE --input "$T/fifo" --output-prefix "$T/pfx" --tokenizer-type CharLevelTokenizer >/dev/null 2>&1 &
    pid=$!
    for _ in $(seq 50); do ls "$T" | grep -q '^pfx.*\.tmp\.' && break; sleep 0.1; done
    kill -$sig $pid; wait $pid 2>/dev/null; kill $holder 2>/dev/null; wait $holder 2>/dev/null
    if [ $sig = KILL ]; then
        check "preprocess killed with -9 leaves its temporaries" bash -c "ls '$T' | grep -q '^pfx.*\.tmp\.'"
        check_fails "the next preprocess into that prefix removes them, naming them" 0 "removed .*pfx.*\.tmp\..*no longer running" \
            $PRE --input "$T/s.jsonl" --output-prefix "$T/pfx" --tokenizer-type CharLevelTokenizer
        check "... none is left" bash -c "! ls '$T' | grep -q '^pfx.*\.tmp\.'"
    else
        check "SIGHUP: preprocess removes its temporaries" bash -c "! ls '$T' | grep -q '^pfx.*\.tmp\.'"
    fi
done
model_yml 32 100000 >"$T/long.yml"
$TRAIN -q "$T/long.yml" "$(yml hup "{\"save\": \"$T/hup\", \"checkpoint_factor\": 1000000}")" >/dev/null 2>&1 &
pid=$!
sleep 2; kill -HUP $pid
for _ in $(seq 300); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
kill -0 $pid 2>/dev/null && kill -9 $pid  # a swallowed SIGHUP would train on for hours
wait $pid; status=$?
check "SIGHUP stops the trainer like SIGTERM: exit 3" test "$status" = 3
check_output "... with a checkpoint that verifies" "is sound" $CONVERT verify "$T/hup"

# ---- full disks and read-only output directories ------------------------------------------------------
M=$T/mnt
mount_tmpfs "$M" 120k "full disk and read-only outputs" || exit 0
check "to-hf for the from-hf case" $CONVERT to-hf --input "$T/ckpt" --output "$T/hf"
$EVAL -q "$T/model.yml" "$(yml load_ok "{\"load\": \"$T/ckpt\"}")" --results-prefix "$T/res" >/dev/null 2>&1
results_bytes=$(stat -c %s "$T"/res_eval_results_*.json)
# writer NAME OUTPUT CMD...: every writer's command, writing OUTPUT under $M.
writers() {
    echo "train save|$M/ck|$TRAIN -q $T/model.yml $(yml full_save "{\"save\": \"$M/ck\", \"checkpoint_factor\": 3}")"
    echo "reshard|$M/rs|$CONVERT reshard --input $T/ckpt --output $M/rs --tp 2"
    echo "from-hf|$M/fh|$CONVERT from-hf --input $T/hf --output $M/fh"
    echo "to-hf|$M/th|$CONVERT to-hf --input $T/ckpt --output $M/th"
    echo "preprocess|$M/pp|$PRE --input $T/s.jsonl --output-prefix $M/pp --tokenizer-type CharLevelTokenizer"
    echo "eval results|$M/ev|$EVAL -q $T/model.yml $T/load_ok.yml --results-prefix $M/ev"
}
# Nothing but empty directories (a save directory made before the disk filled up).
nothing_left() { [ -z "$(find "$M" -mindepth 1 -not -name filler \( -not -type d -o -name '*.tmp.*' -o -name 'global_step*' \))" ]; }
while IFS='|' read -r name out cmd; do
    # The eval results file is small: the disk is filled up to less than it needs.
    rm -f "$M/filler"
    [ "$name" = "eval results" ] && head -c $((120 * 1024 - results_bytes / 2)) /dev/zero >"$M/filler" 2>/dev/null
    refused "disk full: $name fails naming the output and the cause" "$out.*[Nn]o space left on device" $cmd
    check "disk full: $name leaves no temporary and nothing complete-looking" nothing_left
    find "$M" -mindepth 1 -not -name filler -delete
done < <(writers)
rm -f "$M/filler"
mount -o remount,ro "$M"
while IFS='|' read -r name out cmd; do
    refused "read-only output: $name fails naming the output" "$out.*Read-only file system" $cmd
done < <(writers)
umount "$M"
