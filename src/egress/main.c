/*
 * runtime-egress: the egress proxy as a process of its own. runtimed starts
 * it (and starts it again when it dies) with its control socket on fd 3.
 * It loads the CA and the upstream trust store as root, then becomes an
 * unprivileged user with no capabilities in any set, no_new_privs and no
 * supplementary groups, before it reads a byte a sandbox sent. The key
 * database and the state directory stay out of its reach: the daemon
 * passes it each connection's descriptors and settings (src/egress/wire.h).
 */
#include <errno.h>
#include <getopt.h>
#include <grp.h>
#include <linux/capability.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/log.h"
#include "egress/ca.h"
#include "egress/cabundle.h"
#include "egress/cidr.h"
#include "egress/policy.h"
#include "egress/proxy.h"
#include "egress/secret.h"
#include "egress/wire.h"

#define CTL_FD 3
#define MAX_TEST_UPSTREAMS 32
#define SETTINGS_TIMEOUT_MS 10000
#define RECORD_TIMEOUT_MS 5000
/* Without the system user (scripts/install-deps.sh makes it), this uid and
 * gid, with no name: never root, never a user whose files it could touch. */
#define FALLBACK_ID 64011

typedef struct Proxy {
        EgressCa *ca;
        SSL_CTX *upstream_ctx;
        EgressTestHost test_hosts[MAX_TEST_UPSTREAMS];
        size_t n_test_hosts;
        EgressCidr public_cidrs[EGRESS_MAX_PUBLIC_CIDRS];
        size_t n_public_cidrs;
        unsigned max_conns;
        pthread_mutex_t lock;
        pthread_cond_t freed;
        unsigned active;
} Proxy;

typedef struct Conn {
        Proxy *p;
        int data, meta;
} Conn;

static ssize_t fd_read(void *ctx, uint8_t *buf, size_t len) {
        int fd = *(int *)ctx;
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        int r = poll(&pfd, 1, 1000);
        if (r < 0)
                return errno == EINTR ? -EAGAIN : -errno;
        if (r == 0)
                return -EAGAIN;
        ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
        if (n < 0)
                return errno == EAGAIN || errno == EINTR ? -EAGAIN : -EPIPE;
        return n;
}

static int fd_write(void *ctx, const uint8_t *buf, size_t len) {
        int fd = *(int *)ctx;
        while (len > 0) {
                ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
                if (n < 0 && errno == EINTR)
                        continue;
                if (n < 0)
                        return -EPIPE;
                buf += n;
                len -= (size_t)n;
        }
        return 0;
}

static void fd_close_write(void *ctx) {
        (void)shutdown(*(int *)ctx, SHUT_WR);
}

/* Where a connection's records go: its meta socket, written by whichever
 * of its threads decided. */
typedef struct Meta {
        int fd;
        pthread_mutex_t lock;
        unsigned sent;
} Meta;

static void meta_send(Meta *m, const EgressRecord *rec, EgressWireKind kind) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t now_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
        json_t *j = egress_wire_record_json(rec, kind, now_us);
        pthread_mutex_lock(&m->lock);
        /* The daemon ends a connection that sends more than its bound: the
         * end record always has room. */
        if (j && (kind == EGRESS_WIRE_END || m->sent + 1 < EGRESS_WIRE_MAX_RECORDS)) {
                (void)egress_wire_write(m->fd, j, RECORD_TIMEOUT_MS);
                m->sent++;
        }
        pthread_mutex_unlock(&m->lock);
        json_decref(j);
}

static void on_decided(void *ctx, const EgressRecord *rec) {
        meta_send(ctx, rec, EGRESS_WIRE_DECISION);
}

