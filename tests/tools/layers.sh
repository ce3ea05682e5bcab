# layers.sh: the layer rules of docs/design.md hold on the source tree (tests/tools/layers_check.py
# reads the #include lines and calls): each lib/ folder includes only the folders below it, nothing
# outside kernels/ sees a backend's own header, lib/core links no library, tools make no
# communication calls, and the tree speaks only of the project.
source tests/lib.sh

check "lib/ folders include only the folders below them" python3 tests/tools/layers_check.py includes
check "lib/ and tools/ reach the kernels only through kernels.h and backend.h" python3 tests/tools/layers_check.py kernels
check "lib/core includes no library header" python3 tests/tools/layers_check.py core
check "tools/ use only public headers and make no communication calls" python3 tests/tools/layers_check.py tools
check "no file speaks of how the project was made (issue numbers and the like)" python3 tests/tools/layers_check.py words

# The checker itself must see a violation: a copy of the tree's lib/core with a library header planted.
mkdir -p "$TEST_TMP/tree/lib/core" "$TEST_TMP/tree/tests/tools"
cp tests/tools/layers_check.py "$TEST_TMP/tree/tests/tools/"
printf '#include <mpi.h>\n' > "$TEST_TMP/tree/lib/core/planted.c"
check_output_fails() { ! "$@" >/dev/null; }
check "the core rule fails on a planted library include" check_output_fails python3 "$TEST_TMP/tree/tests/tools/layers_check.py" core
