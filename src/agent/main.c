/*
 * runtime-agent: PID 1 of every sandbox. Speaks the channel protocol
 * (docs/protocol.md) on fds 0/1, or on a character device with --channel.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "agent/agent.h"
#include "agent/exec.h"
#include "agent/fsops.h"
#include "agent/limits.h"
#include "agent/live_mounts.h"
#include "agent/request.h"
#include "agent/sudo_front.h"
#include "agent/sudo_gateway.h"
#include "agent/vm.h"
#include "common/macro.h"

static void usage(FILE *f) {
        fprintf(f, "Usage: runtime-agent [--channel PATH] [--vm] [--restorable] [--memory-limit-mib N]\n"
                   "                     [--cgroup-fds N,...] [--cgroup-view M:C:P]\n"
                   "                     [--live-mounts]\n"
                   "  --channel PATH  speak the protocol on this device instead of stdin/stdout\n"
                   "  --memory-limit-mib N  end the largest process when the sandbox uses N MiB\n"
                   "  --cgroup-fds N,...  fds of the cgroup every command joins before it execs\n"
                   "  --cgroup-view M:C:P  write M MiB, C CPUs, P pids into /sys/fs/cgroup (gVisor's own)\n"
                   "  --vm            init of a microVM: build the root, then use the virtio-serial port\n"
                   "  --live-mounts   volumes attached while it runs (gVisor: a helper binds them)\n"
                   "  --restorable    the host may checkpoint this sandbox and resume copies of it (gVisor)\n"
                   "  --version       print the version\n");
}

/* Blocks the signals the loop takes from a signalfd and returns that fd. */
static int signals_setup(void) {
        /* Writes to a closed pipe or channel must be errors, not death. */
        signal(SIGPIPE, SIG_IGN);
        sigset_t mask;
        sigemptyset(&mask);
        sigaddset(&mask, SIGCHLD);
        sigaddset(&mask, SIGTERM);
        sigaddset(&mask, SIGINT);
        if (sigprocmask(SIG_BLOCK, &mask, NULL) < 0)
                return -errno;
        int fd = signalfd(-1, &mask, SFD_CLOEXEC | SFD_NONBLOCK);
        return fd < 0 ? -errno : fd;
}

/* A copy of a gVisor sandbox restored by runsc: the Sentry reads the host's
 * clock and takes its entropy from the host afresh after a restore, and the
 * hostname is the OCI spec's, the same in every copy; only the channel is
 * new, which the agent's resume handles. */
static int sentry_resume(const AgentRequest *r) {
        return r && r->op == REQ_RESUME ? 0 : -EINVAL;
}

static int serve(int in_fd, int out_fd, int sig_fd, bool vm, bool restorable, unsigned long memory_mib,
                 const LimitsView *view) {
        limits_protect_agent();
        /* Before any command runs: every program sees the view from its
         * start. */
        if (view) {
                int vr = limits_write_cgroup_view("/sys/fs/cgroup", view);
                if (vr < 0)
                        fprintf(stderr, "runtime-agent: cannot write the cgroup view: %s\n", strerror(-vr));
                else if ((vr = limits_make_command_cgroup("/sys/fs/cgroup", view)) < 0)
                        fprintf(stderr, "runtime-agent: cannot make the commands' cgroup: %s\n", strerror(-vr));
        }
        int r = fsops_mkdir_p("/workspace", 0755);
        if (r < 0)
                fprintf(stderr, "runtime-agent: cannot create /workspace: %s\n", strerror(-r));
        Agent *a = agent_new(in_fd, out_fd, sig_fd);
        if (!a) {
                fprintf(stderr, "runtime-agent: out of memory\n");
                return 1;
        }
        pid_t gateway;
        r = sudo_gateway_start(&gateway);
        if (r < 0)
                fprintf(stderr, "runtime-agent: no sudo gateway: %s\n", strerror(-r));
        if (vm) {
                agent_set_resume(a, vm_resume);
                agent_set_mounts(a, vm_live_mount, vm_live_unmount);
        }
        else if (restorable)
                agent_set_checkpoint(a, sentry_resume);
        if (memory_mib)
                agent_set_memory_limit(a, (uint64_t)memory_mib << 20);
        r = agent_relay_listen(a, AGENT_RELAY_PORT);
        if (r < 0)
                fprintf(stderr, "runtime-agent: no egress relay on 127.0.0.1:%d: %s\n", AGENT_RELAY_PORT,
                        strerror(-r));
        int status = agent_run(a);
        agent_free(a);
        return status;
}

/* PID 1 of a microVM: it must never exit (the guest kernel would panic), so
 * every way out powers the VM off. */
