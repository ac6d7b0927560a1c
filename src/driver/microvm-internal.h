#pragma once
/*
 * The types and limits the files of the microVM driver share (microvm.h has
 * the map of those files). Every file of the driver includes this header
 * and the headers of the files it calls; none includes microvm.h.
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

/* The image whose microvm/ parts (kernel, root disk, modules, templates)
 * boot the spec's sandbox: its own, or for a registry's tree the built-in
 * image the daemon names (microvm_layers.h). */
static inline const char *microvm_boot_dir(const DriverSpec *spec) {
        return spec->boot_image_dir ? spec->boot_image_dir : spec->image_dir;
}

/* Everything a start needs that does not depend on the way it starts. */
typedef struct MicrovmStart {
        const DriverSpec *spec;
        const char *qemu;
        MicrovmAccel accel;
        unsigned vcpu, mem, disk, pids;
        int log_fd; /* sandbox_dir/vmm.log */
        const char *p_kernel, *p_root, *p_modules, *p_console;
        /* The spec's volumes become disks of this start (a boot, never a
         * template's or a snapshot's guest, whose devices are fixed). */
        bool volumes;
} MicrovmStart;

/* Every guest's empty disk slots, a volume put in one while it runs
 * (microvm_slots.h): MICROVM_SLOTS_RW writable ones, then as many
 * read-only ones (a device's read-only bit is fixed at its start). Slot j's
 * block node is "slot<j>", its empty medium "slotnull<j>", its virtio serial
 * 16 hex digits (the agent's live name): MICROVM_SLOT_SERIAL_FMT of j. */
#define MICROVM_SLOTS_RW DRIVER_MAX_MOUNTS
#define MICROVM_SLOTS (2 * MICROVM_SLOTS_RW)
#define MICROVM_SLOT_SERIAL_FMT "00000000000000%02x"

/* Virtio serial of the disk of a sandbox's volume i ("vol0".."vol3"). */
#define MICROVM_VOLUME_SERIAL "vol"
/* The initramfs's list of the volumes for the agent: one line each,
 * "<serial> <ro|rw> <path>" (the path is the daemon's, checked: absolute,
 * normalized, no spaces or newlines). */
#define MICROVM_VOLUMES_FILE "volumes"

