// version.h: the --version text every tool prints. It names the libraries the tools link, so it
// sits above every layer of lib/ (core stays free of them).
#ifndef NEOX_VERSION_H
#define NEOX_VERSION_H

#include <stdio.h>

// Tool name, neox.c version, the compiled backends and what they see, and the library versions.
void neox_print_version(FILE *out);

#endif
