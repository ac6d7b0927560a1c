#pragma once
/*
 * A QEMU process on the shared launcher (launch.c): in the sandbox's cgroup,
 * as an unprivileged uid of its own, with no_new_privs and the sandbox
 * seccomp policy, its signal state reset and nothing of the daemon open but
 * the descriptors it is handed. Failures before QEMU runs come back from the
 * launcher's exec-status pipe, never as exit codes.
 */
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "driver/cgroup.h"
#include "driver/microvm-internal.h"

/* The VMM uid of sandbox `id` (MICROVM_UID_BASE + a hash). */
uint32_t microvm_uid_for(const char *id);

/* The QEMU binary, or NULL when none is installed. */
const char *microvm_qemu_binary(void);

/* A QEMU to start: no_new_privs, the sandbox seccomp policy, no
 * supplementary group but extra_gid, every descriptor closed but keep. */
typedef struct MicrovmSpawn {
        char **argv;     /* argv[0] is the binary */
        const int *keep; /* passed on at their own numbers */
        size_t n_keep;
        int log_fd;           /* stdout and stderr */
        const char *uid_name; /* microvm_uid_for(uid_name) is its uid and gid */
        gid_t extra_gid;      /* (gid_t)-1 for none: the group of /dev/kvm */
        const int *cgroup_fds; /* cgroup_open_procs of its cgroup, or NULL */
        size_t n_cgroup_fds;
} MicrovmSpawn;
int microvm_spawn_qemu(const MicrovmSpawn *sp, pid_t *ret_pid);

/* The VMM's cgroup for sandbox spec->id, created with the limits of a guest
 * of mem MiB and vcpu CPUs under accel (guest RAM plus QEMU's overhead). */
int microvm_vmm_cgroup(const DriverSpec *spec, MicrovmAccel accel, unsigned mem, unsigned vcpu, Cgroup **ret);
/* The VMM cgroup of spec->id as it is (a daemon taking a running VM
 * over): -ENOENT when there is none. */
int microvm_vmm_cgroup_open(const DriverSpec *spec, Cgroup **ret);
/* The pid a pidfd refers to (launch_pidfd_pid): -1 once it is gone. */
int microvm_pidfd_pid(int pidfd, pid_t *ret);
/* Kills whatever is left in the VMM cgroup of spec->id and removes it, from
 * the spec alone (after a daemon restart too). -ENOENT when there is none. */
int microvm_vmm_cgroup_kill(const DriverSpec *spec);
/* The launcher's checks of a spec (launch_spec_check): -EINVAL, -ENAMETOOLONG. */
int microvm_spec_check(const DriverSpec *spec);
