/*
 * driver_gvisor: runsc (gVisor), a user-space kernel between the sandbox and
 * the host. The sandbox's syscalls are served by the Sentry; the host kernel
 * sees only the Sentry's own, seccomp-filtered calls. Platform systrap (no KVM
 * needed), no network device (--network=none). The daemon puts runsc and
 * everything it starts into the sandbox's cgroup itself, on v1 and v2
 * alike, and names that cgroup to runsc, which reads the sandbox's memory
 * and CPUs from it (gv_view_prepare) and otherwise uses it as it is.
 *
 * The root is the same overlay as the namespace driver's (rootfs.c), mapped
 * through an OCI user namespace so that root inside owns the shifted image.
 * The channel is the agent's stdin/stdout, which runsc hands to the container
 * process.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/timeutil.h"
#include "driver/cgroup.h"
#include "driver/driver.h"
#include "driver/driver_agent.h"
#include "driver/gvisor.h"
#include "driver/gvisor_snapshot.h"
#include "driver/launch.h"
#include "driver/rootfs.h"

/* A probe boots a real sandbox; a loaded host of two cores has been seen to
 * take 7 s for one. */
#define PROBE_TIMEOUT_MS 30000
#define RUNSC_CMD_TIMEOUT_MS 10000
#define GVISOR_MEMORY_HEADROOM_MIB 96
/* How long a start waits for the agent's first frame: the daemon's own
 * wait for its hello. */
#define GVISOR_START_WAIT_MS 30000
/* RLIMIT_NPROC inside (see write_bundle): below systrap's 4095 task
 * contexts per address space. */
#define GVISOR_NPROC_MAX 4000
/* What one process of the sandbox costs on the host beyond what gVisor
 * counts inside: its systrap stub processes (two host processes each) and
 * the Sentry's structures. Measured 0.62-0.65 MiB per sleeping process as
 * the host cgroup's memory.usage_in_bytes over 200 and 400 of them
 * (docs/drivers.md, "Processes and CPU"); with room. */
#define GVISOR_TASK_HOST_KIB 704u
/* Host pids the Sentry, gofer and runsc take before the sandbox runs
 * anything (25-40 seen), with room for the Go threads the Sentry adds
 * under load. */
#define GVISOR_HOST_PIDS_BASE 256u
/* Host pids one process of the sandbox takes at most: a fork bomb in a
 * 1024 MiB sandbox of the pinned runsc (960 tasks inside) peaked at 3121
 * host pids, 3.25 a task with the base (systrap's stub process and its
 * threads, the Sentry's threads); with room. Past the host's pids.max the
 * Sentry's Go runtime cannot start a thread and dies ("fatal error:
 * newosproc"), ending the sandbox: seen in a 2048 MiB one, 1984 tasks
 * inside against 4096 host pids. */
#define GVISOR_HOST_PIDS_PER_TASK 4u

/* runsc binaries in order of preference: the pinned build that
 * scripts/install-deps.sh installs, then the distribution's. RUNTIME_RUNSC
 * (an absolute path) names the only one to consider. */
static const char *const runsc_candidates[] = {"/usr/local/bin/runsc", "/usr/bin/runsc", "/usr/sbin/runsc"};

/* Platforms in order of preference, measured here (docs/drivers.md,
 * "Platform"): under a fork bomb systrap needs one host task per address
 * space where ptrace needs one per address space and Sentry thread, which
 * filled the sandbox's host pids limit and ended the Sentry; that outweighs
 * the few tens of milliseconds a short exec costs more on systrap here. KVM
 * hangs on nested hypervisors and is never tried. RUNTIME_GVISOR_PLATFORM
 * names one. */
static const char *const platforms[] = {"systrap", "ptrace"};

/* What the probe chose; written once under probe_once, read-only after. */
static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int probe_result;
static char probe_why[512];
static char chosen_runsc[PATH_MAX];
static char chosen_version[64];
static char chosen_platform[16];

/* Runs runsc with its output to /dev/null (or to out_fd) and waits, with a
 * deadline after which it is killed. */
static int run_runsc(char *const argv[], int out_fd, int timeout_ms, int *ret_status) {
        _cleanup_close_ int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd < 0)
                return -errno;
        int r = launch_fd_above_stdio(&null_fd);
        if (r < 0)
                return r;
        char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL};
        LaunchFds lf = {.stdin_fd = null_fd, .stdout_fd = out_fd >= 0 ? out_fd : null_fd,
                        .stderr_fd = out_fd >= 0 ? out_fd : null_fd};
        pid_t pid;
        r = launch_spawn(argv, envp, &lf, &pid);
        if (r < 0)
                return r;
        int st;
        r = launch_wait(pid, timeout_ms, &st);
        if (r < 0) {
                kill(pid, SIGKILL);
                while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                        ;
                return r;
        }
        if (ret_status)
                *ret_status = st;
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

