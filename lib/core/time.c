// time.c: monotonic clock, accumulating timers and human-readable durations and counts.
#include "core.h"

#include <math.h>
#include <string.h>
#include <time.h>

double neox_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void neox_timer_reset(neox_timer *t) {
    t->started = -1.0;
    t->elapsed = 0.0;
    t->count = 0;
}

void neox_timer_start(neox_timer *t) { t->started = neox_now(); }

double neox_timer_stop(neox_timer *t) {
    if (t->started < 0) return 0.0;
    double dt = neox_now() - t->started;
    t->elapsed += dt;
    t->count++;
    t->started = -1.0;
    return dt;
}

double neox_timer_seconds(const neox_timer *t) {
    return t->elapsed + (t->started >= 0 ? neox_now() - t->started : 0.0);
}

const char *neox_format_duration(double s, char *buf, size_t size) {
    if (!isfinite(s) || s < 0) snprintf(buf, size, "?");
    else if (s < 60) snprintf(buf, size, "%.1fs", s);
    else if (s < 3600) snprintf(buf, size, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else if (s < 1e7) snprintf(buf, size, "%dh%02dm%02ds", (int)(s / 3600), (int)fmod(s / 60, 60), (int)fmod(s, 60));
    else snprintf(buf, size, "%.0fh", s / 3600);
    return buf;
}

const char *neox_format_count(double v, char *buf, size_t size) {
    static const char *suffix[] = {"", "k", "M", "G", "T", "P"};
    int i = 0;
    while (fabs(v) >= 1000 && i < 5) { v /= 1000; i++; }
    if (i == 0) snprintf(buf, size, "%.0f", v);
    else snprintf(buf, size, "%.*f%s", fabs(v) < 10 ? 2 : fabs(v) < 100 ? 1 : 0, v, suffix[i]);
    return buf;
}

const char *neox_format_bytes(double bytes, char *buf, size_t size) {
    neox_format_count(bytes, buf, size);
    size_t n = strlen(buf);
    if (n + 1 < size) buf[n] = 'B', buf[n + 1] = '\0';
    return buf;
}
