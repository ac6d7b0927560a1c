#include "daemon/caps.h"

#include <dirent.h>
#include <errno.h>
#include <linux/capability.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"

#define BIT(c) ((CapSet)1 << (c))

/* Who uses a capability. */
enum {
        USER_DAEMON = 1 << 0, /* runtimed itself and the programs it starts whatever the driver */
        USER_NAMESPACE = 1 << 1,
        USER_GVISOR = 1 << 2,
        USER_MICROVM = 1 << 3,
        USER_DRIVERS = USER_NAMESPACE | USER_GVISOR | USER_MICROVM,
};

/* The table of docs/drivers.md, "Capabilities": each row what it is kept
 * for. A capability in no row is dropped whatever the drivers. */
static const struct {
        unsigned cap;
        unsigned users;
} table[] = {
        /* Namespaces, mounts, pivot_root, loop devices (namespace); runsc's
         * sandbox and gofer (gvisor); disk images and templates (microvm);
         * mmdebstrap's mounts in the image's root (image builds). */
        { CAP_SYS_ADMIN, USER_DAEMON | USER_DRIVERS },
        /* The egress proxy becomes its own user; the launcher switches to a
         * sandbox's user; uid maps (namespace), runsc's user namespaces; apt
         * in image builds drops to _apt. The proxy and bwrap and runsc also
         * drop bounding sets (SETPCAP). */
        { CAP_SETUID, USER_DAEMON | USER_DRIVERS },
        { CAP_SETGID, USER_DAEMON | USER_DRIVERS },
        { CAP_SETPCAP, USER_DAEMON | USER_DRIVERS },
        /* chroot into a root: bubblewrap, runsc, mmdebstrap. */
        { CAP_SYS_CHROOT, USER_DAEMON | USER_NAMESPACE | USER_GVISOR },
        /* Roots, layers and images owned by sandboxes' uids; the state. */
        { CAP_CHOWN, USER_DAEMON | USER_DRIVERS },
        { CAP_FOWNER, USER_DAEMON | USER_DRIVERS },
        { CAP_FSETID, USER_DAEMON | USER_DRIVERS },
        { CAP_DAC_OVERRIDE, USER_DAEMON | USER_DRIVERS },
        { CAP_DAC_READ_SEARCH, USER_DAEMON | USER_DRIVERS },
        /* Signals to processes of other uids: the egress proxy, sandboxes. */
        { CAP_KILL, USER_DAEMON | USER_DRIVERS },
        /* lo in the sandbox's network namespace (bwrap, runsc). */
        { CAP_NET_ADMIN, USER_NAMESPACE | USER_GVISOR },
        /* runsc's network stack. */
        { CAP_NET_RAW, USER_GVISOR },
        /* runsc's platform traces the sandbox's threads; /proc of the
         * sandbox's processes (a namespace layer through /proc/PID/root,
         * QEMU as another user). */
        { CAP_SYS_PTRACE, USER_DRIVERS },
        /* rlimits and OOM scores of sandbox processes (oom_score_adj below
         * the parent's needs it); runsc's and QEMU's memory settings. */
        { CAP_SYS_RESOURCE, USER_DRIVERS },
        /* runsc's and QEMU's scheduling; namespace: moving bwrap and its
         * child (more capabilities than runtimed, in their user namespace)
         * into the agent's cgroup leaf, whose cpuset's attach asks the
         * kernel's setscheduler check (cap_safe_nice). */
        { CAP_SYS_NICE, USER_DRIVERS },
        { CAP_IPC_LOCK, USER_GVISOR | USER_MICROVM },
        /* Image builds: /dev nodes, file capabilities, apt's helpers. */
        { CAP_MKNOD, USER_DAEMON },
        { CAP_SETFCAP, USER_DAEMON },
        { CAP_AUDIT_WRITE, USER_DAEMON },
        /* Kept inside a namespace sandbox and a gVisor container (a server
         * on port 80 in the sandbox); --listen under 1024 (below). */
        { CAP_NET_BIND_SERVICE, USER_NAMESPACE | USER_GVISOR },
        /* runsc's shared memory and checkpoints. */
        { CAP_IPC_OWNER, USER_GVISOR },
        { CAP_CHECKPOINT_RESTORE, USER_GVISOR },
};

