# tests/fuzz/fuzz.sh: runs each fuzz target of `make fuzz` (build/fuzz/fuzz/fuzz_<target>) for a
# bounded time from its corpus in tests/fuzz/corpus/<target>/ (the seeds and every input that once
# crashed, kept as regression inputs); a crash, a sanitizer report, a leak, an exit from inside
# the library or an allocation above the memory limit fails the target's line.
#   bash tests/fuzz/fuzz.sh                    every target, 4 s each, seed 1, one run per core at once
#   NEOX_FUZZ_SECONDS=600 bash tests/fuzz/fuzz.sh npy shard    longer runs of some targets, random seed
# The default runs (make test, tests/run fuzz) use a fixed seed, so a run mutates the corpus the same
# way every time and a rare finding cannot fail an unrelated change; each run is a prefix of the same
# sequence (how far it gets depends on the machine's speed). Setting NEOX_FUZZ_SECONDS makes it a
# campaign with a random seed, which libFuzzer prints ("Seed: N"); NEOX_FUZZ_SEED=N fixes the seed
# of any run (to repeat a campaign's), NEOX_FUZZ_SEED=0 makes the default runs random too.
# New inputs found go to a scratch directory, not the repository (see docs/robustness.md to keep one).
source tests/lib.sh
FUZZ_BIN=${FUZZ_BIN:-build/fuzz/fuzz}
SECONDS_EACH=${NEOX_FUZZ_SECONDS:-4}
if [ -n "${NEOX_FUZZ_SECONDS:-}" ]; then SEED=${NEOX_FUZZ_SEED:-0}; else SEED=${NEOX_FUZZ_SEED:-1}; fi  # 0: random
targets=("$@")
[ ${#targets[@]} -eq 0 ] && for c in tests/fuzz/fuzz_*.c; do t=${c#tests/fuzz/fuzz_}; targets+=("${t%.c}"); done
# fuzz_one TARGET: one libFuzzer run; its exit status goes to $TEST_TMP/TARGET.status.
fuzz_one() {
    local t=$1 bin=$FUZZ_BIN/fuzz_$1
    mkdir -p "$TEST_TMP/$t/new" "$TEST_TMP/$t/tmp"
    # -rss_limit_mb also bounds single allocations: a small input asking for gigabytes is a failure.
    # The targets write their files under TMPDIR: one directory each, removed with TEST_TMP.
    TMPDIR=$TEST_TMP/$t/tmp ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
        "$bin" -seed="$SEED" -max_total_time="$SECONDS_EACH" -rss_limit_mb=1024 -timeout=10 -print_final_stats=1 \
        -artifact_prefix="$TEST_TMP/$t/" "$TEST_TMP/$t/new" "tests/fuzz/corpus/$t" >"$TEST_TMP/$t.log" 2>&1
    echo $? >"$TEST_TMP/$t.status"
}
# report_one TARGET: its TAP line, with the inputs that failed it.
report_one() {
    local t=$1 status runs seed
    status=$(cat "$TEST_TMP/$t.status")
    runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$TEST_TMP/$t.log" | grep -oE '[0-9]+$')
    seed=$(grep -oE 'Seed: [0-9]+' "$TEST_TMP/$t.log" | head -n 1 | grep -oE '[0-9]+$')
    _report "$status" "fuzz $t: ${runs:-0} inputs in ${SECONDS_EACH}s (seed ${seed:-$SEED}), no crash, leak or oversized allocation" \
        "$TEST_TMP/$t.log"
    if [ "$status" != 0 ]; then
        for a in "$TEST_TMP/$t"/crash-* "$TEST_TMP/$t"/leak-* "$TEST_TMP/$t"/oom-* "$TEST_TMP/$t"/timeout-*; do
            [ -f "$a" ] && { echo "#   input: $(basename "$a") (base64):"; base64 -w 100 "$a" | head -n 20 | sed 's/^/#   /'; }
        done
    fi
}
# A libFuzzer run is one thread for a fixed time: JOBS of them at once (one per core by default)
# take a JOBS-th of the wall time and run as many inputs each.
JOBS=${NEOX_FUZZ_JOBS:-$(nproc 2>/dev/null || echo 1)}
ready=()
for t in "${targets[@]}"; do
    if [ ! -x "$FUZZ_BIN/fuzz_$t" ]; then echo "not ok - fuzz $t: $FUZZ_BIN/fuzz_$t is missing (run 'make fuzz')"; continue; fi
    ready+=("$t")
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n; done
    fuzz_one "$t" &
done
wait
for t in "${ready[@]}"; do report_one "$t"; done
