#pragma once
#include <stdbool.h>

/* `runtimed --doctor [--json]`: what this host supports, printed to stdout.
 * Returns the exit status (0). */
int doctor_run(bool json);
