# tests/lib.sh: helpers for the shell test suites (tool, MPI, SLURM tests). Each check prints one
# TAP line ("ok - name", "not ok - name", "ok - name # SKIP reason"); tests/run counts them.
# Source it from a test script; paths are relative to the repository root (tests/run cds there).

NEOX_BIN=${NEOX_BIN:-build/cpu/bin}
SHARED=${SHARED:-../shared}
DATA=$SHARED/data
CONFIGS=$SHARED/reference/gpt-neox-configs
TEST_TMP=$(mktemp -d "${TMPDIR:-/tmp}/neox-test.XXXXXX")
trap 'rm -rf "$TEST_TMP"' EXIT

# The names every script uses for the tools, the scratch directory and the oracles' Python.
TRAIN=$NEOX_BIN/neox-train
EVAL=$NEOX_BIN/neox-eval
CONVERT=$NEOX_BIN/neox-convert
LIB="python3 tests/tools/train_lib.py"
T=$TEST_TMP
PY=.venv/bin/python
MPIEXEC=${MPIEXEC:-mpiexec.mpich}

# The last command's output, for messages on failure.
_last_out=$TEST_TMP/.last_out

_report() {  # _report STATUS NAME [DETAIL FILE]
    if [ "$1" = 0 ]; then echo "ok - $2"; else
        echo "not ok - $2"
        [ -n "${3:-}" ] && [ -s "$3" ] && sed 's/^/#   /' "$3" | head -n 40
    fi
}

# check NAME CMD...: passes when CMD exits 0.
check() {
    local name=$1; shift
    "$@" >"$_last_out" 2>&1
    _report $? "$name" "$_last_out"
}

# check_fails NAME STATUS PATTERN CMD...: passes when CMD exits with STATUS and its stderr
# matches the extended regular expression PATTERN.
check_fails() {
    local name=$1 want=$2 pattern=$3; shift 3
    "$@" >"$TEST_TMP/.stdout" 2>"$_last_out"
    local got=$?
    if [ "$got" != "$want" ]; then
        echo "exit status $got, expected $want" >>"$_last_out"; _report 1 "$name" "$_last_out"
    elif ! grep -qE -- "$pattern" "$_last_out"; then
        echo "stderr does not match: $pattern" >>"$_last_out"; _report 1 "$name" "$_last_out"
    else _report 0 "$name"; fi
}

# check_output NAME PATTERN CMD...: passes when CMD exits 0 and stdout matches PATTERN.
check_output() {
    local name=$1 pattern=$2; shift 2
    "$@" >"$_last_out" 2>"$TEST_TMP/.stderr"
    local got=$?
    if [ "$got" != 0 ]; then cat "$TEST_TMP/.stderr" >>"$_last_out"; echo "exit status $got" >>"$_last_out"; _report 1 "$name" "$_last_out"
    elif ! grep -qE -- "$pattern" "$_last_out"; then echo "stdout does not match: $pattern" >>"$_last_out"; _report 1 "$name" "$_last_out"
    else _report 0 "$name"; fi
}

skip() { echo "ok - $1 # SKIP $2"; }

# mount_tmpfs DIR SIZE WHAT: a tmpfs of SIZE at DIR, unmounted at exit (full disks, read-only
# directories); where mounting is not allowed, WHAT is reported skipped and the status is 1.
mount_tmpfs() {
    mkdir -p "$1"
    if ! mount -t tmpfs -o size="$2" tmpfs "$1" 2>"$_last_out"; then
        skip "$3" "cannot mount a tmpfs here: $(head -c 200 "$_last_out")"
        return 1
    fi
    trap "umount '$1' 2>/dev/null; rm -rf '$TEST_TMP'" EXIT
}