/* The version runsc prints, e.g. "0.0~20240729.0", or "unknown". */
static void runsc_version(const char *runsc, char *out, size_t out_len) {
        snprintf(out, out_len, "unknown");
        int p[2];
        if (pipe2(p, O_CLOEXEC) < 0)
                return;
        int wfd = p[1];
        if (launch_fd_above_stdio(&wfd) < 0) {
                close(p[0]);
                close(p[1]);
                return;
        }
        p[1] = wfd;
        char *const argv[] = {(char *)runsc, "--version", NULL};
        int r = run_runsc(argv, p[1], PROBE_TIMEOUT_MS, NULL);
        close(p[1]);
        char buf[256];
        ssize_t n = r >= 0 ? read(p[0], buf, sizeof buf - 1) : -1;
        close(p[0]);
        if (n <= 0)
                return;
        buf[n] = '\0';
        buf[strcspn(buf, "\n")] = '\0';
        const char *v = strstr(buf, "version ");
        snprintf(out, out_len, "%.60s", v ? v + 8 : buf);
}

/* Boots a throwaway sandbox on the host's root (`runsc do`) running cmd;
 * 0 when it exits 0. */
static int runsc_do(const char *runsc, const char *platform, char *const cmd[]) {
        char state[] = "/tmp/runtime-runsc-probe-XXXXXX";
        if (!mkdtemp(state))
                return -errno;
        char plat[32];
        snprintf(plat, sizeof plat, "--platform=%s", platform);
        char *argv[16] = {(char *)runsc, plat, "--network=none", "--ignore-cgroups", "--root", state, "do"};
        size_t n = 7;
        for (size_t i = 0; cmd[i] && n < ELEMENTSOF(argv) - 1; i++)
                argv[n++] = cmd[i];
        argv[n] = NULL;
        int r = run_runsc(argv, -1, PROBE_TIMEOUT_MS, NULL);
        (void)path_remove_tree_at(AT_FDCWD, state);
        return r;
}

/* Whether runsc at `runsc` works here on `platform`. Coreutils' stat(1)
 * calls statx, which runsc before 2023 answers with EINVAL: `ls -l` and
 * `stat` then fail in every sandbox, so such a runsc is refused rather than
 * shipped as the default (RUNTIME_RUNSC_ALLOW_STATX_EINVAL=1 accepts it, for
 * side-by-side benchmarks only). */
static int probe_one(const char *runsc, const char *platform, const char *version, char *why, size_t why_len) {
        char *const stat_root[] = {"stat", "-c", "%n", "/", NULL};
        char *const true_cmd[] = {"true", NULL};
        int r = runsc_do(runsc, platform, stat_root);
        if (r == 0)
                return 0;
        if (r == -ETIMEDOUT) {
                snprintf(why, why_len, "runsc %s at %s: a test sandbox on the %s platform did not finish within %d s",
                         version, runsc, platform, PROBE_TIMEOUT_MS / 1000);
                return -ETIMEDOUT;
        }
        if (runsc_do(runsc, platform, true_cmd) < 0) {
                snprintf(why, why_len, "runsc %s at %s: a test sandbox on the %s platform failed to run", version,
                         runsc, platform);
                return -ENOEXEC;
        }
        const char *allow = getenv("RUNTIME_RUNSC_ALLOW_STATX_EINVAL");
        if (allow && strcmp(allow, "1") == 0)
                return 0;
        snprintf(why, why_len,
                 "runsc %s at %s answers statx with EINVAL (ls -l and stat fail inside); "
                 "install a current one with scripts/install-deps.sh",
                 version, runsc);
        return -EPROTONOSUPPORT;
}

static void probe_run(void) {
        if (geteuid() != 0) {
                probe_result = -EPERM;
                snprintf(probe_why, sizeof probe_why, "the gvisor driver needs root");
                return;
        }
        const CgroupLayout *l;
        if (launch_cgroup_layout(&l) < 0) {
                probe_result = -ENOENT;
                snprintf(probe_why, sizeof probe_why, "no usable cgroup hierarchy under /sys/fs/cgroup");
                return;
        }
        const char *only_runsc = getenv("RUNTIME_RUNSC");
        const char *only_platform = getenv("RUNTIME_GVISOR_PLATFORM");
        if (only_runsc && only_runsc[0] != '/') {
                probe_result = -EINVAL;
                snprintf(probe_why, sizeof probe_why, "RUNTIME_RUNSC must be an absolute path");
                return;
        }
        if (only_platform && strcmp(only_platform, "systrap") != 0 && strcmp(only_platform, "ptrace") != 0) {
                probe_result = -EINVAL;
                snprintf(probe_why, sizeof probe_why, "RUNTIME_GVISOR_PLATFORM must be systrap or ptrace");
                return;
        }
        const char *const *cands = only_runsc ? &only_runsc : runsc_candidates;
        size_t n_cands = only_runsc ? 1 : ELEMENTSOF(runsc_candidates);
        const char *const *plats = only_platform ? &only_platform : platforms;
        size_t n_plats = only_platform ? 1 : ELEMENTSOF(platforms);

        probe_result = -ENOENT;
        snprintf(probe_why, sizeof probe_why, "runsc (gVisor) is not installed");
        bool refused = false, statx_refused = false;
        for (size_t i = 0; i < n_cands; i++) {
                if (access(cands[i], X_OK) < 0)
                        continue;
                char version[64];
                runsc_version(cands[i], version, sizeof version);
                for (size_t j = 0; j < n_plats; j++) {
                        char why[sizeof probe_why];
                        int r = probe_one(cands[i], plats[j], version, why, sizeof why);
                        if (r == 0) {
                                snprintf(chosen_runsc, sizeof chosen_runsc, "%s", cands[i]);
                                snprintf(chosen_version, sizeof chosen_version, "%s", version);
                                snprintf(chosen_platform, sizeof chosen_platform, "%s", plats[j]);
                                probe_result = 0;
                                snprintf(probe_why, sizeof probe_why, "runsc %s at %s, %s platform", version,
                                         cands[i], plats[j]);
                                return;
                        }
                        /* The reason shown is the preferred binary's, and
                         * its statx bug over a platform that failed. */
                        if (!refused || (r == -EPROTONOSUPPORT && !statx_refused)) {
                                statx_refused = r == -EPROTONOSUPPORT;
                                probe_result = r;
                                snprintf(probe_why, sizeof probe_why, "%s", why);
                                refused = true;
                        }
                        /* A statx bug is the binary's, not the platform's. */
                        if (r == -EPROTONOSUPPORT)
                                break;
                }
        }
}

