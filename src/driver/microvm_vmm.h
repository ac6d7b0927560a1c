#pragma once
/*
 * One QEMU process of the microVM driver: its command line, its start as an
 * unprivileged uid in the sandbox's cgroup on the shared launcher, the
 * thread that keeps its console and messages, and its end. A
 * DriverInstance of this driver is one such process.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "driver/microvm-internal.h"

/* One QEMU process of a start, the same devices whichever way it starts:
 * a cold boot, a template (monitor_fd: QMP) or a restore (incoming_fd: the
 * saved state). hostname goes on the kernel's command line. On success
 * *ret_fd is the host's end of the channel. */
int microvm_vm_start(const MicrovmStart *s, const char *hostname, int initrd_fd, const char *upper, int monitor_fd,
                     int incoming_fd, int *ret_fd, DriverInstance **ret);

/* Kills QEMU (and anything else in the cgroup), reaps it, ends the console
 * thread, removes the cgroup: the reason for Driver.stop ("exited",
 * "killed", "oom"), NULL when it was alive. Idempotent. */
const char *microvm_vm_stop(DriverInstance *inst);
/* microvm_vm_stop, then frees. NULL is a no-op. */
void microvm_vm_free(DriverInstance *inst);
const char *microvm_vm_sandbox_dir(const DriverInstance *inst);
bool microvm_vm_alive(DriverInstance *inst);
int microvm_vm_stats(DriverInstance *inst, DriverStats *ret);
/* Driver.pause/resume: QMP's stop (the guest's vCPUs stop; its memory,
 * devices and clock stay as they are) and cont, on the monitor the daemon
 * keeps. -EINVAL for a VM whose monitor another part holds. */
int microvm_vm_pause(DriverInstance *inst);
int microvm_vm_resume(DriverInstance *inst);
/* Saves the guest into state_fd (microvm_qmp_save) on the daemon's monitor;
 * a stopped guest stays stopped. */
int microvm_vm_save(DriverInstance *inst, int state_fd, int64_t deadline, char *why, size_t why_len);
/* A VM started from a saved state (incoming_fd): waits until the state is
 * loaded, then lets the guest run (a guest saved stopped stays so until
 * told). */
int microvm_vm_finish_incoming(DriverInstance *inst, int64_t deadline, char *why, size_t why_len);
/* What a memory snapshot keeps of the VM's start: the name on its kernel's
 * command line, a descriptor of its initramfs (-1 if none was kept), the
 * key of what its saved guest would depend on (NULL if unknown), its disk. */
const char *microvm_vm_hostname(const DriverInstance *inst);
int microvm_vm_initrd_fd(const DriverInstance *inst);
const char *microvm_vm_key(const DriverInstance *inst);
const char *microvm_vm_upper_path(const DriverInstance *inst);
