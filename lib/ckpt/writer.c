// writer.c: writes one HDF5 shard file of a layout-free checkpoint (see ckpt.h). Each piece of a
// tensor is one dataset with attributes: "neox_piece" ("block", "range" or "bytes"),
// "global_shape" and either "offset" (block) or "range_start" (range). HDF5 creates the file in a
// private temporary directory (lib/core/atomic_file.c); it is renamed into place only once closed
// and synced. The CRC-32 of each dataset's raw bytes is taken from memory as it is written, so closing can give the file's manifest entry
// without reading the data back (shard_crc.c).
#include "ckpt.h"
#include "ckpt/hdf5_util.h"
#include "ckpt/shard_crc.h"

#include <fcntl.h>
#include <hdf5.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// ---- writer -----------------------------------------------------------------------------------

struct neox_ckpt_writer {
    hid_t file;
    hid_t link_props;  // creates intermediate groups for '/'-separated names
    char *path, *tmp_path;
    neox_crc_extents extents;  // where each dataset's raw bytes lie, with their CRC-32
    int extents_unknown;       // a dataset without a contiguous address: read the whole file
    int fd;                    // HDF5's descriptor of the file (sec2 driver), -1 if not known
};

// HDF5 creates the file by name, exclusively, inside a private temporary directory (only this
// user may enter it, so nothing can be planted at the name before HDF5 opens it).
neox_ckpt_writer *neox_ckpt_writer_open(const char *path, neox_error *err) {
    neox_hdf5_quiet();
    char msg[256], *tmp;
    if (neox_private_temp_create(path, &tmp, err) != 0) return NULL;
    hid_t file = H5Fcreate(tmp, H5F_ACC_EXCL, H5P_DEFAULT, H5P_DEFAULT);
    if (file < 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot create checkpoint shard: %s", path, neox_hdf5_error(msg));
        neox_private_temp_remove(tmp);
        free(tmp);
        return NULL;
    }
    neox_ckpt_writer *w = neox_calloc(1, sizeof *w);
    w->file = file;
    w->link_props = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(w->link_props, 1);
    w->path = neox_strdup(path);
    w->tmp_path = tmp;
    int *handle = NULL;
    w->fd = H5Fget_vfd_handle(file, H5P_DEFAULT, (void **)&handle) >= 0 && handle ? *handle : -1;
    return w;
}

static int write_attr_i64(hid_t obj, const char *name, const int64_t *values, int n) {
    hsize_t dims = (hsize_t)n;
    hid_t space = n > 0 ? H5Screate_simple(1, &dims, NULL) : H5Screate(H5S_NULL);
    hid_t attr = H5Acreate2(obj, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : (n > 0 ? H5Awrite(attr, H5T_NATIVE_INT64, values) : 0);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return rc < 0 ? -1 : 0;
}

static int write_attr_str(hid_t obj, const char *name, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1);
    H5Tset_size(type, strlen(value) + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(type);
    return rc < 0 ? -1 : 0;
}

static int check_shape(const char *name, int ndim, const int64_t *shape, neox_error *err) {
    if (ndim < 0 || ndim > NEOX_CKPT_MAX_DIMS)
        return neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': %d dimensions (at most %d)", name, ndim,
                         NEOX_CKPT_MAX_DIMS);
    for (int d = 0; d < ndim; d++)
        if (shape[d] < 0) return neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': negative dimension", name);
    return 0;
}