static int gv_probe(char *why, size_t why_len) {
        pthread_once(&probe_once, probe_run);
        if (why)
                snprintf(why, why_len, "%s", probe_why);
        return probe_result;
}

int gvisor_runsc_info(const char **ret_path, const char **ret_version, const char **ret_platform) {
        int r = gv_probe(NULL, 0);
        if (r < 0)
                return r;
        *ret_path = chosen_runsc;
        *ret_version = chosen_version;
        *ret_platform = chosen_platform;
        return 0;
}

unsigned gvisor_nproc(unsigned memory_mib, unsigned pids_max) {
        unsigned pids = pids_max ? pids_max : LAUNCH_DEFAULT_PIDS_MAX;
        unsigned n = pids < GVISOR_NPROC_MAX ? pids : GVISOR_NPROC_MAX;
        /* Each process takes up to GVISOR_HOST_PIDS_PER_TASK host pids in the
         * sandbox's cgroup, whose pids.max is the spec's: past it the Sentry
         * cannot start a stub or a thread and dies. */
        unsigned host = pids > 2 * GVISOR_HOST_PIDS_BASE ? (pids - GVISOR_HOST_PIDS_BASE) / GVISOR_HOST_PIDS_PER_TASK
                                                         : pids / (2 * GVISOR_HOST_PIDS_PER_TASK);
        if (n > host)
                n = host;
        /* One task per MiB of the sandbox: the host memory held for the
         * tasks' own cost (gvisor_host_memory_mib) stays below memoryMiB. */
        if (memory_mib && n > memory_mib)
                n = memory_mib;
        return n < 64 ? 64 : n;
}

unsigned gvisor_host_memory_mib(unsigned memory_mib, unsigned pids_max) {
        uint64_t tasks = (uint64_t)gvisor_nproc(memory_mib, pids_max) * GVISOR_TASK_HOST_KIB / 1024;
        return memory_mib + GVISOR_MEMORY_HEADROOM_MIB + memory_mib / 8 + (unsigned)tasks;
}

/* runsc reads the sandbox's cgroup once, as it starts (without
 * --ignore-cgroups, with linux.cgroupsPath naming the cgroup the daemon
 * made, which runsc then uses as it is): the Sentry is made with
 * --total-memory from its memory limit (MemTotal in /proc/meminfo, free)
 * and --cpu-num from its cpuset (the CPUs of /proc/cpuinfo, nproc,
 * sched_getaffinity, /sys/devices/system/cpu, and the Sentry's GOMAXPROCS).
 * So the cgroup starts at memoryMiB and on `vcpu` of the host's CPUs, and
 * once the agent is up (gv_started) its limit is raised by the Sentry's
 * headroom and its cpuset widened to all of the parent's: the Sentry's own
 * memory is not charged against memoryMiB (the host's OOM killer would end
 * the whole sandbox), and nothing stays pinned (a 1-vCPU sandbox pinned for
 * good answered python3 3-7x slower on a loaded 2-CPU host). The kernel
 * sets every member's affinity when the cpuset changes, stubs and threads
 * made later included. The quota, not the affinity, bounds the CPU time.
 * false: the cgroup has no cpuset (runsc then fails to read it), so runsc
 * runs with --ignore-cgroups and the sandbox sees the host's size. */
static bool gv_view_prepare(Cgroup *cg, unsigned vcpu) {
        cpu_set_t set;
        if (!launch_pick_cpus(vcpu, &set))
                return cgroup_set_cpus(cg, NULL) >= 0;
        char list[1024];
        size_t n = 0;
        list[0] = '\0';
        for (int i = 0; i < CPU_SETSIZE && n + 16 < sizeof list; i++)
                if (CPU_ISSET(i, &set))
                        n += (size_t)snprintf(list + n, sizeof list - n, "%s%d", n ? "," : "", i);
        return cgroup_set_cpus(cg, list) >= 0;
}

/* Waits until the agent has written its first frame (its hello, left in
 * the socket for the daemon to read) or runsc exited, which the daemon finds
 * out on the channel; -ETIMEDOUT after timeout_ms. */
