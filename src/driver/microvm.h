#pragma once
/*
 * The microVM driver (docs/microvm.md): every sandbox its own guest kernel
 * under QEMU's `microvm` machine, KVM where a guest really boots on it and
 * TCG (software emulation) where not. The Driver table is driver_microvm in
 * driver.h; this header has what the daemon and the tests need beyond it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver/driver.h"

typedef enum MicrovmAccel {
        MICROVM_ACCEL_TCG,
        MICROVM_ACCEL_KVM,
} MicrovmAccel;

/* Decides, once per process, whether KVM really runs a guest: QEMU boots the
 * guest kernel `kernel` (or, when NULL or missing, a few bytes of firmware)
 * under KVM with a deadline, and KVM is used only when the guest got to the
 * end. `RUNTIME_MICROVM_ACCEL=kvm|tcg` in the environment forces the choice.
 * A firmware-only verdict of KVM is checked again with the first kernel seen.
 * Never fails: TCG is the answer when nothing better works. *why (may be
 * NULL) gets a one-line reason. */
MicrovmAccel microvm_accel(const char *kernel, char *why, size_t why_len);

/* The kernel command line of a sandbox: `id` names the guest host. Exported
 * for the tests. -ENOBUFS when it does not fit. */
int microvm_kernel_cmdline(const char *id, MicrovmAccel accel, unsigned pids_max, char *buf, size_t len);
unsigned microvm_host_tsc_khz(void);

/* The uid QEMU runs as for sandbox `id`: one of MICROVM_UID_COUNT unprivileged
 * uids from MICROVM_UID_BASE, far above the image uid shift and any login
 * user, so that one VMM cannot signal or trace another's (see docs). */
#define MICROVM_UID_BASE 1500000000u
#define MICROVM_UID_COUNT 1000000u
uint32_t microvm_uid_for(const char *id);

/* Host memory the QEMU process may use beyond the guest's RAM (its own code,
 * device state, and under TCG the translation cache): the cgroup's limit is
 * guest RAM plus this. */
#define MICROVM_OVERHEAD_MIB_KVM 96u
#define MICROVM_OVERHEAD_MIB_TCG 192u
/* The smallest guest that boots the cloud kernel and the default image. */
#define MICROVM_MIN_MEMORY_MIB 128u
#define MICROVM_MAX_VCPU 64u
/* Threads of one QEMU (vCPUs, I/O workers, RCU): the host pids limit of the
 * VMM's cgroup. The guest's own processes are not host tasks. */
#define MICROVM_PIDS_MAX 256u
/* Bytes of the guest's serial console kept in sandbox_dir/console.log: the
 * file is rewritten from its last CONSOLE_KEEP bytes when it reaches MAX. */
#define MICROVM_CONSOLE_MAX (1024u * 1024u)
#define MICROVM_CONSOLE_KEEP (64u * 1024u)

/* Writes the initramfs of one start to fd: /dev/console, the kernel modules
 * of `modules_dir` (its *.ko, in name order) and `agent` as /init. A newc cpio
 * archive. Exported for the tests. */
int microvm_write_initramfs(int fd, const char *modules_dir, const char *agent);
