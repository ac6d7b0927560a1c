#pragma once
/*
 * A volume given to a running microVM (docs/volumes.md, "Attaching to a
 * running sandbox"; docs/microvm.md, "Volumes"). QEMU's microvm machine
 * has its disks on virtio-mmio, which has no hotplug, so every guest starts
 * with MICROVM_SLOTS empty disks (microvm-internal.h): a null medium of no
 * size under a raw node per slot. An attach opens the volume's image in
 * QEMU (add-fd, a file node) and puts it under the slot's raw node in place
 * of the null medium (blockdev-reopen); the agent then probes the slot's
 * disk again, which reads its new size, and mounts it (agent/vm.h). A
 * detach, after the agent's unmount, puts the null medium back and closes
 * the image, which lets its lock go.
 *
 * Which slot holds which path is kept in sandbox_dir/slots ("<slot>
 * <driver_live_name of the path>" a line), so that a daemon that adopts the
 * running guest (live restore) knows it too; a start forgets it, the
 * volumes of the spec then being disks of the boot.
 */
#include "driver/microvm-internal.h"

int microvm_mount_live(DriverInstance *inst, const DriverSpec *spec, const DriverMount *m,
                       char name[DRIVER_LIVE_NAME_LEN + 1]);
int microvm_unmount_live(DriverInstance *inst, const DriverSpec *spec, const char *dest);
int microvm_live_held(DriverInstance *inst, const DriverSpec *spec, const char *dest);
/* At a start and a stop: no slot holds anything. */
void microvm_slots_forget(const char *sandbox_dir);