static const struct {
        const char *name;
        unsigned user;
} drivers[] = {
        { "namespace", USER_NAMESPACE },
        { "gvisor", USER_GVISOR },
        { "microvm", USER_MICROVM },
};

static const char *const names[] = {
        "CHOWN",           "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER",          "FSETID",
        "KILL",            "SETGID",       "SETUID",          "SETPCAP",         "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN",     "NET_RAW",         "IPC_LOCK",
        "IPC_OWNER",       "SYS_MODULE",   "SYS_RAWIO",       "SYS_CHROOT",      "SYS_PTRACE",
        "SYS_PACCT",       "SYS_ADMIN",    "SYS_BOOT",        "SYS_NICE",        "SYS_RESOURCE",
        "SYS_TIME",        "SYS_TTY_CONFIG", "MKNOD",         "LEASE",           "AUDIT_WRITE",
        "AUDIT_CONTROL",   "SETFCAP",      "MAC_OVERRIDE",    "MAC_ADMIN",       "SYSLOG",
        "WAKE_ALARM",      "BLOCK_SUSPEND", "AUDIT_READ",     "PERFMON",         "BPF",
        "CHECKPOINT_RESTORE",
};

static CapSet caps_of(unsigned users) {
        CapSet set = 0;
        for (size_t i = 0; i < ELEMENTSOF(table); i++)
                if (table[i].users & users)
                        set |= BIT(table[i].cap);
        return set;
}

CapSet caps_needed(const char *const *names_of, size_t n, bool privileged_port) {
        unsigned users = USER_DAEMON;
        for (size_t i = 0; i < n; i++) {
                unsigned u = USER_DRIVERS; /* unknown: the union */
                for (size_t k = 0; k < ELEMENTSOF(drivers); k++)
                        if (strcmp(names_of[i], drivers[k].name) == 0)
                                u = drivers[k].user;
                users |= u;
        }
        CapSet set = caps_of(users);
        if (privileged_port)
                set |= BIT(CAP_NET_BIND_SERVICE);
        return set;
}

CapSet caps_never_needed(void) {
        CapSet all = 0;
        for (unsigned c = 0; c <= CAP_LAST_CAP; c++)
                all |= BIT(c);
        return all & ~caps_of(USER_DAEMON | USER_DRIVERS) & ~BIT(CAP_NET_BIND_SERVICE);
}

static int thread_count(void) {
        DIR *d = opendir("/proc/self/task");
        if (!d)
                return -errno;
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d)))
                if (e->d_name[0] != '.')
                        n++;
        closedir(d);
        return n;
}

int caps_keep_only(CapSet keep) {
        int n = thread_count();
        if (n < 0)
                return n;
        if (n != 1)
                return -EBUSY;
        for (unsigned c = 0; c <= 63; c++)
                if (!(keep & BIT(c)) && prctl(PR_CAPBSET_DROP, (unsigned long)c, 0, 0, 0) < 0 && errno != EINVAL)
                        return -errno; /* EINVAL: past what this kernel knows */
        struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
        struct __user_cap_data_struct data[2];
        if (syscall(SYS_capget, &hdr, data) < 0)
                return -errno;
        for (unsigned i = 0; i < 2; i++) {
                uint32_t k = (uint32_t)(keep >> (32 * i));
                data[i].effective &= k;
                data[i].permitted &= k;
                data[i].inheritable &= k;
        }
        return syscall(SYS_capset, &hdr, data) < 0 ? -errno : 0;
}

void caps_format(CapSet set, char *out, size_t out_len) {
        size_t used = 0;
        if (out_len)
                out[0] = '\0';
        for (unsigned c = 0; c < ELEMENTSOF(names); c++)
                if (set & BIT(c)) {
                        int w = snprintf(out + used, out_len - used, "%s%s", used ? "," : "", names[c]);
                        if (w < 0 || (size_t)w >= out_len - used)
                                return;
                        used += (size_t)w;
                }
}
