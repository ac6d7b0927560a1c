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
 * "killed", "oom"), NULL when it was alive. Idempotent. A QEMU an earlier
 * daemon started is killed through its pidfd and not reaped (it is not our
 * child): having no wait status, it reads "exited" when it had ended before
 * the stop ("oom" as always). */
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
/* One QMP command (a JSON object and "\n") on the VM's monitor within
 * QMP's timeout; pass_fd (or -1) goes along. 0, or -EIO with QEMU's error
 * in why (microvm_qmp_exec). */
int microvm_vm_qmp(DriverInstance *inst, const char *cmd, int pass_fd, char *why, size_t why_len);
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

/*
 * Live restore (docs/lifecycle.md, docs/microvm.md): a running VM handed to
 * the sandbox's supervisor at one daemon's end and taken over by the next.
 * handles keeps MICROVM_VM_HANDLES descriptors (QEMU's pidfd, our end of its
 * monitor, the read ends of its console and of its stderr, its initramfs) and
 * a state "v=1,pid=N,qmp=1,accel=tcg|kvm,host=NAME,key=HEX|-": QEMU's pid,
 * that the monitor is negotiated, the accelerator, the name on the guest
 * kernel's command line, and FNV-1a 64 of the saved guest's key ("-": none),
 * which the key recomputed from the same files must match to be kept.
 */
#define MICROVM_VM_HANDLES 5
#define MICROVM_VM_STATE_VERSION 1
#define MICROVM_HOSTNAME_MAX 64

typedef struct MicrovmVmState {
        pid_t pid;
        bool qmp_ready;
        MicrovmAccel accel;
        char hostname[MICROVM_HOSTNAME_MAX + 1];
        bool has_key;
        uint64_t key_hash;
} MicrovmVmState;

/* Driver.handles of a VM: its monitor is negotiated first. -EOPNOTSUPP for
 * a VM that cannot be handed over (no monitor of ours, no pidfd). */
int microvm_vm_handles(DriverInstance *inst, int *fds, size_t *n, char *state, size_t state_len);
/* Parses a state handles wrote (an earlier daemon's: untrusted), strictly:
 * 0, or -EBADMSG. */
int microvm_vm_state_parse(const char *state, MicrovmVmState *ret);
/* The instance of a VM an earlier daemon started, from st and the
 * descriptors handles kept (taken over, also on failure). Checks that the
 * pidfd is still st->pid's, a QEMU running as the sandbox's VMM uid, that
 * the cgroup is there, and brings the monitor back in step; reopens
 * console.log (s->p_console) and takes s->log_fd (vmm.log) to append to.
 * key: the saved guest's key, or NULL when it cannot be known. -ESRCH when
 * QEMU is gone, -EBADMSG for descriptors or a process that are not such a
 * VM's. A failure leaves QEMU running. */
int microvm_vm_adopt(const MicrovmStart *s, const MicrovmVmState *st, const char *upper, const char *key, int *fds,
                     size_t n, DriverInstance **ret);
/* Driver.release: the console thread copies what waits and ends, our
 * descriptors close, the instance goes; QEMU and its cgroup stay. */
void microvm_vm_release(DriverInstance *inst);
