/* runtime-supervisor: the process that keeps a sandbox's agent channel open
 * while no daemon is there (supervisor.h). The daemon starts it as
 *
 *   runtime-supervisor --sandbox <id> --keep <n> [--state <text>]
 *
 * with RUNTIME_SUPERVISOR_NONCE in the environment, fd 3 the agent channel,
 * fd 4 the listening socket, fd 5 its own connection and fds 6 .. 6+n-1 the
 * handles to keep. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <linux/capability.h>
#include <seccomp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/macro.h"
#include "supervisor/supervisor.h"

#define FD_AGENT 3
#define FD_LISTEN 4
#define FD_CONN 5
#define FD_KEEP 6
#define EXIT_USAGE 2
#define NONCE_ENV "RUNTIME_SUPERVISOR_NONCE"

static const struct option options[] = {
        { "sandbox", required_argument, NULL, 's' },
        { "keep", required_argument, NULL, 'k' },
        { "state", required_argument, NULL, 't' },
        {},
};

/* Every call the relay makes after the filter is in, and nothing else: a
 * supervisor taken over through a bug in its frame or handshake parsing can
 * then do no more than relay bytes. Names an architecture lacks are skipped
 * (some have only ppoll, some only clock_gettime64). */
static const char *const allowed[] = {
        /* The loop, the signalfd, the agent's channel while detached. */
        "read", "write", "poll", "ppoll", "close",
        /* The listening socket, its peers' credentials and handshakes. */
        "accept4", "getsockopt", "recvmsg", "sendmsg",
        /* The handshakes' deadlines, where the vDSO falls back to the kernel. */
        "clock_gettime", "clock_gettime64",
        /* Freeing the buffer, and the end. */
        "munmap", "exit_group",
        /* A poll with a timeout resumed after SIGSTOP and SIGCONT. */
        "restart_syscall",
};

static void seccomp_releasep(scmp_filter_ctx *ctx) {
        if (*ctx)
                seccomp_release(*ctx);
}

static int usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int usage(const char *fmt, ...) {
        char why[256];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, sizeof why, fmt, ap);
        va_end(ap);
        fprintf(stderr, "runtime-supervisor: %s\nusage: runtime-supervisor --sandbox <id> --keep <n> [--state <text>]\n",
                why);
        return EXIT_USAGE;
}

static int parse_keep(const char *text, size_t *ret) {
        if (!text[0] || strlen(text) > 3)
                return -EINVAL;
        size_t n = 0;
        for (const char *p = text; *p; p++) {
                if (*p < '0' || *p > '9')
                        return -EINVAL;
                n = n * 10 + (size_t)(*p - '0');
        }
        if (n > SUPERVISOR_KEEP_MAX)
                return -ERANGE;
        *ret = n;
        return 0;
}

/* No capability left in any set, none to regain: the supervisor only relays
 * bytes and hands fds on, and it keeps its uid, which its socket's peers are
 * checked against. */
static int drop_privileges(void) {
        if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return -errno;
        /* EINVAL before Linux 4.3, which had no ambient set to clear. */
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
                return -errno;
        struct __user_cap_header_struct head = { .version = _LINUX_CAPABILITY_VERSION_3 };
        struct __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
        if (syscall(SYS_capget, &head, data) < 0)
                return -errno;
        /* Shrinking the bounding set takes CAP_SETPCAP. A supervisor started
         * without it holds no capability to lose, and with no_new_privs and
         * no execve in its filter it can never gain one from that set. */
        if (data[CAP_TO_INDEX(CAP_SETPCAP)].effective & CAP_TO_MASK(CAP_SETPCAP))
                for (unsigned long cap = 0; prctl(PR_CAPBSET_READ, cap, 0, 0, 0) >= 0; cap++)
                        if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0)
                                return -errno;
        memset(data, 0, sizeof data);
        head = (struct __user_cap_header_struct){ .version = _LINUX_CAPABILITY_VERSION_3 };
        if (syscall(SYS_capset, &head, data) < 0)
                return -errno;
        return 0;
}

static int install_filter(void) {
        _cleanup_(seccomp_releasep) scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_KILL_PROCESS);
        if (!ctx)
                return -ENOMEM;
        /* Calls through another ABI (int 0x80, x32) would bypass the numbers
         * below. */
        int r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
        if (r < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(allowed); i++) {
                int nr = seccomp_syscall_resolve_name(allowed[i]);
                if (nr == __NR_SCMP_ERROR)
                        continue;
                r = seccomp_rule_add(ctx, SCMP_ACT_ALLOW, nr, 0);
                if (r < 0)
                        return r;
        }
        return seccomp_load(ctx);
}

/* The nonce is copied out and wiped from the environment, whose bytes
 * /proc/<pid>/environ would show. */
