// files.c: directory creation and the wall clock shared by the metrics writers.
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "metrics.h"
#include "metrics/internal.h"

int neox_mkdirs(const char *dir, neox_error *err) {
    char *path = neox_strdup(dir);
    int rc = 0;
    // Create each prefix in turn; existing ones are fine, so concurrent creators do not race.
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0') continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            rc = neox_fail(err, NEOX_EXIT_FAILURE, "cannot create directory %s: %s", path, strerror(errno));
            break;
        }
        *p = saved;
        if (saved == '\0') break;
    }
    struct stat st;
    if (rc == 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a directory", dir);
    free(path);
    return rc;
}

double neox_wall_time(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
