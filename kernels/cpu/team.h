// team.h: the CPU backend's thread team for a decoding step (kernels/cpu/team.c; the contract is
// NEOX_BACKEND_TEAM's in kernels/backend.h).
#ifndef NEOX_CPU_TEAM_H
#define NEOX_CPU_TEAM_H

#include "kernels/kernels.h"

int neox_team_threads(void);
void neox_team_run(void (*body)(void *ctx, int thread, int threads), void *ctx);
void neox_team_barrier(void);
void neox_team_linear(float *out, const void *inp, const void *weight, const float *bias, int N, int IC, int OC,
                      neox_elem operands);

#endif
