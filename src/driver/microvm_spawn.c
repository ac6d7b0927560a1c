#include "driver/microvm_spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <stdint.h>
#include <unistd.h>

#include "common/macro.h"
#include "driver/launch.h"
#include "driver/seccomp.h"

/* How long the cgroup's processes get to die. */
#define KILL_TIMEOUT_MS 5000

uint32_t microvm_uid_for(const char *id) {
        /* FNV-1a: stable across restarts, so a restarted daemon's reap finds
         * the same uid; uniqueness is the cgroup's job, this only keeps
         * VMMs of different sandboxes apart in the common case. */
        uint32_t h = 2166136261u;
        for (const char *p = id; *p; p++) {
                h ^= (uint8_t)*p;
                h *= 16777619u;
        }
        return MICROVM_UID_BASE + h % MICROVM_UID_COUNT;
}

int microvm_spawn_qemu(const MicrovmSpawn *sp, pid_t *ret_pid) {
        const uint8_t *prog;
        size_t len;
        int r = seccomp_policy_bpf(&prog, &len);
        if (r < 0)
                return r;
        struct sock_fprog fp = { .len = (unsigned short)(len / sizeof(struct sock_filter)),
                                 .filter = (struct sock_filter *)(uintptr_t)prog };
        _cleanup_close_ int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (devnull < 0)
                return -errno;
        uid_t uid = microvm_uid_for(sp->uid_name);
        const gid_t groups[] = { sp->extra_gid };
        static char *const env[] = { "PATH=/usr/bin:/bin", "LC_ALL=C", NULL };
        LaunchFds f = {
                .stdin_fd = devnull,
                .stdout_fd = sp->log_fd,
                .stderr_fd = sp->log_fd,
                .keep = sp->keep,
                .n_keep = sp->n_keep,
                .cgroup_fds = sp->cgroup_fds,
                .n_cgroup_fds = sp->cgroup_fds ? sp->n_cgroup_fds : 0,
                .set_ids = true,
                .uid = uid,
                .gid = uid,
                .groups = groups,
                .n_groups = sp->extra_gid == (gid_t)-1 ? 0 : 1,
                .seccomp = &fp,
        };
        return launch_spawn(sp->argv, env, &f, ret_pid);
}

int microvm_vmm_cgroup(const DriverSpec *spec, MicrovmAccel accel, unsigned mem, unsigned vcpu, Cgroup **ret) {
        const CgroupLayout *layout;
        int r = launch_cgroup_layout(&layout);
        if (r < 0)
                return r;
        Cgroup *cg;
        r = cgroup_new(layout, spec->cgroup_parent ? spec->cgroup_parent : "", spec->id, true, &cg);
        if (r < 0)
                return r;
        uint32_t overhead = accel == MICROVM_ACCEL_KVM ? MICROVM_OVERHEAD_MIB_KVM : MICROVM_OVERHEAD_MIB_TCG;
        CgroupLimits lim = {
                .memory_bytes = ((uint64_t)mem + overhead) * 1024 * 1024,
                .vcpu = vcpu,
                .pids_max = MICROVM_PIDS_MAX,
        };
        r = cgroup_set_limits(cg, &lim);
        if (r < 0) {
                (void)cgroup_remove(cg);
                cgroup_free(cg);
                return r;
        }
        *ret = cg;
        return 0;
}

int microvm_vmm_cgroup_open(const DriverSpec *spec, Cgroup **ret) {
        return launch_cgroup(spec, false, ret);
}

int microvm_pidfd_pid(int pidfd, pid_t *ret) {
        return launch_pidfd_pid(pidfd, ret);
}

int microvm_vmm_cgroup_kill(const DriverSpec *spec) {
        if (!spec || !spec->id || !cgroup_name_valid(spec->id, false) ||
            (spec->cgroup_parent && !cgroup_name_valid(spec->cgroup_parent, true)))
                return -EINVAL;
        Cgroup *cg = NULL;
        int r = launch_cgroup(spec, false, &cg);
        if (r >= 0) {
                r = cgroup_kill_all(cg, KILL_TIMEOUT_MS);
                int r2 = cgroup_remove(cg);
                if (r >= 0)
                        r = r2;
                cgroup_free(cg);
        }
        return r;
}

int microvm_spec_check(const DriverSpec *spec) {
        return launch_spec_check(spec);
}

const char *microvm_qemu_binary(void) {
        static const char *const candidates[] = { "/usr/bin/qemu-system-x86_64",
                                                  "/usr/local/bin/qemu-system-x86_64" };
        for (size_t i = 0; i < ELEMENTSOF(candidates); i++)
                if (access(candidates[i], X_OK) == 0)
                        return candidates[i];
        return NULL;
}
