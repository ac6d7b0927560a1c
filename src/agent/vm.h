#pragma once
/*
 * The agent's extra duties as init of a microVM (docs/microvm.md).
 *
 * The guest kernel starts the agent twice. Stage 1: the agent is /init of the
 * initramfs the driver made for this start; it loads the virtio modules that
 * ship next to it, mounts the image's read-only ext4 (the virtio disk with
 * serial "root") under an overlay whose writable layer is the sandbox's own
 * ext4 (serial "upper"), copies itself to a read-only tmpfs at /.runtime,
 * switches root and executes /.runtime/agent with the same arguments.
 * Stage 2: the agent is PID 1 of the sandbox's root; it mounts the API
 * filesystems, brings up loopback and sets the hostname, and main then opens
 * the channel on the virtio-serial port instead of fds 0/1.
 */
#include <stdbool.h>

/* Name of the virtio-serial port that carries the channel (the driver sets
 * it on the port; the guest has no udev to make /dev/virtio-ports/ links). */
#define VM_CHANNEL_PORT "org.runtime.agent.0"
#define VM_CHANNEL_PATH "/dev/virtio-ports/" VM_CHANNEL_PORT
/* Serial numbers of the two virtio disks. */
#define VM_DISK_ROOT "root"
#define VM_DISK_UPPER "upper"
/* The driver's list of the sandbox's volumes in the initramfs, one line per
 * disk: "<serial> <ro|rw> <path>". Stage 1 keeps it at VM_VOLUMES_KEPT for
 * stage 2, which mounts each disk at its path (after its own mounts, so
 * that none hides a volume) and gives a writable one's root to
 * VM_SANDBOX_UID. */
#define VM_VOLUMES_FILE "/volumes"
#define VM_VOLUMES_KEPT "/.runtime/volumes"
#define VM_SANDBOX_UID 1000
/* Where stage 1 finds the kernel modules it loads, in name order. */
#define VM_MODULES_DIR "/lib/runtime-modules"

/* Run first by main when started with --vm, as PID 1. In stage 1 it does not
 * return on success (it executes argv[0]'s copy in the new root with argv).
 * In stage 2 it returns 0 when the sandbox's root is ready. On failure a
 * negative errno, and *ret_what names the step that failed. */
int vm_setup(char *const argv[], const char **ret_what);

/* Opens the channel device read-write, non-blocking, O_CLOEXEC. `path` is a
 * device path; a /dev/virtio-ports/NAME path that does not exist (no udev in
 * the guest) is resolved by the port's name in /sys/class/virtio-ports.
 * Waits up to timeout_ms for the port to appear. 0 and *ret_fd, or -errno. */
int vm_open_channel(const char *path, int timeout_ms, int *ret_fd);

/* A VM restored from a snapshot shares its memory, and so its kernel's RNG
 * state, clock and hostname, with the template and every other restore:
 * mixes the host's entropy into the kernel's pool and reseeds its CRNG at
 * once (RNDADDENTROPY + RNDRESEEDCRNG), sets CLOCK_REALTIME and the
 * hostname. 0 or -errno. */
struct AgentRequest;
int vm_resume(const struct AgentRequest *r);

/* A volume the host put in the empty disk slot whose virtio serial is
 * serial, while the guest runs (driver/microvm_slots.h): the slot's disk
 * probed again for its new size and mounted at dest (made where missing,
 * no symbolic link followed), idmapped as a boot's volume, its root the
 * sandbox user's unless read_only. vm_live_unmount takes the mount at
 * dest away again: -EBUSY while a file in it is open, -EINVAL when nothing
 * is mounted there. 0 or -errno. */
int vm_live_mount(const char *serial, const char *dest, bool read_only);
int vm_live_unmount(const char *dest);

/* Syncs the disks and powers the VM off; QEMU then exits. PID 1 must never
 * just exit (the kernel would panic). */
_Noreturn void vm_poweroff(void);

/* Whether this process is PID 1 on an initramfs (stage 1). Exported for the
 * tests. */
bool vm_in_initramfs(void);
