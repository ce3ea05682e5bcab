// cli.c: the command-line conventions every tool shares: usage errors (exit 2 with a pointer to
// --help) and checked numeric option values, so every tool refuses a bad number the same way.
#include "core.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>

_Noreturn void neox_usage_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    neox_vlog(NEOX_LOG_ERROR, fmt, ap);
    va_end(ap);
    fprintf(stderr, "Try '%s --help' for more information.\n", neox_progname());
    neox_exit(NEOX_EXIT_USAGE);
}

int64_t neox_option_int(const char *option, const char *text, int64_t min, int64_t max) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!errno && end != text && !*end && v >= min && v <= max) return (int64_t)v;
    if (max == INT64_MAX) neox_usage_error("%s: '%s' is not an integer >= %" PRId64, option, text, min);
    neox_usage_error("%s: '%s' is not an integer from %" PRId64 " to %" PRId64, option, text, min, max);
}

double neox_option_number(const char *option, const char *text, double min, double max) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!errno && end != text && !*end && isfinite(v) && v >= min && v <= max) return v;
    if (isinf(max)) neox_usage_error("%s: '%s' is not a number >= %g", option, text, min);
    neox_usage_error("%s: '%s' is not a number from %g to %g", option, text, min, max);
}
