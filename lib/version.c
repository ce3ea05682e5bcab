// version.c: the --version text of the tools: neox.c's version, the backends this build has, and
// the version of every library the tools link, read from the libraries themselves.
#include <hdf5.h>
#include <jansson.h>
#include <mpi.h>
#include <utf8proc.h>
#include <yaml.h>
#include <zip.h>
#include <zlib.h>
#include <zstd.h>

#include "core.h"
#include "kernels/kernels.h"
#include "version.h"

void neox_print_version(FILE *out) {
    unsigned h5maj, h5min, h5rel;
    H5get_libversion(&h5maj, &h5min, &h5rel);
    int mpi_major, mpi_minor;
    MPI_Get_version(&mpi_major, &mpi_minor);
    fprintf(out, "%s (neox.c) %s\n", neox_progname(), NEOX_VERSION);
    fprintf(out, "backends: %s\n", neox_backends_description());
    fprintf(out, "libraries: libyaml %s, jansson %s, utf8proc %s, zstd %s, zlib %s, libzip %s, HDF5 %u.%u.%u, MPI %d.%d (%s)\n",
            yaml_get_version_string(), JANSSON_VERSION, utf8proc_version(), ZSTD_versionString(), zlibVersion(),
            zip_libzip_version(), h5maj,
            h5min, h5rel, mpi_major, mpi_minor, MPICH_VERSION);
}
