#!/usr/bin/env bash
# bench/tokenizer_slice_coverage.sh: do the corpus slices of the tokenizer oracle tests
# (tests/oracle/tokenizer_corpus.py's representative_documents) reach every line and branch of
# lib/tokenizer that the whole of ../shared/data reaches? Builds neox-preprocess with gcc's --coverage
# from the committed tree in a scratch folder, encodes and decodes the whole corpus, then the slices,
# with the four GPT-2-family forms, and compares gcov's counts (bench/tokenizer_slice_coverage.py).
# Exit status 1 names what only the whole corpus reached. Minutes on 2 cores (the whole corpus).
# Usage: bench/tokenizer_slice_coverage.sh [WORK_DIR]   (default: a temporary folder, removed after)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
if [ $# -gt 0 ]; then
    work=$1
    mkdir -p "$work"
else  # a scratch folder of our own, removed on exit
    work=$(mktemp -d "${TMPDIR:-/tmp}/neox-slicecov.XXXXXX")
    trap 'rm -rf "$work"' EXIT
fi
mkdir -p "$work/src"
git archive HEAD | tar -x -C "$work/src"
ln -sfn "$repo/.deps" "$work/src/.deps"
make -C "$work/src" -j"$(nproc)" OPT="-O2 -g --coverage" build/cpu/bin/neox-preprocess >"$work/build.log"
for set in full representative; do
    find "$work/src/build" -name '*.gcda' -delete
    NEOX_BIN="$work/src/build/cpu/bin" .venv/bin/python bench/tokenizer_slice_coverage.py run "$set"
    rm -rf "$work/$set"; mkdir -p "$work/$set"
    (cd "$work/src" && gcov -j -b -o build/cpu/lib/tokenizer lib/tokenizer/*.c >/dev/null && mv ./*.gcov.json.gz "$work/$set/")
done
.venv/bin/python bench/tokenizer_slice_coverage.py compare "$work/full" "$work/representative"
