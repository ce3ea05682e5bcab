// launcher.c: the rank and world size that mpiexec (PMI), Open MPI or SLURM announce in the
// environment, readable before MPI is initialised — for --print-config and early log tagging.
#include "core.h"

#include <stdlib.h>

static int env_int(const char *const *names, int fallback) {
    for (int i = 0; names[i]; i++) {
        const char *v = getenv(names[i]);
        char *end;
        if (!v || !*v) continue;
        long n = strtol(v, &end, 10);
        if (!*end && n >= 0 && n < (1L << 24)) return (int)n;
    }
    return fallback;
}

int neox_launcher_world_size(void) {
    static const char *const names[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", NULL};
    int n = env_int(names, 1);
    return n > 0 ? n : 1;
}

int neox_launcher_rank(void) {
    static const char *const names[] = {"PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", NULL};
    return env_int(names, 0);
}

void neox_log_from_launcher(void) { neox_log_set_rank(neox_launcher_rank(), neox_launcher_world_size()); }
