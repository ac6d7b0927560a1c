#pragma once
#include "driver/driver.h"
/*
 * What the gvisor driver's probe chose on this host, for `runtimed --doctor`.
 */

/* The runsc binary, its version and the platform the driver runs it with;
 * the strings live as long as the process. A negative errno when no runsc
 * works here (the driver's probe says why). */
int gvisor_runsc_info(const char **ret_path, const char **ret_version, const char **ret_platform);

/* RLIMIT_NPROC inside a gVisor sandbox of memory_mib and pids_max (0: the
 * default): the pids limit, but below systrap's 4095 tasks per address
 * space, below what the host's pids.max holds of two host processes per
 * process, and at most one task per MiB, since every process also costs
 * host memory outside what gVisor counts (docs/drivers.md). */
unsigned gvisor_nproc(unsigned memory_mib, unsigned pids_max);

/* The host cgroup's memory limit of a gVisor sandbox: room above the
 * sandbox's own for the Sentry, the gofer, what the agent's memory watch
 * lets through between two looks, and the host cost of gvisor_nproc()
 * processes (docs/drivers.md). */
unsigned gvisor_host_memory_mib(unsigned memory_mib, unsigned pids_max);

/* gvisor_live.c: a volume brought to a running sandbox under its live
 * directory, and taken away (Driver.mount_live, unmount_live). */
int gvisor_mount_live(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                      char name[DRIVER_LIVE_NAME_LEN + 1]);
int gvisor_unmount_live(DriverInstance *inst, const DriverSpec *spec, const char *dest);
int gvisor_live_held(DriverInstance *inst, const DriverSpec *spec, const char *dest);