static void serve_conn(Proxy *p, int data, int meta) {
        json_t *settings = NULL;
        EgressRecord rec;
        memset(&rec, 0, sizeof(rec));
        EgressPolicy *policy = NULL;
        EgressSecret *secrets = NULL;
        size_t n_secrets = 0;
        int r = egress_wire_read(meta, EGRESS_WIRE_MAX_SETTINGS, SETTINGS_TIMEOUT_MS, &settings);
        if (r < 0) {
                log_warn(NULL, "runtime-egress: a connection without its settings: %s", strerror(-r));
                goto out;
        }
        if (egress_policy_parse(json_object_get(settings, "network"), &policy, NULL, 0) < 0)
                (void)egress_policy_parse(NULL, &policy, NULL, 0); /* refuse everything */
        if (egress_wire_secrets_parse(json_object_get(settings, "secrets"), &secrets, &n_secrets) < 0)
                n_secrets = 0;
        EgressProxyConfig cfg = {
                .test_hosts = p->test_hosts,
                .n_test_hosts = p->n_test_hosts,
                .public_cidrs = p->public_cidrs,
                .n_public_cidrs = p->n_public_cidrs,
                .web_ports_only = json_is_true(json_object_get(settings, "trial")),
                .secrets = secrets,
                .n_secrets = n_secrets,
                .ca = p->ca,
                .upstream_ctx = p->upstream_ctx,
        };
        Meta m = { .fd = meta, .lock = PTHREAD_MUTEX_INITIALIZER };
        cfg.decided = on_decided;
        cfg.decided_ctx = &m;
        EgressIo io = { .ctx = &data, .read = fd_read, .write = fd_write, .close_write = fd_close_write };
        if (policy)
                (void)egress_proxy_serve(&io, policy, &cfg, &rec);
        shutdown(data, SHUT_RDWR);
        meta_send(&m, &rec, EGRESS_WIRE_END);
        pthread_mutex_destroy(&m.lock);
out:
        egress_wire_secrets_free(secrets, n_secrets);
        egress_policy_free(policy);
        egress_wire_settings_free(settings);
}

static void *conn_main(void *arg) {
        Conn *c = arg;
        Proxy *p = c->p;
        serve_conn(p, c->data, c->meta);
        close(c->data);
        close(c->meta);
        free(c);
        pthread_mutex_lock(&p->lock);
        p->active--;
        pthread_cond_signal(&p->freed);
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

/* Root, capabilities and the ways back to them, gone for good. */
static int drop_privileges(const char *user) {
        uid_t uid = FALLBACK_ID;
        gid_t gid = FALLBACK_ID;
        struct passwd *pw = user ? getpwnam(user) : NULL;
        if (pw) {
                uid = pw->pw_uid;
                gid = pw->pw_gid;
        }
        if (uid == 0 || gid == 0)
                return -EPERM;
        /* The bounding set first: dropping from it needs CAP_SETPCAP, which
         * goes with root below. */
        for (unsigned long cap = 0; cap <= 63; cap++)
                if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno != EINVAL)
                        return -errno;
        if (prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) < 0)
                return -errno;
        if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
                return -errno;
        struct __user_cap_header_struct hdr = { .version = _LINUX_CAPABILITY_VERSION_3, .pid = 0 };
        struct __user_cap_data_struct data[2];
        memset(data, 0, sizeof(data));
        if (syscall(SYS_capset, &hdr, data) < 0)
                return -errno;
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
                return -errno;
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                return -errno;
        /* Checked, not assumed: a kernel or a setting that kept any of it
         * ends the proxy before it serves. */
        if (getuid() == 0 || geteuid() == 0 || getgid() == 0 || getegid() == 0 || setuid(0) == 0)
                return -EPERM;
        if (syscall(SYS_capget, &hdr, data) < 0)
                return -errno;
        for (int i = 0; i < 2; i++)
                if (data[i].effective || data[i].permitted || data[i].inheritable)
                        return -EPERM;
        if (!pw)
                log_warn(NULL, "runtime-egress: no user %s; running as uid and gid %d", user ? user : "-",
                         FALLBACK_ID);
        return 0;
}

static void seccomp_releasep(scmp_filter_ctx *ctx) {
        if (*ctx)
                seccomp_release(*ctx);
}

