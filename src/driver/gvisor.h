#pragma once
/*
 * What the gvisor driver's probe chose on this host, for `runtimed --doctor`.
 */

/* The runsc binary, its version and the platform the driver runs it with;
 * the strings live as long as the process. A negative errno when no runsc
 * works here (the driver's probe says why). */
int gvisor_runsc_info(const char **ret_path, const char **ret_version, const char **ret_platform);

/* The host cgroup's memory limit of a gVisor sandbox of memory_mib: room
 * above the sandbox's own for the Sentry, the gofer and what the agent's
 * memory watch lets through between two looks (docs/drivers.md). */
unsigned gvisor_host_memory_mib(unsigned memory_mib);