# char_shakespeare NAME: Tiny Shakespeare as one jsonl document per paragraph, preprocessed with the
# character-level tokenizer into $TEST_TMP/char_text_document; false (with a skip line for NAME)
# when ../shared/data or the text is absent.
char_shakespeare() {
    need_shared "$1" || return 1
    [ -f "$DATA/text/tinyshakespeare_input.txt" ] || { skip "$1" "no Tiny Shakespeare in $DATA/text"; return 1; }
    python3 tests/tools/train_lib.py paragraphs "$DATA/text/tinyshakespeare_input.txt" "$TEST_TMP/shakespeare.jsonl"
    check "preprocess Tiny Shakespeare (char-level)" "$NEOX_BIN/neox-preprocess" --input "$TEST_TMP/shakespeare.jsonl" \
        --output-prefix "$TEST_TMP/char" --tokenizer-type CharLevelTokenizer --append-eod
}

# check_cached_generation CONFIG...: neox-eval generate continues two prompts by 40 tokens with the
# KV cache and recomputing every step; the texts must be equal and not empty.
check_cached_generation() {
    printf 'ROMEO:\nFirst Citizen:\n' >"$TEST_TMP/prompts.txt"
    local mode
    for mode in cached recomputed; do
        check "generate ($mode)" "$NEOX_BIN/neox-eval" generate -q --text-gen-type input-file \
            --sample-input-file "$TEST_TMP/prompts.txt" --sample-output-file "$TEST_TMP/$mode.jsonl" \
            --maximum-tokens 40 $([ $mode = recomputed ] && echo --recompute) "$@"
    done
    check "the KV cache gives the recomputed text" python3 - "$TEST_TMP/cached.jsonl" "$TEST_TMP/recomputed.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l)["text"] for l in open(p)] for p in sys.argv[1:])
print(a)
assert a == b and len(a) == 2 and all(len(t) > 0 for t in a)
PY
}

# need_shared NAME: true when ../shared/data exists; otherwise prints a skip line for NAME.
need_shared() {
    if [ -d "$DATA" ]; then return 0; fi
    skip "$1" "$DATA is absent"
    return 1
}

# need_mpi NAME: true when mpiexec and the oracles' .venv are there; otherwise a skip line for NAME.
need_mpi() {
    command -v "$MPIEXEC" >/dev/null || { skip "$1" "$MPIEXEC is not installed"; return 1; }
    [ -x "$PY" ] || { skip "$1" ".venv is missing (make deps)"; return 1; }
}

# words_dataset DOCS SEED: the multi-rank tests' corpus, DOCS documents of words drawn with SEED
# (tests/mpi/words_corpus.py), preprocessed char-level into $T/docs_text_document.
words_dataset() {
    python3 tests/mpi/words_corpus.py "$TEST_TMP/docs.jsonl" "$1" "$2"
    check "preprocess" "$NEOX_BIN/neox-preprocess" --input "$TEST_TMP/docs.jsonl" --output-prefix "$TEST_TMP/docs" \
        --tokenizer-type CharLevelTokenizer --append-eod
}

# check_resume_and_emulated [JSON]: with the calling script's `run NAME JSON` (trains model.yml + JSON,
# logs in $T/NAME) and its 30-step run `straight`: a run stopped at 15 and resumed to 30 equals the
# straight run bit for bit, and so does the emulated device backend. JSON adds the model's keys.
check_resume_and_emulated() {
    check "stop at 15" run resumed "$1, \"save\": \"$T/ckpt2\", \"exit_interval\": 15"
    check "resume to 30" run resumed "$1, \"save\": \"$T/ckpt2\", \"load\": \"$T/ckpt2\""
    check "resumed run equals the straight one bit for bit" $LIB same "$T/straight/metrics.jsonl" \
        "$T/resumed/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
    check "emulated device: 30 steps" run emulated "$1, \"compute_backend\": \"emulated\""
    check "emulated device: the CPU's losses bit for bit" $LIB same "$T/straight/metrics.jsonl" \
        "$T/emulated/metrics.jsonl" train/lm_loss,train/grad_norm,validation/lm_loss
}