/* What a proxy never does, refused even if an attacker runs code in it: run
 * another program, look into or change another process, make namespaces
 * (the first step of most kernel privilege bugs), mount, load kernel code or
 * BPF, and the kernel interfaces with a record of such bugs (io_uring,
 * userfaultfd, keyrings, perf). Everything else stays: the proxy resolves
 * names, connects, speaks TLS and runs threads, and a list of what that
 * takes would break with the next libc or OpenSSL. */
static int seccomp_load_denials(void) {
        static const char *const denied[] = {
                "execve",          "execveat",          "ptrace",           "process_vm_readv",
                "process_vm_writev", "kcmp",            "pidfd_getfd",      "setns",
                "mount",           "umount2",           "pivot_root",       "chroot",
                "move_mount",      "open_tree",         "fsopen",           "fsmount",
                "fsconfig",        "fspick",            "mount_setattr",    "open_by_handle_at",
                "name_to_handle_at", "init_module",     "finit_module",     "delete_module",
                "kexec_load",      "kexec_file_load",   "bpf",              "perf_event_open",
                "userfaultfd",     "keyctl",            "add_key",          "request_key",
                "io_uring_setup",  "io_uring_enter",    "io_uring_register", "mknod",
                "mknodat",         "reboot",            "swapon",           "swapoff",
                "acct",            "quotactl",          "syslog",           "fanotify_init",
                "settimeofday",    "clock_settime",     "clock_adjtime",    "adjtimex",
                "personality",     "uselib",            "vhangup",          "lookup_dcookie",
        };
        _cleanup_(seccomp_releasep) scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx)
                return -ENOMEM;
        int r;
        for (size_t i = 0; i < ELEMENTSOF(denied); i++) {
                int nr = seccomp_syscall_resolve_name(denied[i]);
                if (nr == __NR_SCMP_ERROR)
                        continue; /* not on this architecture */
                if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0)) < 0)
                        return r;
        }
        /* Threads, yes; namespaces, no. clone3 keeps its flags where the
         * filter cannot read them: ENOSYS, and libc falls back to clone. */
        static const scmp_datum_t ns[] = { CLONE_NEWUSER, CLONE_NEWNS,  CLONE_NEWPID,   CLONE_NEWNET,
                                           CLONE_NEWIPC,  CLONE_NEWUTS, CLONE_NEWCGROUP };
        if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(unshare), 0)) < 0 ||
            (r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0)) < 0)
                return r;
        for (size_t i = 0; i < ELEMENTSOF(ns); i++)
                if ((r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                          SCMP_A0(SCMP_CMP_MASKED_EQ, ns[i], ns[i]))) < 0)
                        return r;
        return seccomp_load(ctx);
}

/* What the command line sets besides the proxy's own settings. */
typedef struct Options {
        const char *state_dir, *user, *extra_ca, *trust_ca;
        bool help, version;
} Options;

static int opt_state_dir(Proxy *p, Options *o, const char *arg) {
        o->state_dir = arg;
        return 0;
}

static int opt_user(Proxy *p, Options *o, const char *arg) {
        o->user = arg;
        return 0;
}

static int opt_max_connections(Proxy *p, Options *o, const char *arg) {
        char *end;
        unsigned long v = strtoul(arg, &end, 10);
        if (*end || v < 1 || v > 65536)
                return -EINVAL;
        p->max_conns = (unsigned)v;
        return 0;
}

static int opt_test_upstream(Proxy *p, Options *o, const char *arg) {
        if (p->n_test_hosts >= MAX_TEST_UPSTREAMS || egress_test_host_parse(arg, &p->test_hosts[p->n_test_hosts]) < 0)
                return -EINVAL;
        p->n_test_hosts++;
        return 0;
}

static int opt_extra_ca(Proxy *p, Options *o, const char *arg) {
        o->extra_ca = arg;
        return 0;
}

