// log.c: leveled messages on stderr, tagged with the MPI rank when several ranks run.
#include "core.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int log_rank = 0, log_world = 1;
static int log_threshold = -1;  // resolved from NEOX_LOG_LEVEL on first use

void neox_log_set_rank(int rank, int world_size) {
    log_rank = rank;
    log_world = world_size;
}

static int threshold(void) {
    if (log_threshold >= 0) return log_threshold;
    const char *env = getenv("NEOX_LOG_LEVEL");
    log_threshold = NEOX_LOG_INFO;
    if (env) {
        static const char *names[] = {"debug", "info", "notice", "warning", "error"};
        for (int i = 0; i < 5; i++)
            if (!strcasecmp(env, names[i])) log_threshold = i;
    }
    return log_threshold;
}

void neox_vlog(neox_log_level level, const char *fmt, va_list ap) {
    if ((int)level < threshold() && level != NEOX_LOG_ERROR) return;
    static const char *labels[] = {"debug: ", "", "notice: ", "warning: ", "error: "};
    char line[4096];
    int n = 0;
    if (log_world > 1) n = snprintf(line, sizeof line, "%s: [rank %d] %s", neox_progname(), log_rank, labels[level]);
    else n = snprintf(line, sizeof line, "%s: %s", neox_progname(), labels[level]);
    if (n < 0 || n >= (int)sizeof line) n = 0;
    vsnprintf(line + n, sizeof line - n, fmt, ap);
    // One fputs per message keeps lines from different threads whole.
    size_t len = strlen(line);
    if (len + 1 < sizeof line) { line[len] = '\n'; line[len + 1] = '\0'; }
    fputs(line, stderr);
    fflush(stderr);
}

void neox_log(neox_log_level level, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    neox_vlog(level, fmt, ap);
    va_end(ap);
}