static int64_t element_count(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

// Records where the dataset's bytes lie in the file. The datasets are contiguous and stored in
// the native type they are written in, so the file holds exactly the bytes of `data` there.
static void note_extent(neox_ckpt_writer *w, hid_t dset, const void *data, uint64_t bytes) {
    if (bytes == 0) return;
    haddr_t addr = H5Dget_offset(dset);
    if (addr == HADDR_UNDEF) {
        w->extents_unknown = 1;
        return;
    }
    neox_crc_extents_add(&w->extents, (uint64_t)addr, data, bytes);
#ifdef SYNC_FILE_RANGE_WRITE
    // Start writing a large dataset to disk now, without waiting: the disk then works while the
    // next tensors are produced, and the fsync before the rename waits only for what is left.
    if (w->fd >= 0 && bytes >= (1u << 20)) sync_file_range(w->fd, (off_t)addr, (off_t)bytes, SYNC_FILE_RANGE_WRITE);
#endif
}

// Creates one dataset of `type` holding data with the given HDF5 dimensions and tags it.
static hid_t write_dataset(neox_ckpt_writer *w, const char *name, hid_t type, int rank, const hsize_t *dims,
                           const void *data, const char *kind, neox_error *err) {
    char msg[256];
    hid_t space = H5Screate_simple(rank, dims, NULL);
    hid_t dset = H5Dcreate2(w->file, name, type, space, w->link_props, H5P_DEFAULT, H5P_DEFAULT);
    if (dset < 0 || H5Dwrite(dset, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) < 0 ||
        write_attr_str(dset, "neox_piece", kind) < 0) {
        neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot write '%s': %s", w->path, name, neox_hdf5_error(msg));
        if (dset >= 0) H5Dclose(dset);
        dset = -1;
    } else {
        note_extent(w, dset, data, (uint64_t)H5Sget_simple_extent_npoints(space) * H5Tget_size(type));
    }
    H5Sclose(space);
    return dset;
}

int neox_ckpt_write_block(neox_ckpt_writer *w, const char *name, int ndim, const int64_t *global_shape,
                          const int64_t *offset, const int64_t *count, const float *data, neox_error *err) {
    if (check_shape(name, ndim, global_shape, err) < 0) return -1;
    for (int d = 0; d < ndim; d++)
        if (offset[d] < 0 || count[d] < 0 || offset[d] + count[d] > global_shape[d])
            return neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': block outside the tensor in dimension %d", name, d);
    hsize_t dims[NEOX_CKPT_MAX_DIMS] = {1};
    for (int d = 0; d < ndim; d++) dims[d] = (hsize_t)count[d];
    hid_t dset = write_dataset(w, name, H5T_NATIVE_FLOAT, ndim ? ndim : 1, dims, data, "block", err);
    if (dset < 0) return -1;
    int rc = write_attr_i64(dset, "global_shape", global_shape, ndim) | write_attr_i64(dset, "offset", offset, ndim);
    H5Dclose(dset);
    return rc ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot write attributes of '%s'", w->path, name) : 0;
}

int neox_ckpt_write_range(neox_ckpt_writer *w, const char *name, int ndim, const int64_t *global_shape, int64_t start,
                          int64_t n, const float *data, neox_error *err) {
    if (check_shape(name, ndim, global_shape, err) < 0) return -1;
    if (start < 0 || n < 0 || start + n > element_count(ndim, global_shape))
        return neox_fail(err, NEOX_EXIT_FAILURE, "tensor '%s': range [%lld, %lld) outside the tensor", name,
                         (long long)start, (long long)(start + n));
    hsize_t dims = (hsize_t)n;
    hid_t dset = write_dataset(w, name, H5T_NATIVE_FLOAT, 1, &dims, data, "range", err);
    if (dset < 0) return -1;
    int rc = write_attr_i64(dset, "global_shape", global_shape, ndim) | write_attr_i64(dset, "range_start", &start, 1);
    H5Dclose(dset);
    return rc ? neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot write attributes of '%s'", w->path, name) : 0;
}

int neox_ckpt_write_bytes(neox_ckpt_writer *w, const char *name, const void *data, size_t size, neox_error *err) {
    hsize_t dims = (hsize_t)size;
    hid_t dset = write_dataset(w, name, H5T_NATIVE_UCHAR, 1, &dims, data, "bytes", err);
    if (dset < 0) return -1;
    H5Dclose(dset);
    return 0;
}

static void writer_free(neox_ckpt_writer *w) {
    neox_private_temp_remove(w->tmp_path);
    neox_crc_extents_free(&w->extents);
    free(w->path);
    free(w->tmp_path);
    free(w);
}

void neox_ckpt_writer_abort(neox_ckpt_writer *w) {
    if (!w) return;
    H5Pclose(w->link_props);
    H5Fclose(w->file);
    writer_free(w);
}

int neox_ckpt_writer_close(neox_ckpt_writer *w, neox_error *err) { return neox_ckpt_writer_close_entry(w, NULL, err); }

int neox_ckpt_writer_close_entry(neox_ckpt_writer *w, neox_ckpt_file_entry *entry, neox_error *err) {
    char msg[256];
    H5Pclose(w->link_props);
    int rc = 0;
    if (H5Fclose(w->file) < 0)
        rc = neox_fail(err, NEOX_EXIT_FAILURE, "%s: cannot close checkpoint shard: %s", w->path, neox_hdf5_error(msg));
    if (rc == 0 && entry)
        rc = w->extents_unknown ? neox_file_crc32(w->tmp_path, &entry->bytes, &entry->crc32, err)
                                : neox_crc_extents_file(&w->extents, w->tmp_path, entry, err);
    // HDF5 does not fsync; publishing syncs before the rename so the name never points at lost data.
    if (rc == 0) rc = neox_publish_file(w->tmp_path, w->path, err);
    writer_free(w);
    return rc;
}