static int opt_public_cidr(Proxy *p, Options *o, const char *arg) {
        /* runtimed checked the range against this host's addresses before
         * passing it on. */
        if (p->n_public_cidrs >= EGRESS_MAX_PUBLIC_CIDRS || egress_cidr_parse(arg, &p->public_cidrs[p->n_public_cidrs]) < 0)
                return -EINVAL;
        p->n_public_cidrs++;
        return 0;
}

static int opt_trust_ca(Proxy *p, Options *o, const char *arg) {
        o->trust_ca = arg;
        return 0;
}

static int opt_log_level(Proxy *p, Options *o, const char *arg) {
        LogLevel l;
        if (log_parse_level(arg, &l) < 0)
                return -EINVAL;
        log_set_level(l);
        return 0;
}

static int opt_help(Proxy *p, Options *o, const char *arg) {
        o->help = true;
        return 0;
}

static int opt_version(Proxy *p, Options *o, const char *arg) {
        o->version = true;
        return 0;
}

/* Every option, read by the parser and by --help. */
static const struct EgressOption {
        const char *name;
        const char *value; /* NULL: takes none */
        const char *help;
        int (*apply)(Proxy *p, Options *o, const char *arg);
} egress_options[] = {
        { "state-dir", "DIR", "the daemon's state directory (the CA lives there); required", opt_state_dir },
        { "user", "NAME", "the user it becomes once the CA is loaded (default runtime-egress)", opt_user },
        { "max-connections", "N", "connections served at once, 1-65536 (default 256)", opt_max_connections },
        { "test-upstream", "NAME=127.0.0.1:PORT", "tests only: NAME resolves there (repeatable)", opt_test_upstream },
        { "extra-ca", "FILE", "more CAs the upstreams are verified against", opt_extra_ca },
        { "public-cidr", "CIDR", "an operator range counted as public (repeatable)", opt_public_cidr },
        { "trust-ca", "FILE", "a CA bundle trusted for upstreams besides the host's", opt_trust_ca },
        { "log-level", "LEVEL", "error, warn, info or debug", opt_log_level },
        { "version", NULL, "print the version", opt_version },
        /* Last: -h is its row. */
        { "help", NULL, "this help", opt_help },
};

static void usage(FILE *f) {
        fputs("usage: runtime-egress --state-dir DIR [OPTION]...\n"
              "Started by runtimed with its control socket on fd 3; not for direct use.\n",
              f);
        for (size_t i = 0; i < ELEMENTSOF(egress_options); i++) {
                const struct EgressOption *o = &egress_options[i];
                char left[64];
                snprintf(left, sizeof(left), "--%s%s%s", o->name, o->value ? " " : "", o->value ? o->value : "");
                fprintf(f, "  %-36s %s\n", left, o->help);
        }
}

/* The command line into p and o: 0, or the exit code of a usage error. */
static int parse_options(int argc, char **argv, Proxy *p, Options *o) {
        struct option opts[ELEMENTSOF(egress_options) + 1] = { 0 };
        for (size_t i = 0; i < ELEMENTSOF(egress_options); i++)
                opts[i] = (struct option){ egress_options[i].name,
                                           egress_options[i].value ? required_argument : no_argument, NULL, (int)i };
        int c, longidx;
        opterr = 0;
        while ((longidx = -1, c = getopt_long(argc, argv, "h", opts, &longidx)) != -1) {
                if (c == 'h')
                        c = (int)ELEMENTSOF(egress_options) - 1;
                if (c < 0 || (size_t)c >= ELEMENTSOF(egress_options)) {
                        usage(stderr);
                        return 2;
                }
                if (egress_options[c].apply(p, o, optarg) < 0) {
                        fprintf(stderr, "runtime-egress: bad --%s %s\n", egress_options[c].name, optarg ? optarg : "");
                        return 2;
                }
        }
        if (!o->help && !o->version && (!o->state_dir || optind < argc)) {
                usage(stderr);
                return 2;
        }
        return 0;
}

/* As root: the CA and the upstream trust; then the privileges dropped and
 * the filter loaded, before a byte of a sandbox is read; then the CA's
 * certificate to runtimed. */
