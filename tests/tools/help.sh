#!/usr/bin/env bash
# help.sh: every tool's and every subcommand's --help exits 0 on stdout and names every option its
# parser accepts, in the help and in the usage line (tests/tools/help_check.py reads the option
# tables from tools/); an option a command does not take is refused, not ignored.
source tests/lib.sh

python3 tests/tools/help_check.py "$NEOX_BIN"
check_fails "decode refuses --threads (only encode cuts documents)" 2 "decode: unrecognized option '--threads'" \
    "$NEOX_BIN/neox-preprocess" decode --tokenizer-type CharLevelTokenizer --threads 2
