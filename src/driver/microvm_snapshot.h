#pragma once
/*
 * Memory snapshots of a microVM: the running guest (its memory and devices,
 * saved by QEMU's migration to a file) with its disk as it stood at that
 * moment, and the start of a new sandbox that resumes it. A snapshot's
 * directory holds upper.ext4 (the disk, copied as it lay, its journal not
 * replayed), memory (QEMU's saved state), initrd.cpio (the initramfs the
 * guest started with, which its memory layout depends on) and machine (the
 * name on its kernel's command line and microvm_saved_guest_key's key).
 */
#include <stdbool.h>
#include <stddef.h>

#include "driver/microvm_vmm.h"

/* Saves the stopped VM inst into dest_dir (new, empty); it stays stopped.
 * why says what failed, for the daemon's log. */
int microvm_snapshot_save(DriverInstance *inst, const char *dest_dir, char *why, size_t why_len);
/* Whether a snapshot's directory holds a saved guest. */
bool microvm_snapshot_has_memory(const char *snap_dir);
/* A new sandbox from a memory snapshot: its saved guest linked into
 * sandbox_dir, so that its first start resumes it (the disk is the
 * caller's to copy). */
int microvm_snapshot_link(const char *snap_dir, const char *sandbox_dir);
/* Whether the next start of the sandbox resumes a saved guest. */
bool microvm_snapshot_pending(const char *sandbox_dir);
/* Removes a saved guest the sandbox has not resumed. */
void microvm_snapshot_forget(const char *sandbox_dir);
/* The start that resumes the saved guest on p_upper (its disk, restored
 * already): QEMU loads it, the guest runs on, and the agent's resume gives
 * it fresh entropy, the clock and the sandbox's name, and a channel whose
 * earlier streams are dropped. The saved files are consumed whatever
 * happens. On failure nothing runs and why says what failed. */
int microvm_snapshot_start(const MicrovmStart *s, const char *p_upper, int *ret_fd, DriverInstance **ret, char *why,
                           size_t why_len);
