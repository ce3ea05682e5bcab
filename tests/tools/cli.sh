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
