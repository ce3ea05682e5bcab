// split.c: the meaning of the `split` key ("949,50,1" or "1/3"): up to three non-negative weights
// for train, valid and test, as GPT-NeoX's data_utils.py reads them. Config checks the key with it
// when a config loads (so --print-config refuses a bad split); the data layer turns the weights into
// document ranges.
#include "config.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int neox_split_weights(const char *split, double weights[3], neox_error *err) {
    weights[0] = weights[1] = weights[2] = 0;
    char sep = strchr(split, ',') ? ',' : strchr(split, '/') ? '/' : 0;
    const char *p = split;
    int n = 0;
    for (;;) {
        char *end;
        double v = strtod(p, &end);
        while (*end == ' ') end++;
        if (end == p || (*end && *end != sep) || !isfinite(v) || v < 0)
            return neox_fail(err, NEOX_EXIT_USAGE, "split '%s': expected up to three numbers separated by ',' or '/'", split);
        if (n < 3) weights[n] = v;  // GPT-NeoX keeps the first three
        n++;
        if (!*end) break;
        p = end + 1;
    }
    if (!(weights[0] + weights[1] + weights[2] > 0))
        return neox_fail(err, NEOX_EXIT_USAGE, "split '%s': the parts add up to zero", split);
    return 0;
}
