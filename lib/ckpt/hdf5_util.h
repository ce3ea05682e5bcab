// hdf5_util.h: private helpers of lib/ckpt for HDF5 errors.
#ifndef NEOX_CKPT_HDF5_UTIL_H
#define NEOX_CKPT_HDF5_UTIL_H

// Switches off HDF5's automatic error-stack printing (once per process).
void neox_hdf5_quiet(void);
// The innermost message of HDF5's current error stack, into buf (at least 256 bytes).
const char *neox_hdf5_error(char *buf);

#endif
