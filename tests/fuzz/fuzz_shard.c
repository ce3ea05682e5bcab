// fuzz_shard.c: checkpoint shard tags through the shard reader (lib/ckpt/reader.c). libhdf5's own
// parsing of damaged files is not what is tested here (manifest CRC-32s keep those away from it):
// the input describes the datasets of a well-formed HDF5 file, whose tags the fuzzer forges. One
// dataset a line:
//   <neox_piece> <name> [dims=D,...] [shape=S,...] [offset=O,...] [start=N]
// <neox_piece> is the string attribute (block, range, bytes or anything else), dims the dataset's
// extent, shape the global_shape attribute ("shape=" alone: a 0-dimensional one), offset a
// block's offset attribute and start a range's range_start. The file is written, opened through
// neox_ckpt_reader_open and every tensor in it read: whole, first and last elements, and as bytes.
#include <hdf5.h>

#include "ckpt.h"
#include "fuzz_util.h"

enum { MAX_ELEMENTS = 1 << 14 };

// Parses "v,v,..." into at most max values; returns the count.
static int parse_list(const char *s, int64_t *v, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        v[n++] = strtoll(s, &end, 10);
        if (*end != ',') break;
        s = end + 1;
    }
    return n;
}

static void put_i64_attr(hid_t dset, const char *name, const int64_t *v, int n) {
    hsize_t len = (hsize_t)n;
    hid_t space = n ? H5Screate_simple(1, &len, NULL) : H5Screate(H5S_NULL);
    hid_t attr = H5Acreate2(dset, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr >= 0) {
        if (n) H5Awrite(attr, H5T_NATIVE_INT64, v);
        H5Aclose(attr);
    }
    H5Sclose(space);
}

static void put_str_attr(hid_t dset, const char *name, const char *s) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(s) ? strlen(s) : 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(dset, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    if (attr >= 0) {
        H5Awrite(attr, type, s);
        H5Aclose(attr);
    }
    H5Sclose(space);
    H5Tclose(type);
}

// Writes the dataset one line describes (lines that HDF5 cannot hold are left out).
static void write_line(hid_t file, char *line) {
    char *kind = strtok(line, " "), *name = strtok(NULL, " ");
    if (!kind || !name || name[0] == '.') return;
    int64_t dims[8], shape[8], offset[8], start = 0;
    int ndims = 0, nshape = -1, noffset = -1, has_start = 0;
    for (char *tok; (tok = strtok(NULL, " "));) {
        if (!strncmp(tok, "dims=", 5)) ndims = parse_list(tok + 5, dims, 8);
        else if (!strncmp(tok, "shape=", 6)) nshape = parse_list(tok + 6, shape, 8);
        else if (!strncmp(tok, "offset=", 7)) noffset = parse_list(tok + 7, offset, 8);
        else if (!strncmp(tok, "start=", 6)) start = strtoll(tok + 6, NULL, 10), has_start = 1;
    }
    hsize_t hdims[8];
    int64_t elements = 1;
    for (int d = 0; d < ndims; d++) {
        if (dims[d] < 0 || dims[d] > MAX_ELEMENTS || (elements *= dims[d] ? dims[d] : 1) > MAX_ELEMENTS) return;
        hdims[d] = (hsize_t)dims[d];
    }
    int is_bytes = !strcmp(kind, "bytes");
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t space = ndims ? H5Screate_simple(ndims, hdims, NULL) : H5Screate(H5S_SCALAR);
    hid_t dset = H5Dcreate2(file, name, is_bytes ? H5T_NATIVE_UCHAR : H5T_NATIVE_FLOAT, space, lcpl, H5P_DEFAULT,
                            H5P_DEFAULT);
    H5Sclose(space);
    H5Pclose(lcpl);
    if (dset < 0) return;
    void *zeros = calloc((size_t)elements, sizeof(float));
    H5Dwrite(dset, is_bytes ? H5T_NATIVE_UCHAR : H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, zeros);
    free(zeros);
    put_str_attr(dset, "neox_piece", kind);
    if (nshape >= 0) put_i64_attr(dset, "global_shape", shape, nshape);
    if (noffset >= 0) put_i64_attr(dset, "offset", offset, noffset);
    if (has_start) put_i64_attr(dset, "range_start", &start, 1);
    H5Dclose(dset);
}

static void read_everything(const neox_ckpt_reader *r) {
    neox_error err = {0};
    for (int i = 0; i < neox_ckpt_tensor_count(r); i++) {
        const char *name = neox_ckpt_tensor_name(r, i);
        void *bytes;
        size_t nbytes;
        if (neox_ckpt_read_bytes(r, name, &bytes, &nbytes, &err) == 0) free(bytes);
        int ndim;
        int64_t shape[NEOX_CKPT_MAX_DIMS], numel = 1, zero[NEOX_CKPT_MAX_DIMS] = {0};
        if (neox_ckpt_tensor_shape(r, name, &ndim, shape, &err) != 0) continue;
        for (int d = 0; d < ndim; d++) numel = shape[d] && numel > INT64_MAX / shape[d] ? INT64_MAX : numel * shape[d];
        float *dst = calloc(MAX_ELEMENTS, sizeof *dst);
        if (numel <= MAX_ELEMENTS) {
            neox_ckpt_read_block(r, name, zero, shape, dst, &err);
            neox_ckpt_read_range(r, name, 0, numel, dst, &err);
        }
        if (numel > 0) {
            neox_ckpt_read_range(r, name, 0, 1, dst, &err);
            neox_ckpt_read_range(r, name, numel - 1, 1, dst, &err);
        }
        free(dst);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *path = fuzz_path("rank_00000.h5");
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t file = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) abort();
    char *text = neox_strndup((const char *)data, size);
    for (char *save, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) write_line(file, line);
    free(text);
    H5Fclose(file);
    neox_error err = {0};
    const char *paths[] = {path};
    neox_ckpt_reader *r = neox_ckpt_reader_open(paths, 1, &err);
    if (r) {
        read_everything(r);
        neox_ckpt_reader_close(r);
    }
    free(path);
    return 0;
}
