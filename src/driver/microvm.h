#pragma once
/*
 * The microVM driver (docs/microvm.md): every sandbox its own guest kernel
 * under QEMU's `microvm` machine, KVM where a guest really boots on it and
 * TCG (software emulation) where not. The Driver table is driver_microvm in
 * driver.h. The driver is split by concern, one header each:
 *
 *   microvm.c            the driver's operations (probe, start, stop, ...)
 *   microvm_kvm.c        whether KVM really runs a guest here
 *   microvm_spawn.c      QEMU on the shared launcher (launch.c): uid, seccomp, cgroup
 *   microvm_vmm.c        one QEMU process: command line, console, kill, stats
 *   microvm_disk.c       the sandbox's upper disk (mke2fs, sparse copies)
 *   microvm_initramfs.c  the initramfs of a start (the agent and modules)
 *   microvm_qmp.c        a client of QEMU's monitor protocol
 *   microvm_template.c   the cache of saved guests a first start restores
 *   microvm_snapshot.c   memory snapshots: a running guest saved with its disk, resumed by a copy
 *
 * This header has the types and limits those files share.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver/driver.h"

typedef enum MicrovmAccel {
        MICROVM_ACCEL_TCG,
        MICROVM_ACCEL_KVM,
} MicrovmAccel;

/* The virtio-serial port that carries the agent channel. */
#define MICROVM_CHANNEL_PORT "org.runtime.agent.0"
#define MICROVM_CHANNEL_PATH "/dev/virtio-ports/" MICROVM_CHANNEL_PORT

/* The uid QEMU runs as for sandbox `id`: one of MICROVM_UID_COUNT unprivileged
 * uids from MICROVM_UID_BASE, far above the image uid shift and any login
 * user, so that one VMM cannot signal or trace another's (see docs). */
#define MICROVM_UID_BASE 1500000000u
#define MICROVM_UID_COUNT 1000000u

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
