#pragma once
/*
 * Whether KVM really runs a guest on this host. On nested hypervisors
 * /dev/kvm may open and still hang every guest, so the answer comes from
 * booting one, not from the device's presence.
 */
#include <stddef.h>
#include <sys/types.h>

#include "driver/microvm-internal.h"

/* Decides, once per process, whether KVM really runs a guest: QEMU boots the
 * guest kernel `kernel` (or, when NULL or missing, a few bytes of firmware)
 * under KVM with a deadline, and KVM is used only when the guest got to the
 * end. `RUNTIME_MICROVM_ACCEL=kvm|tcg` in the environment forces the choice.
 * A firmware-only verdict of KVM is checked again with the first kernel seen.
 * Never fails: TCG is the answer when nothing better works. *why (may be
 * NULL) gets a one-line reason. */
MicrovmAccel microvm_accel(const char *kernel, char *why, size_t why_len);

/* The group that may open /dev/kvm (QEMU gets it as a supplementary group
 * under KVM), or (gid_t)-1 when the device is not group-accessible. */
gid_t microvm_kvm_group(void);
