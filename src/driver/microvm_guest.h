#pragma once
/*
 * What a guest is made of, whichever way it starts (a cold boot, a template,
 * a memory snapshot): the host's TSC rate it is told, its kernel command
 * line, and the key of a saved guest.
 */
#include <stddef.h>

#include "driver/microvm-internal.h"

/* The host's TSC rate in kHz, rounded to whole MHz; 0 when unknown. */
unsigned microvm_host_tsc_khz(void);

/* The kernel command line of a sandbox: `id` names the guest host.
 * -ENOBUFS when it does not fit. */
int microvm_kernel_cmdline(const char *id, MicrovmAccel accel, unsigned pids_max, char *buf, size_t len);

/* The description of everything a saved guest depends on (QEMU, kernel,
 * root, modules, agent, shape, accelerator, and under KVM the host's CPU):
 * a saved guest is restored only where it is the same. -ENOBUFS past len. */
int microvm_saved_guest_key(const MicrovmStart *s, char *buf, size_t len);
