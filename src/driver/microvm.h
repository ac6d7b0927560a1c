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
 *   microvm_vmm.c        one QEMU process: command line, console, kill, stats, hand-over
 *   microvm_guest.c      what a guest is made of: its kernel command line, a saved guest's key
 *   microvm_disk.c       the sandbox's upper disk (mke2fs, sparse copies)
 *   microvm_layers.c     an upper disk made of another driver's layers (an image built here)
 *   microvm_initramfs.c  the initramfs of a start (the agent and modules)
 *   microvm_qmp.c        a client of QEMU's monitor protocol
 *   microvm_template.c   the cache of saved guests a first start restores
 *   microvm_snapshot.c   memory snapshots: a running guest saved with its disk, resumed by a copy
 *   microvm_slots.c      volumes given to a running guest in its empty disk slots
 *
 * microvm-internal.h has the types and limits those files share; they include
 * it, never this header, so that no file of the driver includes another's
 * header in a circle.
 */
#include "driver/microvm-internal.h"
