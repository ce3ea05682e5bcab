// npy.c: reading and writing the .npy files GPT-NeoX caches its sample index in (format 1.0,
// little-endian integer arrays in C order), with the header numpy.save writes, so caches move
// between GPT-NeoX and neox.c in both directions.
#include "data.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

static size_t descr_size(const char *descr) {
    if (!strcmp(descr, "<i4") || !strcmp(descr, "<u4")) return 4;
    if (!strcmp(descr, "<i8") || !strcmp(descr, "<u8")) return 8;
    return 0;
}

// numpy.save's header: the dict with sorted keys, spare spaces so the first axis can grow to 21
// digits in place, padding to a multiple of 64 bytes, and a final newline.
static size_t format_header(char *out, size_t cap, const char *descr, int ndim, const int64_t *shape) {
    char shape_text[64];
    if (ndim == 1) snprintf(shape_text, sizeof shape_text, "(%" PRId64 ",)", shape[0]);
    else snprintf(shape_text, sizeof shape_text, "(%" PRId64 ", %" PRId64 ")", shape[0], shape[1]);
    char dict[256];
    int len = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape_text);
    char first[32];
    int digits = snprintf(first, sizeof first, "%" PRId64, shape[0]);
    for (int i = digits; i < 21 && len < (int)sizeof dict - 1; i++) dict[len++] = ' ';
    dict[len] = 0;
    size_t hlen = (size_t)len + 1;
    size_t pad = 64 - ((10 + hlen) % 64);
    if (pad == 64) pad = 0;
    size_t total = 10 + hlen + pad;
    if (total > cap) return 0;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    uint16_t header_len = (uint16_t)(hlen + pad);
    memcpy(out + 8, &header_len, 2);
    memcpy(out + 10, dict, (size_t)len);
    memset(out + 10 + len, ' ', pad);
    out[total - 1] = '\n';
    return total;
}

int neox_npy_write(const char *path, const char *descr, int ndim, const int64_t *shape, const void *data,
                   neox_error *err) {
    size_t esize = descr_size(descr);
    if (!esize || ndim < 1 || ndim > 2) return neox_fail(err, NEOX_EXIT_FAILURE, "%s: unsupported array type %s", path, descr);
    char header[512];
    size_t hsize = format_header(header, sizeof header, descr, ndim, shape);
    int64_t count = ndim == 1 ? shape[0] : shape[0] * shape[1];
    neox_atomic_file *af = neox_atomic_open(path, err);
    if (!af) return -1;
    size_t bytes = (size_t)count * esize;
    if (fwrite(header, 1, hsize, af->fp) != hsize || (bytes && fwrite(data, 1, bytes, af->fp) != bytes)) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: write failed: %s", af->path, strerror(errno));
        neox_atomic_abort(af);
        return -1;
    }
    return neox_atomic_commit(af, err);
}

// Finds "'key':" in the header dict and returns the text after it.
static const char *dict_value(const char *dict, const char *key) {
    char pattern[32];
    snprintf(pattern, sizeof pattern, "'%s':", key);
    const char *p = strstr(dict, pattern);
    if (!p) return NULL;
    p += strlen(pattern);
    while (*p == ' ') p++;
    return p;
}

static int parse_shape(const char *p, neox_npy *out) {
    if (*p++ != '(') return -1;
    out->ndim = 0;
    while (*p == ' ') p++;
    while (*p != ')') {
        if (out->ndim == 2) return -1;
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0) return -1;
        out->shape[out->ndim++] = v;
        p = end;
        while (*p == ' ' || *p == ',') p++;
    }
    return out->ndim >= 1 ? 0 : -1;
}

int neox_npy_read(const char *path, neox_npy *out, neox_error *err) {
    memset(out, 0, sizeof *out);
    size_t size;
    char *buf = neox_read_file(path, &size, err);
    if (!buf) return -1;
    uint16_t hlen = 0;
    if (size >= 10) memcpy(&hlen, buf + 8, 2);
    if (size < 10 || memcmp(buf, "\x93NUMPY\x01", 7) != 0 || 10 + (size_t)hlen > size) {
        free(buf);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: not a .npy file of format version 1", path);
    }
    char *dict = neox_strndup(buf + 10, hlen);
    const char *descr = dict_value(dict, "descr"), *order = dict_value(dict, "fortran_order"),
               *shape = dict_value(dict, "shape");
    int ok = descr && order && shape && descr[0] == '\'' && strncmp(order, "False", 5) == 0 && parse_shape(shape, out) == 0;
    if (ok) {
        snprintf(out->descr, sizeof out->descr, "%.3s", descr + 1);
        ok = descr_size(out->descr) != 0;
    }
    free(dict);
    if (!ok) {
        free(buf);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: unsupported .npy header (need a C-order <i4, <u4, <i8 or <u8 array)", path);
    }
    // The product is formed only once it cannot overflow (the file size bounds it far below that).
    int64_t count = out->ndim == 1 ? out->shape[0] : -1;
    size_t esize = descr_size(out->descr);
    if (out->ndim == 2 && (!out->shape[1] || out->shape[0] <= INT64_MAX / out->shape[1])) count = out->shape[0] * out->shape[1];
    if (count < 0 || (uint64_t)count > (size - 10 - hlen) / esize || (size - 10 - hlen) != (size_t)count * esize) {
        free(buf);
        return neox_fail(err, NEOX_EXIT_FAILURE, "%s: the file size does not match the array shape (truncated?)", path);
    }
    out->count = count;
    out->data = neox_malloc((size_t)count * esize + 1);
    memcpy(out->data, buf + 10 + hlen, (size_t)count * esize);
    free(buf);
    return 0;
}

int64_t *neox_npy_to_i64(const neox_npy *a) {
    int64_t *out = neox_malloc((size_t)a->count * sizeof *out + 1);
    for (int64_t i = 0; i < a->count; i++) {
        if (!strcmp(a->descr, "<i4")) out[i] = ((const int32_t *)a->data)[i];
        else if (!strcmp(a->descr, "<u4")) out[i] = ((const uint32_t *)a->data)[i];
        else out[i] = ((const int64_t *)a->data)[i];
    }
    return out;
}
