// fp8_casts.c: test driver for tests/oracle/test_fp8.py. Runs the CPU backend's FP8 ops on raw files:
//   fp8_casts cast e4m3|e5m2 SCALE IN.f32 OUT.u8   fp8(x * SCALE) of every float of IN (kernels.h's
//                                                  neox_fp8_cast); prints the amax it records
//   fp8_casts decode e4m3|e5m2 OUT.f32              the 256 codes widened to fp32 (neox_fp8_to_f32)
//   fp8_casts update e4m3|e5m2 LEN N MARGIN max|most_recent HIST.f32 SCALE.f32
//                                                  delayed scaling's update of N tensors (history LEN x N,
//                                                  row-major; scales N), both files rewritten in place
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "kernels/kernels.h"

static neox_fp8_format format_named(const char *s) {
    if (!strcmp(s, "e4m3")) return NEOX_FP8_E4M3;
    if (!strcmp(s, "e5m2")) return NEOX_FP8_E5M2;
    neox_die(2, "format '%s' is not e4m3 or e5m2", s);
}

static void *read_all(const char *path, size_t *bytes) {
    FILE *f = fopen(path, "rb");
    if (!f) neox_die(1, "%s: cannot open", path);
    fseek(f, 0, SEEK_END);
    *bytes = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    void *p = neox_malloc(*bytes ? *bytes : 1);
    if (fread(p, 1, *bytes, f) != *bytes) neox_die(1, "%s: short read", path);
    fclose(f);
    return p;
}

static void write_all(const char *path, const void *p, size_t bytes) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, bytes, f) != bytes || fclose(f) != 0) neox_die(1, "%s: cannot write", path);
}

int main(int argc, char **argv) {
    neox_set_progname(argv[0]);
    if (argc >= 6 && !strcmp(argv[1], "cast")) {
        float scale = strtof(argv[3], NULL), amax = 0.0f;
        size_t bytes;
        float *x = read_all(argv[4], &bytes);
        size_t n = bytes / sizeof(float);
        uint8_t *out = neox_malloc(n ? n : 1);
        neox_fp8_cast(out, &amax, x, n, &scale, format_named(argv[2]));
        write_all(argv[5], out, n);
        printf("%.9g\n", amax);
        return 0;
    }
    if (argc >= 4 && !strcmp(argv[1], "decode")) {
        float all[256];
        for (int c = 0; c < 256; c++) all[c] = neox_fp8_to_f32((uint8_t)c, format_named(argv[2]));
        write_all(argv[3], all, sizeof all);
        return 0;
    }
    if (argc >= 9 && !strcmp(argv[1], "update")) {
        int len = atoi(argv[3]), n = atoi(argv[4]), margin = atoi(argv[5]), algo_max = !strcmp(argv[6], "max");
        size_t hb, sb;
        float *hist = read_all(argv[7], &hb), *scale = read_all(argv[8], &sb);
        if (hb != (size_t)len * n * sizeof(float) || sb != (size_t)n * sizeof(float)) neox_die(1, "file sizes");
        float *inv = neox_malloc((size_t)n * sizeof(float));
        neox_fp8_update_scales(hist, scale, inv, len, n, n, format_named(argv[2]), margin, algo_max);
        write_all(argv[7], hist, hb);
        write_all(argv[8], scale, sb);
        return 0;
    }
    fprintf(stderr, "usage: fp8_casts cast|decode|update ... (see the file's header)\n");
    return 2;
}