static int main_vm(char **argv, const char *channel) {
        const char *what = NULL;
        int r = vm_setup(argv, &what);
        if (r < 0) {
                fprintf(stderr, "runtime-agent: %s: %s\n", what ? what : "setup", strerror(-r));
                vm_poweroff();
        }
        int sig_fd = signals_setup();
        if (sig_fd < 0) {
                fprintf(stderr, "runtime-agent: signals: %s\n", strerror(-sig_fd));
                vm_poweroff();
        }
        int fd;
        r = vm_open_channel(channel ? channel : VM_CHANNEL_PATH, 30000, &fd);
        if (r < 0) {
                fprintf(stderr, "runtime-agent: channel: %s\n", strerror(-r));
                vm_poweroff();
        }
        (void)serve(fd, fd, sig_fd, true, false, 0, NULL);
        vm_poweroff();
}

int main(int argc, char **argv) {
        static const struct option opts[] = {
                {"channel", required_argument, NULL, 'c'},
                {"help", no_argument, NULL, 'h'},
                {"version", no_argument, NULL, 'V'},
                {"vm", no_argument, NULL, 'm'},
                {"memory-limit-mib", required_argument, NULL, 'M'},
                {"restorable", no_argument, NULL, 'R'},
                {"cgroup-fds", required_argument, NULL, 'G'},
                {"cgroup-view", required_argument, NULL, 'W'},
                {"live-mounts", no_argument, NULL, 'L'},
                {},
        };
        /* Run as sudo (the gateway's front, docs/drivers.md): nothing of
         * the agent's own. */
        const char *base = argc > 0 ? strrchr(argv[0], '/') : NULL;
        if (argc > 0 && strcmp(base ? base + 1 : argv[0], "sudo") == 0)
                return sudo_front_main(argc, argv);
        const char *channel = NULL;
        bool vm = false, restorable = false;
        unsigned long memory_mib = 0;
        LimitsView view;
        bool have_view = false, have_leaf = false, live = false;
        char *end;
        int c;
        while ((c = getopt_long(argc, argv, "c:hV", opts, NULL)) >= 0) {
                switch (c) {
                case 'c':
                        channel = optarg;
                        break;
                case 'm':
                        vm = true;
                        break;
                case 'R':
                        restorable = true;
                        break;
                case 'L':
                        live = true;
                        break;
                case 'M':
                        errno = 0;
                        memory_mib = strtoul(optarg, &end, 10);
                        if (errno || *end || memory_mib < 16 || memory_mib > (1ul << 22)) {
                                fprintf(stderr, "runtime-agent: --memory-limit-mib: 16..4194304\n");
                                return 2;
                        }
                        break;
                case 'G':
                        if (limits_set_child_cgroup_fds(optarg) < 0) {
                                fprintf(stderr, "runtime-agent: --cgroup-fds: open fds N,N,... (at most %d)\n",
                                        LIMITS_CGROUP_FDS_MAX);
                                return 2;
                        }
                        have_leaf = true;
                        break;
                case 'W':
                        if (limits_parse_cgroup_view(optarg, &view) < 0) {
                                fprintf(stderr, "runtime-agent: --cgroup-view: MEMORY_MIB:VCPU:PIDS\n");
                                return 2;
                        }
                        have_view = true;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case 'V':
                        printf("runtime-agent %s\n", RUNTIME_VERSION);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
        }
        if (optind != argc) {
                usage(stderr);
                return 2;
        }
        if (vm)
                return main_vm(argv, channel);

        /* First: the helper is forked before anything else runs, and
         * nothing after it mounts. */
        if (live) {
                int lr = live_mounts_start();
                if (lr == -ENOTRECOVERABLE) {
                        fprintf(stderr, "runtime-agent: cannot take mounts and CAP_SYS_ADMIN away\n");
                        return 1;
                }
                if (lr < 0)
                        fprintf(stderr, "runtime-agent: no live mounts: %s\n", strerror(-lr));
        }
        /* Not PID 1 (tests on a host): orphans of our children still come to
         * us to be reaped, as they would to an init. */
        if (getpid() != 1)
                (void)prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        _cleanup_close_ int sig_fd = signals_setup();
        if (sig_fd < 0) {
                fprintf(stderr, "runtime-agent: signals: %s\n", strerror(-sig_fd));
                return 1;
        }

        int in_fd = STDIN_FILENO, out_fd = STDOUT_FILENO;
        _cleanup_close_ int dev_fd = -1;
        if (channel) {
                dev_fd = open(channel, O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
                if (dev_fd < 0) {
                        fprintf(stderr, "runtime-agent: %s: %s\n", channel, strerror(errno));
                        return 1;
                }
                in_fd = out_fd = dev_fd;
        }
        /* After the signal mask and before the first request: the
         * launcher's one move into the work leaf is off every command's
         * path. */
        if (have_leaf)
                exec_launcher_start();
        return serve(in_fd, out_fd, sig_fd, false, restorable, memory_mib, have_view ? &view : NULL);
}
