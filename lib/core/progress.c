// progress.c: the progress bar of long work. Redrawn in place on a terminal, periodic plain lines
// in batch logs; always shows the rate, and the ETA when the total is known.
#include "core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct neox_progress {
    char label[64];
    char unit[32];
    double total;
    double started, last_print;
    double interval;  // seconds between prints
    int tty;
    int drew;         // a redrawable line is on the terminal
};

static int progress_enabled = 1;

void neox_progress_set_enabled(int enabled) { progress_enabled = enabled; }

neox_progress *neox_progress_start(const char *label, double total, const char *unit) {
    neox_progress *p = neox_calloc(1, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label ? label : "");
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->total = total;
    p->started = p->last_print = neox_now();
    p->tty = isatty(STDERR_FILENO);
    const char *env = getenv("NEOX_PROGRESS_SECONDS");
    double every = env ? atof(env) : 10.0;
    p->interval = p->tty ? 0.1 : (every > 0 ? every : 10.0);
    return p;
}

void neox_progress_set_total(neox_progress *p, double total) {
    if (p) p->total = total;
}

static void print_line(neox_progress *p, double done, const char *extra, int final) {
    double now = neox_now(), elapsed = now - p->started;
    double rate = elapsed > 0 ? done / elapsed : 0;
    char d[16], t[16], r[16], eta[16], el[16], line[512];
    int n = snprintf(line, sizeof line, "%s: %s", p->label, neox_format_count(done, d, sizeof d));
    if (p->total > 0)
        n += snprintf(line + n, sizeof line - n, "/%s %s (%.1f%%)", neox_format_count(p->total, t, sizeof t), p->unit,
                      100.0 * fmin(done / p->total, 1.0));
    else
        n += snprintf(line + n, sizeof line - n, " %s", p->unit);
    n += snprintf(line + n, sizeof line - n, ", %s %s/s", neox_format_count(rate, r, sizeof r), p->unit);
    if (extra && *extra) n += snprintf(line + n, sizeof line - n, ", %s", extra);
    if (final)
        snprintf(line + n, sizeof line - n, ", %s", neox_format_duration(elapsed, el, sizeof el));
    else if (p->total > 0 && rate > 0)
        snprintf(line + n, sizeof line - n, ", ETA %s", neox_format_duration((p->total - done) / rate, eta, sizeof eta));
    if (p->tty) fprintf(stderr, "\r\033[K%s%s", line, final ? "\n" : "");
    else fprintf(stderr, "%s\n", line);
    fflush(stderr);
    p->drew = p->tty && !final;
    p->last_print = now;
}

void neox_progress_update(neox_progress *p, double done, const char *extra) {
    if (!p || !progress_enabled) return;
    if (neox_now() - p->last_print < p->interval) return;
    print_line(p, done, extra, 0);
}

void neox_progress_finish(neox_progress *p, double done, const char *extra) {
    if (!p) return;
    if (progress_enabled) print_line(p, done, extra, 1);
    free(p);
}