static int gv_wait_started(int channel_fd, int pidfd, int timeout_ms) {
        int64_t deadline = (int64_t)time_now_mono_ms() + timeout_ms;
        for (;;) {
                struct pollfd p[2] = {{.fd = channel_fd, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
                int64_t left = deadline - (int64_t)time_now_mono_ms();
                if (left <= 0)
                        return -ETIMEDOUT;
                int n = poll(p, pidfd >= 0 ? 2 : 1, (int)left);
                if (n < 0 && errno != EINTR)
                        return -errno;
                if (n > 0)
                        return 0;
        }
}

/* The host's limits of a running sandbox: memory with the Sentry's
 * headroom (gv_start). */
static int gv_set_host_limits(const DriverSpec *spec, Cgroup *cg) {
        CgroupLimits lim = {
                .memory_bytes = (uint64_t)gvisor_host_memory_mib(spec->memory_mib, spec->pids_max) << 20,
                .vcpu = spec->vcpu,
                .pids_max = spec->pids_max ? spec->pids_max : LAUNCH_DEFAULT_PIDS_MAX,
        };
        return cgroup_set_limits(cg, &lim);
}

/* The sandbox runs: the host limit gets the Sentry's headroom, the cpuset
 * all of the parent's CPUs. */
static int gv_started(const DriverSpec *spec, Cgroup *cg) {
        int r = gv_set_host_limits(spec, cg);
        if (r < 0)
                return r;
        return cgroup_set_cpus(cg, NULL);
}

/* The runsc the probe chose, or NULL when none works here. */
static const char *find_runsc(void) {
        return gv_probe(NULL, 0) == 0 ? chosen_runsc : NULL;
}

/* The same, with its version and platform, for gvisor_snapshot.c's runsc
 * commands; -ENOENT when none works here. */
static int chosen(GvisorRunsc *ret) {
        const char *runsc = find_runsc();
        if (!runsc)
                return -ENOENT;
        *ret = (GvisorRunsc){.path = runsc, .version = chosen_version, .platform = chosen_platform};
        return 0;
}

static int json_add_str_array(json_t *obj, const char *key, const char *const *v, size_t n) {
        json_t *a = json_array();
        if (!a)
                return -ENOMEM;
        for (size_t i = 0; i < n; i++)
                if (json_array_append_new(a, json_string(v[i])) < 0) {
                        json_decref(a);
                        return -ENOMEM;
                }
        return json_object_set_new(obj, key, a) < 0 ? -ENOMEM : 0;
}

/* What a sandbox never needs, refused inside gVisor's own kernel (runsc
 * --oci-seccomp): the namespace driver's list in the OCI form, less syslog,
 * which reads gVisor's own log, not the host's, and less mount and umount2,
 * which the agent refuses itself once its mount helper is forked
 * (agent/live_mounts.h). New user namespaces are the
 * way to capabilities that the process set below does not have. */
static json_t *oci_seccomp(void) {
        static const char *const denied[] = {
                "pivot_root", "kexec_load", "kexec_file_load", "init_module", "finit_module",
                "delete_module", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key",
                "io_uring_setup", "io_uring_enter", "io_uring_register", "swapon", "swapoff", "reboot", "acct",
                "settimeofday", "clock_settime", "adjtimex", "open_by_handle_at", "name_to_handle_at", "setns",
                "iopl", "ioperm", "quotactl",
        };
        json_t *names = json_array();
        for (size_t i = 0; names && i < ELEMENTSOF(denied); i++)
                json_array_append_new(names, json_string(denied[i]));
        /* CLONE_NEWUSER is 0x10000000, for unshare and clone alike. */
        return json_pack("{s:s, s:[s], s:[{s:o, s:s, s:i},"
                         " {s:[s], s:s, s:i, s:[{s:i, s:I, s:I, s:s}]},"
                         " {s:[s], s:s, s:i, s:[{s:i, s:I, s:I, s:s}]}]}",
                         "defaultAction", "SCMP_ACT_ALLOW", "architectures", "SCMP_ARCH_X86_64", "syscalls", "names",
                         names, "action", "SCMP_ACT_ERRNO", "errnoRet", 1, "names", "unshare", "action",
                         "SCMP_ACT_ERRNO", "errnoRet", 1, "args", "index", 0, "value", (json_int_t)0x10000000,
                         "valueTwo", (json_int_t)0x10000000, "op", "SCMP_CMP_MASKED_EQ", "names", "clone", "action",
                         "SCMP_ACT_ERRNO", "errnoRet", 1, "args", "index", 0, "value", (json_int_t)0x10000000,
                         "valueTwo", (json_int_t)0x10000000, "op", "SCMP_CMP_MASKED_EQ");
}

/* Writes bundle/config.json: the OCI spec of the sandbox. */
static int write_bundle(const DriverSpec *spec, const char *bundle, const char *root, const char *agent,
                        uid_t shift, const char *cgroups_path) {
        static const char *const caps[] = {
                "CAP_CHOWN",  "CAP_DAC_OVERRIDE", "CAP_FOWNER",  "CAP_FSETID",           "CAP_KILL",
                "CAP_SETGID", "CAP_SETUID",       "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
                /* The agent's mount helper's alone: the agent drops it
                 * before anything else runs (agent/live_mounts.h). */
                "CAP_SYS_ADMIN",
        };
        static const char *const env[] = {
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
                "LANG=C.UTF-8",
        };
        /* The agent ends the largest process when the sandbox's memory is
         * used up (gVisor's Sentry is one host process; the host's OOM killer
         * would end the whole sandbox). */
        char memory[16];
        snprintf(memory, sizeof memory, "%u", spec->memory_mib);
        /* gVisor's RLIMIT_NPROC below. */
        json_int_t nproc = gvisor_nproc(spec->memory_mib, spec->pids_max);
        /* The limits the agent writes into gVisor's own cgroupfs at start,
         * where programs look for them (see the /sys/fs/cgroup mount). */
        char view[64];
        snprintf(view, sizeof view, "%u:%u:%lld", spec->memory_mib, spec->vcpu, (long long)nproc);
        const char *const args[] = {"/.runtime/agent", "--restorable", "--live-mounts", "--memory-limit-mib", memory,
                                    "--cgroup-view", view};

        _cleanup_json_ json_t *capabilities = json_object();
        if (!capabilities)
                return -ENOMEM;
        static const char *const sets[] = {"bounding", "effective", "permitted"};
        for (size_t i = 0; i < ELEMENTSOF(sets); i++)
                if (json_add_str_array(capabilities, sets[i], caps, ELEMENTSOF(caps)) < 0)
                        return -ENOMEM;

        /* gVisor's tasks are goroutines of one host process, so the host's
         * pids cgroup cannot count them: its own RLIMIT_NPROC does, per user.
         * It stays below what one address space holds on systrap (4095 task
         * contexts, a fixed table per stub process): the Sentry panics on
         * the thread past that, ending the whole sandbox, where a thread
         * refused at RLIMIT_NPROC fails alone (EAGAIN). The room below 4095
         * covers threads that have exited but whose context the Sentry has
         * not yet given back. */
        _cleanup_json_ json_t *process = json_pack(
                "{s:b, s:{s:i, s:i}, s:s, s:O, s:[{s:s, s:i, s:i}, {s:s, s:I, s:I}], s:b}", "terminal", 0, "user",
                "uid", 0, "gid", 0, "cwd", "/", "capabilities", capabilities, "rlimits", "type", "RLIMIT_NOFILE",
                "hard", 65536, "soft", 65536, "type", "RLIMIT_NPROC", "hard", nproc, "soft", nproc,
                "noNewPrivileges", 1);
        if (!process)
                return -ENOMEM;
        if (json_add_str_array(process, "args", args, ELEMENTSOF(args)) < 0 ||
            json_add_str_array(process, "env", env, ELEMENTSOF(env)) < 0)
                return -ENOMEM;

        /* /sys/fs/cgroup: gVisor's own cgroupfs (every controller, the
         * container's cgroup bound at /sys/fs/cgroup/<controller>), a view
         * kept by the Sentry alone: nothing written there reaches the host's
         * cgroups. */
        _cleanup_json_ json_t *mounts = json_pack(
                "[{s:s, s:s, s:s},"
                " {s:s, s:s, s:s, s:[s,s,s]},"
                " {s:s, s:s, s:s, s:[s,s,s,s]},"
                " {s:s, s:s, s:s, s:[s,s,s]},"
                " {s:s, s:s, s:s, s:[s,s,s,s,s]}]",
                "destination", "/proc", "type", "proc", "source", "proc",
                "destination", "/dev", "type", "tmpfs", "source", "tmpfs", "options", "nosuid", "strictatime", "mode=755",
                "destination", "/.runtime/agent", "type", "bind", "source", agent, "options", "bind", "ro",
                "nosuid", "nodev",
                "destination", "/sys/fs/cgroup", "type", "cgroup", "source", "cgroup", "options", "nosuid", "noexec",
                "nodev", "destination", "/.runtime/live", "type", "bind", "source", LAUNCH_STAGE_LIVE, "options",
                "bind", "rw", "nosuid", "nodev", "dcache=0");
        if (!mounts)
                return -ENOMEM;
        /* The volumes, staged by root (launch_stage_mounts), served by the
         * gofer like the root. */
        for (size_t i = 0; i < spec->n_mounts; i++) {
                const DriverMount *m = &spec->mounts[i];
                if (json_array_append_new(mounts, json_pack("{s:s, s:s, s:s, s:[s,s,s,s]}", "destination", m->dest,
                                                            "type", "bind", "source", launch_stage_mounts_at[i],
                                                            "options", "bind", m->read_only ? "ro" : "rw", "nosuid",
                                                            "nodev")) < 0)
                        return -ENOMEM;
        }

        _cleanup_json_ json_t *config = json_pack(
                "{s:s, s:O, s:{s:s, s:b}, s:s, s:O,"
                " s:{s:[{s:s},{s:s},{s:s},{s:s},{s:s},{s:s}],"
                "    s:[{s:i, s:i, s:i}], s:[{s:i, s:i, s:i}]}}",
                "ociVersion", "1.0.2", "process", process, "root", "path", root, "readonly", 0, "hostname", "sandbox",
                "mounts", mounts, "linux", "namespaces", "type", "pid", "type", "ipc", "type", "uts", "type", "mount",
                "type", "network", "type", "user", "uidMappings", "containerID", 0, "hostID", (json_int_t)shift,
                "size", (json_int_t)LAUNCH_UID_RANGE, "gidMappings", "containerID", 0, "hostID", (json_int_t)shift,
                "size", (json_int_t)LAUNCH_UID_RANGE);
        if (!config)
                return -ENOMEM;
        json_t *seccomp = oci_seccomp();
        if (!seccomp || json_object_set_new(json_object_get(config, "linux"), "seccomp", seccomp) < 0)
                return -ENOMEM;
        if (cgroups_path &&
            json_object_set_new(json_object_get(config, "linux"), "cgroupsPath", json_string(cgroups_path)) < 0)
                return -ENOMEM;

        char path[PATH_MAX], tmp[PATH_MAX];
        if (snprintf(path, sizeof path, "%s/config.json", bundle) >= (int)sizeof path ||
            snprintf(tmp, sizeof tmp, "%s/config.json.tmp", bundle) >= (int)sizeof tmp)
                return -ENAMETOOLONG;
        if (json_dump_file(config, tmp, JSON_INDENT(1)) < 0) {
                (void)unlink(tmp);
                return -EIO;
        }
        if (rename(tmp, path) < 0)
                return -errno;
        return 0;
}

static int state_paths(const char *sandbox_dir, char *state, size_t state_len, char *bundle, size_t bundle_len) {
        if (snprintf(state, state_len, "%s/runsc-state", sandbox_dir) >= (int)state_len ||
            snprintf(bundle, bundle_len, "%s/bundle", sandbox_dir) >= (int)bundle_len)
                return -ENAMETOOLONG;
        return 0;
}

/* `runsc delete --force`: removes what runsc keeps about the container
 * (its state files), killing the sandbox if it still runs. */
static void runsc_delete(const char *state, const char *id) {
        const char *runsc = find_runsc();
        if (!runsc || access(state, F_OK) < 0)
                return;
        char *const argv[] = {(char *)runsc, "--root", (char *)state, "delete", "--force", (char *)id, NULL};
        (void)run_runsc(argv, -1, RUNSC_CMD_TIMEOUT_MS, NULL);
}

/* A line in the sandbox's runsc.log (beside its layer, out of its sight):
 * what a memory snapshot or a restore ran into, for whoever reads the
 * daemon's log about it. */
static void gv_note(const char *sandbox_dir, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void gv_note(const char *sandbox_dir, const char *fmt, ...) {
        char p[PATH_MAX];
        if (path_join(p, sizeof p, sandbox_dir, "runsc.log") < 0)
                return;
        _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return;
        va_list ap;
        va_start(ap, fmt);
        (void)vdprintf(fd, fmt, ap);
        va_end(ap);
}

/* How long a restored sandbox's agent has to answer its resume: the Sentry
 * loads the saved kernel first (seconds for a few hundred MiB on a loaded
 * host). */
#define RESTORE_TIMEOUT_MS (120 * 1000)

/* Whether this start restores a memory snapshot (*ret_restore, the image
 * in ret_dir): only one taken with the runsc, agent, image and shape there
 * are now. */
static int gv_restore_check(const DriverSpec *spec, char *ret_dir, size_t len, bool *ret_restore, DriverError *err) {
        *ret_restore = false;
        if (!gvisor_snapshot_pending(spec->sandbox_dir, ret_dir, len))
                return 0;
        GvisorRunsc rs = {.path = chosen_runsc, .version = chosen_version, .platform = chosen_platform};
        char why[256] = "";
        int r = gvisor_snapshot_check(spec, &rs, why, sizeof why);
        if (r < 0) {
                gv_note(spec->sandbox_dir, "runtimed: restoring the memory snapshot: %s\n", why[0] ? why : strerror(-r));
                /* Tried once: a later start boots on the disk. */
                gvisor_snapshot_forget(spec->sandbox_dir);
                driver_error(err, r == -ESTALE ? "the memory snapshot was taken with another runsc, agent, image or "
                                                 "shape than this host has now; take a new one"
                                               : "the memory snapshot could not be restored");
                return r;
        }
        *ret_restore = true;
        return 0;
}

/* The restored agent's first request is resume, on its new channel: it
 * drops the streams of the source's channel and says HELLO again. The saved
 * image goes whatever happens. */
static int gv_restore_finish(const DriverSpec *spec, int chan, DriverError *err) {
        char why[256] = "";
        int r = driver_agent_resume(chan, spec->id, (int64_t)time_now_mono_ms() + RESTORE_TIMEOUT_MS, why, sizeof why);
        gvisor_snapshot_forget(spec->sandbox_dir);
        if (r < 0) {
                gv_note(spec->sandbox_dir, "runtimed: restoring the memory snapshot: %s\n", why);
                driver_error(err, "the memory snapshot could not be restored; take a new one");
        }
        return r;
}

/* What a gVisor start adds to the launch plan: a restore of a memory
 * snapshot or a boot, the cgroup view runsc is given, its state and bundle
 * directories. */
typedef struct GvStart {
        bool restore;
        char restore_dir[PATH_MAX];
        bool view;
        char state[PATH_MAX], bundle[PATH_MAX];
        char cgroups_path[PATH_MAX];
        char platform[32];
} GvStart;

/* The host's limit leaves room above the sandbox's own for the Sentry and
 * gofer and for what the agent's memory watch lets through between two
 * looks: the sandbox's processes are ended inside at memoryMiB, and the
 * host's OOM killer, which would end the whole sandbox, stays the last
 * resort. It is memoryMiB until the agent is up (gv_view_prepare), unless
 * runsc cannot read the cgroup. A restored copy's kernel is the saved one,
 * its memory loaded at once: it starts with the headroom, and under
 * --ignore-cgroups. */
static int gv_plan_cgroup(GvStart *g, LaunchPlan *p) {
        const DriverSpec *spec = p->spec;
        g->view = !g->restore && gv_view_prepare(p->inst->cg, spec->vcpu);
        if (!g->view) {
                int r = gv_set_host_limits(spec, p->inst->cg);
                if (r < 0)
                        return r;
        }
        /* runsc takes an absolute cgroupsPath as the same path under every
         * hierarchy's root, as the daemon makes it. */
        const char *parent = spec->cgroup_parent ? spec->cgroup_parent : "";
        if (snprintf(g->cgroups_path, sizeof g->cgroups_path, "/%s%s%s", parent, *parent ? "/" : "", spec->id) >=
            (int)sizeof g->cgroups_path)
                return -ENAMETOOLONG;
        return 0;
}

/* runsc's state directory (a container of the same id left by a daemon
 * that died goes first) and the OCI bundle. */
static int gv_plan_bundle(GvStart *g, LaunchPlan *p) {
        runsc_delete(g->state, p->spec->id);
        (void)path_remove_tree_at(AT_FDCWD, g->state);
        if ((mkdir(g->state, 0700) < 0 && errno != EEXIST) || (mkdir(g->bundle, 0700) < 0 && errno != EEXIST))
                return -errno;
        p->inst->runsc_root = strdup(g->state);
        if (!p->inst->runsc_root)
                return -ENOMEM;
        return write_bundle(p->spec, g->bundle, LAUNCH_STAGE_ROOT, LAUNCH_STAGE_AGENT, p->shift,
                            g->view ? g->cgroups_path : NULL);
}

/* runsc's command line: run (or restore) the bundle.
 * --overlay2=none: runsc since 2023 keeps writes to the root in an overlay
 * of its own (a file it creates beside the root) unless told not to; the
 * sandbox's files belong in its bounded layer, which outlives a stop.
 * --file-access=shared: with the default (exclusive) the Sentry keeps a
 * file's attributes per name, so after `ln a b` a chmod, chown, touch or rm
 * through one name is not seen through the other and `cp -a` copies stale
 * modes, owners and link counts; shared has it ask the gofer again. It costs
 * no measurable start time of python3 (docs/drivers.md). runsc refuses it
 * with an overlay on the root, hence only together with --overlay2=none.
 * A copy of a memory snapshot is restored instead of booted, with the same
 * flags and bundle: its saved kernel runs on. */
static void gv_argv(GvStart *g, const char *runsc, const char *id, char **argv) {
        snprintf(g->platform, sizeof g->platform, "--platform=%s", chosen_platform);
        size_t argc = 0;
        char *const head[] = { (char *)runsc, "--root", g->state, g->platform, "--network=none" };
        for (size_t i = 0; i < ELEMENTSOF(head); i++)
                argv[argc++] = head[i];
        if (!g->view)
                argv[argc++] = "--ignore-cgroups";
        char *const flags[] = { "--overlay2=none", "--file-access=shared", "--oci-seccomp",
                                g->restore ? "restore" : "run", "--bundle", g->bundle };
        for (size_t i = 0; i < ELEMENTSOF(flags); i++)
                argv[argc++] = flags[i];
        if (g->restore) {
                argv[argc++] = "--image-path";
                argv[argc++] = g->restore_dir;
        }
        argv[argc++] = (char *)id;
        argv[argc] = NULL;
}

/* After runsc is started: a restored copy resumes its agent; a boot with
 * the cgroup view waits for the agent, then lifts the host's limits. */
static int gv_started_plan(GvStart *g, LaunchPlan *p, DriverError *err) {
        if (g->restore)
                return gv_restore_finish(p->spec, p->channel[0], err);
        if (!g->view)
                return 0;
        int r = gv_wait_started(p->channel[0], p->inst->pidfd, GVISOR_START_WAIT_MS);
        if (r == -ETIMEDOUT)
                driver_error(err, "the sandbox's agent did not answer in time");
        return r < 0 ? r : gv_started(p->spec, p->inst->cg);
}

static void gv_after_kill(LaunchPlan *p, void *userdata) {
        GvStart *g = userdata;
        if (p->inst && p->inst->runsc_root) {
                runsc_delete(g->state, p->spec->id);
                (void)path_remove_tree_at(AT_FDCWD, g->state);
        }
}

static int gv_start(const DriverSpec *spec, int *ret_fd, DriverInstance **ret, DriverError *err) {
        LaunchPlan p;
        GvStart g = { .restore = false };
        char *argv[20];
        const char *runsc = find_runsc();
        int r = launch_plan_new(&p, &driver_gvisor, spec, runsc, "gVisor (runsc) is not installed on this host", err);
        p.live_dir = true;
        if (r >= 0)
                r = gv_restore_check(spec, g.restore_dir, sizeof g.restore_dir, &g.restore, err);
        if (r >= 0 && state_paths(spec->sandbox_dir, g.state, sizeof g.state, g.bundle, sizeof g.bundle) < 0)
                r = -ENAMETOOLONG;
        if (r >= 0 && (r = launch_plan_cgroup(&p)) >= 0 && (r = gv_plan_cgroup(&g, &p)) >= 0 &&
            (r = launch_plan_layer(&p)) >= 0 && (r = gv_plan_bundle(&g, &p)) >= 0 &&
            (r = launch_plan_channel(&p)) >= 0) {
                gv_argv(&g, runsc, spec->id, argv);
                LaunchFds lf = { .stderr_fd = -1 };
                r = launch_plan_spawn(&p, argv, &lf);
        }
        if (r >= 0)
                r = gv_started_plan(&g, &p, err);
        if (r < 0) {
                if (g.restore)
                        gvisor_snapshot_forget(spec->sandbox_dir);
                p.after_kill = gv_after_kill;
                p.userdata = &g;
                launch_plan_abort(&p);
                return r;
        }
        launch_plan_done(&p, ret_fd, ret);
        return 0;
}

static void gv_stop(DriverInstance *inst, const char **ret_reason) {
        if (ret_reason)
                *ret_reason = NULL;
        if (!inst)
                return;
        bool exited = launch_instance_exited(inst);
        const char *reason = launch_stop_reason(inst, exited);
        launch_kill_and_reap(inst);
        if (inst->runsc_root) {
                runsc_delete(inst->runsc_root, inst->id);
                (void)path_remove_tree_at(AT_FDCWD, inst->runsc_root);
        }
        if (ret_reason)
                *ret_reason = reason;
        launch_release(inst);
}

static int gv_reap_orphan(const DriverSpec *spec) {
        int r = launch_spec_check(spec);
        if (r < 0)
                return r;
        char state[PATH_MAX], bundle[PATH_MAX];
        r = state_paths(spec->sandbox_dir, state, sizeof state, bundle, sizeof bundle);
        if (r < 0)
                return r;
        /* Cgroup first: nothing of the old sandbox may run while runsc
         * cleans its state. */
        r = launch_reap_orphan(spec);
        runsc_delete(state, spec->id);
        (void)path_remove_tree_at(AT_FDCWD, state);
        /* A copy that never restored its memory snapshot boots from its
         * disk, as every sandbox after a daemon's restart. */
        gvisor_snapshot_forget(spec->sandbox_dir);
        return r;
}

static int gv_adopt(const DriverSpec *spec, const char *state, int *fds, size_t n, DriverInstance **ret) {
        char root[PATH_MAX], bundle[PATH_MAX];
        int r = launch_spec_check(spec);
        if (r == 0)
                r = state_paths(spec->sandbox_dir, root, sizeof root, bundle, sizeof bundle);
        if (r < 0) {
                for (size_t i = 0; i < n; i++)
                        if (fds[i] >= 0)
                                close(fds[i]);
                return r;
        }
        DriverInstance *inst;
        if ((r = launch_adopt(&driver_gvisor, spec, state, fds, n, &inst)) < 0)
                return r;
        if (!(inst->runsc_root = strdup(root))) {
                launch_let_go(inst);
                return -ENOMEM;
        }
        *ret = inst;
        return 0;
}

static int gv_destroy(const DriverSpec *spec) {
        int r = gv_reap_orphan(spec);
        if (r == -EINVAL)
                return r;
        int r2 = rootfs_remove(spec->sandbox_dir);
        return r < 0 ? r : r2;
}

static int gv_stats(DriverInstance *inst, DriverStats *ret) {
        return launch_stats(inst, ret);
}

/* A pause stops every task inside the Sentry (gvisor_runsc_pause); the
 * Sentry and its gofer stay idle, not frozen. */
static int gv_pause_or_resume(DriverInstance *inst, bool pause) {
        GvisorRunsc rs;
        int r = chosen(&rs);
        return r < 0 ? r : gvisor_runsc_pause(inst, &rs, pause);
}

static int gv_pause(DriverInstance *inst) {
        return gv_pause_or_resume(inst, true);
}

static int gv_resume(DriverInstance *inst) {
        return gv_pause_or_resume(inst, false);
}

/* Memory snapshots: the daemon has stopped the sandbox with its agent's
 * channel empty; its disk and its Sentry's kernel are saved together
 * (gvisor_snapshot.c). */
static int gv_snapshot_memory(DriverInstance *inst, const DriverSpec *spec, const char *dest_dir) {
        GvisorRunsc rs;
        int r = chosen(&rs);
        if (r < 0)
                return r;
        char why[256] = "";
        r = gvisor_snapshot_save(inst, spec, &rs, dest_dir, why, sizeof why);
        if (r < 0)
                gv_note(spec->sandbox_dir, "runtimed: memory snapshot failed: %s\n", why[0] ? why : strerror(-r));
        return r;
}

static int gv_restore_disk(const DriverSpec *spec, const char *snap_dir) {
        int r = launch_restore_disk(spec, snap_dir);
        if (r < 0 || !gvisor_snapshot_has_memory(snap_dir))
                return r;
        return gvisor_snapshot_link(snap_dir, spec->sandbox_dir);
}

const Driver driver_gvisor = {
        .name = "gvisor",
        /* The agent is one task among the sandbox's in the Sentry, which
         * schedules them alike (no priority of its own, nice is not
         * honoured): beside a fork bomb being killed on a loaded host it
         * took 20 s to answer a request (docs/drivers.md, "Processes and
         * CPU"). */
        .heartbeat_timeout_ms = 90000,
        .probe = gv_probe,
        .start = gv_start,
        .stop = gv_stop,
        .destroy = gv_destroy,
        .reap_orphan = gv_reap_orphan,
        .stats = gv_stats,
        .alive = launch_alive,
        .handles = launch_handles,
        .adopt = gv_adopt,
        .release = launch_let_go,
        .pause = gv_pause,
        .resume = gv_resume,
        .snapshot_disk = launch_snapshot_disk,
        .restore_disk = gv_restore_disk,
        .snapshot_memory = gv_snapshot_memory,
        .mount_live = gvisor_mount_live,
        .unmount_live = gvisor_unmount_live,
        .live_bind_by_agent = true,
        .live_held = gvisor_live_held,
};
