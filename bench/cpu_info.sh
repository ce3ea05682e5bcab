#!/usr/bin/env bash
# bench/cpu_info.sh: the line every benchmark prints first, naming the CPU the figures were measured
# on: its model name, x86 family and model numbers, whether it has AVX-512F and AVX512_BF16 (which
# select neox.c's and OpenBLAS's kernels), the core count and the load average at the start.
set -euo pipefail
field() { grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'; }
has() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -qx "$1" && echo yes || echo no; }
echo "# cpu: $(field 'model name'); family $(field 'cpu family') model $(field model);" \
     "avx512f $(has avx512f), avx512_bf16 $(has avx512_bf16); $(nproc) cores; load $(cut -d' ' -f1-3 /proc/loadavg)"
