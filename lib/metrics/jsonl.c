// jsonl.c: the metrics JSONL file — one JSON object per line, appended with a single write() so a
// crash leaves at most one partial last line, and fsync'ed when the caller asks (log intervals
// that are due, evaluations, checkpoints, the end of the run).
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "metrics.h"
#include "metrics/internal.h"

struct neox_jsonl {
    int fd;
    char *path;
};

neox_jsonl *neox_jsonl_open(const char *path, neox_error *err) {
    char *dir = neox_strdup(path);
    char *slash = strrchr(dir, '/');
    int rc = 0;
    if (slash && slash != dir) {
        *slash = '\0';
        rc = neox_mkdirs(dir, err);
    }
    free(dir);
    if (rc != 0) return NULL;
    int fd = neox_open_output(path, O_APPEND, err);
    if (fd < 0) return NULL;
    neox_jsonl *j = neox_calloc(1, sizeof *j);
    j->fd = fd;
    j->path = neox_strdup(path);
    return j;
}

int neox_jsonl_append(neox_jsonl *j, const json_t *obj, int sync, neox_error *err) {
    char *text = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!text) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot encode a metrics record", j->path);
    size_t len = strlen(text);
    char *line = neox_malloc(len + 1);
    memcpy(line, text, len);
    line[len] = '\n';
    free(text);
    size_t done = 0;
    while (done < len + 1) {
        ssize_t n = write(j->fd, line + done, len + 1 - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            free(line);
            return neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", j->path, strerror(errno));
        }
        done += (size_t)n;
    }
    free(line);
    return sync ? neox_jsonl_sync(j, err) : 0;
}

int neox_jsonl_sync(neox_jsonl *j, neox_error *err) {
    if (fsync(j->fd) != 0) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: fsync failed: %s", j->path, strerror(errno));
    return 0;
}

int neox_jsonl_close(neox_jsonl *j, neox_error *err) {
    if (!j) return 0;
    int rc = neox_jsonl_sync(j, err);
    if (close(j->fd) != 0 && rc == 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: close failed: %s", j->path, strerror(errno));
    free(j->path);
    free(j);
    return rc;
}

const char *neox_jsonl_path(const neox_jsonl *j) { return j->path; }

json_t *neox_json_number(double v) { return isfinite(v) ? json_real(v) : json_null(); }
