# layers.sh: the layer rules of docs/design.md hold on the source tree (tests/tools/layers_check.py
# reads the #include lines and calls): each lib/ folder includes only the folders below it, nothing
# outside kernels/ sees a backend's own header, lib/core links no library, tools make no
# communication calls, and the tree speaks only of the project.
source tests/lib.sh

check "lib/ folders include only the folders their row in docs/design.md names" python3 tests/tools/layers_check.py includes
check "lib/ and tools/ reach the kernels only through kernels.h and backend.h" python3 tests/tools/layers_check.py kernels
check "lib/core includes no library header but those docs/design.md names for it" python3 tests/tools/layers_check.py core
check "tools/ use only public headers and make no communication calls" python3 tests/tools/layers_check.py tools
check "no file speaks of how the project was made (issue numbers and the like)" python3 tests/tools/layers_check.py words

# The checker itself must see a violation: copies of the checker and of docs/design.md (where it reads
# its rules) in a scratch tree, with a violation planted in it.
plant() {  # plant FILE TEXT: a fresh scratch tree holding only FILE
    rm -rf "$TEST_TMP/tree"
    mkdir -p "$TEST_TMP/tree/tests/tools" "$TEST_TMP/tree/docs" "$TEST_TMP/tree/$(dirname "$1")"
    cp tests/tools/layers_check.py "$TEST_TMP/tree/tests/tools/"
    cp docs/design.md "$TEST_TMP/tree/docs/"
    printf '%s\n' "$2" > "$TEST_TMP/tree/$1"
}
check_output_fails() { ! "$@" >/dev/null; }
plant lib/core/planted.c '#include <mpi.h>'
check "the core rule fails on a planted library include" check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" core
plant lib/data/planted.c '#include "ckpt.h"'
check "the include rule fails when lib/data includes the shard format" \
    check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
plant lib/ckpt/planted.c '#include "model.h"'
check "the include rule fails when lib/ckpt includes the model" \
    check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
plant lib/ckpt.h '#include "model.h"'
check "the include rule checks a public header as its folder's (lib/ckpt.h may not include the model)" \
    check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
plant lib/checkpoint/planted.c '#include "ckpt.h"'
check "the include rule passes a call the table allows" python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
plant lib/extra/planted.c '#include "core.h"'
check "the include rule fails on a lib/ folder the table does not list" \
    check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
plant lib/core/planted.c '#include "core.h"'
sed -i 's/| core, config, tokenizer |$/| core, config, tokenizer, train |/' "$TEST_TMP/tree/docs/design.md"
check "the include rule fails on a table row that calls a row below it" \
    check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" includes
