// vector_math.h: lets GCC vectorise the loops of kernels/cpu/ that call expf, logf, erff and tanhf,
// by declaring the SIMD variants that glibc's libmvec provides (libm links it in). Loops marked
// `#pragma omp simd` then call 4 or 8 lanes at once instead of one scalar call per element.
// NEOX_CLONES below adds AVX-512 and AVX2 builds of a function beside the baseline one.
#ifndef NEOX_VECTOR_MATH_H
#define NEOX_VECTOR_MATH_H

#include <math.h>

#if defined(__x86_64__) && defined(__GLIBC__) && defined(_OPENMP)
#pragma omp declare simd notinbranch
float expf(float);
#pragma omp declare simd notinbranch
float logf(float);
#if __GLIBC_PREREQ(2, 35)
#pragma omp declare simd notinbranch
float erff(float);
#pragma omp declare simd notinbranch
float tanhf(float);
#endif
#endif

// Marks a hot loop function to be compiled three times, for x86-64-v4 (AVX-512F/BW/DQ/VL: 16
// lanes, libmvec's AVX-512 variants), x86-64-v3 (AVX2 + FMA: 8 lanes, libmvec's AVX2 variants) and
// the build's baseline, the best one this CPU runs picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define NEOX_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NEOX_CLONES
#endif

#endif
