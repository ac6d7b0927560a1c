#pragma once
#include <stdbool.h>

#include <stddef.h>

/* `runtimed --doctor [--json]`: what this host supports, printed to stdout,
 * state_dir's layer store included. Returns the exit status (0). */
int doctor_run(bool json, const char *state_dir);
/* How sandbox layers and snapshots under state_dir are copied: true where
 * its filesystem shares blocks (FICLONE), false where the copy is a sparse
 * one; why says which and on what, for the log and the doctor. */
bool doctor_layer_copies(const char *state_dir, char *why, size_t why_len);
