#pragma once
/*
 * Fast starts: a sandbox's first start restores a running guest saved once
 * per image, agent binary and shape (vcpu, memory, disk, accelerator)
 * instead of booting a kernel. The templates live in
 * IMAGE/microvm/templates/<hash of their key>/; docs/microvm.md has the why
 * and the measurements.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver/microvm_vmm.h"

/* Whether starts use templates (RUNTIME_MICROVM_SNAPSHOTS=0 turns them off). */
bool microvm_templates_enabled(void);

/* Starts the sandbox from its shape's template, making the template first
 * when there is none (in the sandbox's cgroup: the sandbox that needs it pays
 * for it): its disk p_upper a copy of the template's, its memory the saved
 * guest, then the agent's `resume`. On failure nothing runs and why says
 * what went wrong, for the sandbox's log: the caller boots instead. */
int microvm_template_start(const MicrovmStart *s, const char *p_upper, int *ret_fd, DriverInstance **ret, char *why,
                           size_t why_len);