static int prepare(Proxy *p, const Options *o) {
        int r;
        if ((r = egress_ca_load_or_create(o->state_dir, &p->ca)) < 0) {
                log_error(NULL, "runtime-egress: cannot load or make the CA in the state directory: %s",
                          strerror(-r));
                return r;
        }
        if ((r = egress_upstream_ctx_new(o->extra_ca, &p->upstream_ctx)) < 0) {
                log_error(NULL, "runtime-egress: cannot load the upstream trust store");
                return r;
        }
        if (o->trust_ca) {
                _cleanup_free_ char *trusted = NULL;
                unsigned n_trusted = 0;
                char err[256] = "";
                if ((r = egress_ca_bundle_load(o->trust_ca, &trusted, &n_trusted, err, sizeof(err))) < 0 ||
                    (r = egress_ca_bundle_trust(p->upstream_ctx, trusted)) < 0) {
                        log_error(NULL, "runtime-egress: cannot trust %s upstream %s", o->trust_ca, err);
                        return r;
                }
        }
        if ((r = drop_privileges(o->user)) < 0) {
                log_error(NULL, "runtime-egress: cannot drop root and capabilities: %s", strerror(-r));
                return r;
        }
        if ((r = seccomp_load_denials()) < 0) {
                log_error(NULL, "runtime-egress: cannot load its seccomp filter: %s", strerror(-r));
                return r;
        }
        _cleanup_json_ json_t *hello = json_pack("{s:s}", "ca", egress_ca_pem(p->ca));
        _cleanup_free_ char *text = hello ? json_dumps(hello, JSON_COMPACT) : NULL;
        if (!text || send(CTL_FD, text, strlen(text), MSG_NOSIGNAL) < 0)
                return -EIO;
        return 0;
}

/* Each connection runtimed sends, on a thread of its own, until runtimed
 * closes the control socket. */
static void serve(Proxy *p) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        for (;;) {
                int data = -1, meta = -1;
                int r = egress_wire_recv_conn(CTL_FD, &data, &meta);
                if (r == -EBADMSG)
                        continue;
                if (r < 0)
                        break; /* runtimed is gone, or closed us */
                /* runtimed's pool bounds the connections it sends; this
                 * holds the proxy to it however they arrive. */
                pthread_mutex_lock(&p->lock);
                while (p->active >= p->max_conns)
                        pthread_cond_wait(&p->freed, &p->lock);
                p->active++;
                pthread_mutex_unlock(&p->lock);
                Conn *conn = malloc(sizeof(*conn));
                pthread_t t;
                if (conn) {
                        *conn = (Conn){ .p = p, .data = data, .meta = meta };
                        if (pthread_create(&t, &attr, conn_main, conn) == 0)
                                continue;
                        free(conn);
                }
                close(data);
                close(meta);
                pthread_mutex_lock(&p->lock);
                p->active--;
                pthread_mutex_unlock(&p->lock);
        }
}

int main(int argc, char **argv) {
        static Proxy p = { .max_conns = 256, .lock = PTHREAD_MUTEX_INITIALIZER, .freed = PTHREAD_COND_INITIALIZER };
        Options o = { .user = "runtime-egress" };
        int r = parse_options(argc, argv, &p, &o);
        if (r != 0)
                return r;
        if (o.help) {
                usage(stdout);
                return 0;
        }
        if (o.version) {
                printf("runtime-egress %s\n", RUNTIME_VERSION);
                return 0;
        }
        int type = 0;
        socklen_t tl = sizeof(type);
        if (getsockopt(CTL_FD, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_SEQPACKET) {
                fprintf(stderr, "runtime-egress: fd 3 is not runtimed's control socket\n");
                return 2;
        }
        signal(SIGPIPE, SIG_IGN);
        if (prepare(&p, &o) < 0)
                return 1;
        serve(&p);
        /* Connections in flight end with the process: their sockets close,
         * and the daemon fails them cleanly. */
        _exit(0);
}
