# cli.sh: the conventions every tool shares: --help, --version, usage errors and exit codes.
source tests/lib.sh

for tool in neox-preprocess neox-train neox-eval neox-convert; do
    bin=$NEOX_BIN/$tool
    check_output "$tool --help prints usage on stdout" "^Usage: $tool " "$bin" --help
    check_output "$tool -h is --help" "^Usage: $tool " "$bin" -h
    check_output "$tool --version names the tool and neox.c" "^$tool \(neox\.c\) [0-9]+\.[0-9]+\.[0-9]+$" "$bin" --version
    check_output "$tool --version lists backends" "^backends: cpu \(" "$bin" --version
    check_output "$tool --version lists library versions" "^libraries: libyaml .*HDF5 .*MPI " "$bin" --version
    check_fails "$tool rejects an unknown option with exit 2" 2 \
        "^$tool: error: unrecognized option '--no-such-option'\$" "$bin" --no-such-option
    check_fails "$tool points to --help after a usage error" 2 "^Try '$tool --help' for more information\.\$" \
        "$bin" --no-such-option
done
check_fails "neox-train without a config is a usage error" 2 "^neox-train: error: no config file given" \
    "$NEOX_BIN/neox-train"
check_fails "neox-preprocess with an unknown command is a usage error" 2 \
    "^neox-preprocess: error: unknown command 'frobnicate'" "$NEOX_BIN/neox-preprocess" frobnicate

# Numeric option values: every tool refuses a bad number the same way, naming the option and the range.
check_fails "neox-convert --tp 0 is refused (a layout needs at least one rank)" 2 \
    "^neox-convert: error: --tp: '0' is not an integer from 1 to " \
    "$NEOX_BIN/neox-convert" reshard --input x --output y --tp 0
check_fails "neox-convert --zero 4 is refused" 2 "^neox-convert: error: --zero: '4' is not an integer from 0 to 3" \
    "$NEOX_BIN/neox-convert" reshard --input x --output y --zero 4
check_fails "neox-preprocess --workers 2x is refused" 2 "^neox-preprocess: error: --workers: '2x' is not an integer from 1 to " \
    "$NEOX_BIN/neox-preprocess" --input x --output-prefix y --workers 2x
check_fails "neox-preprocess --seed above 2^32-1 is refused" 2 "error: --seed: '4294967296' is not an integer from 0 to 4294967295" \
    "$NEOX_BIN/neox-preprocess" index --seed 4294967296
check_fails "neox-train --world-size -1 is refused" 2 "^neox-train: error: --world-size: '-1' is not an integer from 1 to " \
    "$NEOX_BIN/neox-train" --world-size -1 --print-config x.yml
check_fails "neox-eval --limit -3 is refused" 2 "^neox-eval: error: --limit: '-3' is not an integer >= 0" \
    "$NEOX_BIN/neox-eval" --limit -3 x.yml
check_fails "neox-eval generate --temperature nan is refused" 2 "^neox-eval: error: --temperature: 'nan' is not a number >= 0" \
    "$NEOX_BIN/neox-eval" generate --temperature nan x.yml