static int take_nonce(char ret[SUPERVISOR_NONCE_LEN + 1]) {
        char *v = getenv(NONCE_ENV);
        if (!v || !supervisor_nonce_valid(v)) {
                if (v)
                        explicit_bzero(v, strlen(v));
                return -EINVAL;
        }
        memcpy(ret, v, SUPERVISOR_NONCE_LEN + 1);
        explicit_bzero(v, strlen(v));
        unsetenv(NONCE_ENV);
        return 0;
}

typedef struct Args {
        const char *sandbox_id;
        const char *state; /* NULL for none */
        size_t n_keep;
} Args;

/* 0, or EXIT_USAGE after a message. */
static int parse_args(int argc, char *argv[], Args *ret) {
        const char *id = NULL, *state = NULL, *keep_text = NULL;
        opterr = 0;
        int c;
        while ((c = getopt_long(argc, argv, "+", options, NULL)) != -1) {
                const char **slot = c == 's' ? &id : c == 'k' ? &keep_text : c == 't' ? &state : NULL;
                if (!slot)
                        return usage("unknown option or missing value: %s", argv[optind - 1]);
                if (*slot)
                        return usage("an option is given twice");
                *slot = optarg;
        }
        if (optind < argc)
                return usage("unexpected argument: %s", argv[optind]);
        if (!supervisor_id_valid(id))
                return usage("--sandbox must match [a-z0-9_-]{1,%d}", SUPERVISOR_ID_MAX);
        size_t n_keep = 0;
        if (!keep_text || parse_keep(keep_text, &n_keep) < 0)
                return usage("--keep must be a number from 0 to %d", SUPERVISOR_KEEP_MAX);
        if (state && !supervisor_state_valid(state))
                return usage("--state must be at most %d printable characters without spaces",
                             SUPERVISOR_STATE_MAX);
        *ret = (Args){ .sandbox_id = id, .state = state, .n_keep = n_keep };
        return 0;
}

/* The fds the daemon hands over must be there; nothing else it did not
 * mean to hand over stays open. 0, or EXIT_USAGE after a message. */
static int take_fds(size_t n_keep) {
        for (int fd = FD_AGENT; fd < FD_KEEP + (int)n_keep; fd++)
                if (fcntl(fd, F_GETFD) < 0)
                        return usage("fd %d is not open", fd);
        if (syscall(SYS_close_range, (unsigned)(FD_KEEP + n_keep), ~0U, 0U) < 0) {
                long max = sysconf(_SC_OPEN_MAX);
                for (long fd = FD_KEEP + (long)n_keep; fd < (max > 0 && max < 65536 ? max : 65536); fd++)
                        close((int)fd);
        }
        return 0;
}

int main(int argc, char *argv[]) {
        if (argc == 2 && strcmp(argv[1], "--version") == 0) {
                printf("runtime-supervisor %s\n", RUNTIME_VERSION);
                return 0;
        }
        Args args = { 0 };
        int r = parse_args(argc, argv, &args);
        if (r != 0)
                return r;
        char nonce[SUPERVISOR_NONCE_LEN + 1];
        if (take_nonce(nonce) < 0)
                return usage("%s must hold %d lowercase hex digits", NONCE_ENV, SUPERVISOR_NONCE_LEN);
        if ((r = take_fds(args.n_keep)) != 0)
                return r;

        int keep_fds[SUPERVISOR_KEEP_MAX];
        for (size_t i = 0; i < args.n_keep; i++)
                keep_fds[i] = FD_KEEP + (int)i;
        SupervisorConfig cfg = {
                .sandbox_id = args.sandbox_id,
                .nonce = nonce,
                .state = args.state,
                .agent_fd = FD_AGENT,
                .listen_fd = FD_LISTEN,
                .conn_fd = FD_CONN,
                .keep_fds = keep_fds,
                .n_keep = args.n_keep,
        };
        const char *id = args.sandbox_id;
        /* Asked now: getpid is not in the filter. */
        pid_t pid = getpid();
        Supervisor *s = NULL;
        if ((r = supervisor_new(&cfg, &s)) < 0) {
                supervisor_log(id, "exiting: setting up failed: %s", strerror(-r));
                return EXIT_FAILURE;
        }
        if ((r = drop_privileges()) < 0 || (r = install_filter()) < 0) {
                supervisor_log(id, "exiting: dropping privileges failed: %s", strerror(-r));
                supervisor_free(s);
                return EXIT_FAILURE;
        }
        supervisor_log(id, "started: pid %d, keeping %zu handles", (int)pid, args.n_keep);
        r = supervisor_run(s);
        supervisor_free(s);
        explicit_bzero(nonce, sizeof nonce);
        return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
