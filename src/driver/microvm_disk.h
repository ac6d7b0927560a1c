#pragma once
/*
 * The sandbox's own disk: an ext4 file of diskMiB (the upper layer of the
 * guest's overlay), made on the host with mke2fs before the guest has seen
 * it and never mounted by the host.
 */
#include <stdbool.h>

/* Makes path, a sparse file of disk_mib with an empty ext4, unless it exists
 * (a stopped sandbox starts again on its own files). mke2fs's output goes to
 * log_fd. */
int microvm_disk_make(const char *path, unsigned disk_mib, int log_fd);
/* Whether mke2fs is installed. */
bool microvm_disk_tool_found(void);
