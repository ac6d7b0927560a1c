/* runtimed: the Runtime daemon. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <netdb.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/macro.h"
#include "common/path.h"
#include "common/random.h"
#include "daemon/api.h"
#include "daemon/routes.h"
#include "daemon/api_terminal.h"
#include "daemon/api_tunnel.h"
#include "daemon/auth.h"
#include "daemon/caps.h"
#include "daemon/config.h"
#include "daemon/db.h"
#include "daemon/doctor.h"
#include "daemon/keys.h"
#include "daemon/ledger.h"
#include "common/log.h"
#include "daemon/sandbox.h"

static void usage(FILE *f) {
        fputs("Usage: runtimed [OPTIONS]\n"
              "       runtimed --doctor [--json]\n\n"
              "Serves the Runtime HTTP API: sandboxes for running untrusted code.\n\n"
              "  --listen ADDR:PORT           TCP address (default 127.0.0.1:7878)\n"
              "  --socket PATH                serve on a unix socket instead\n"
              "  --state-dir DIR              state (default /var/lib/runtime as root, else\n"
              "                               $XDG_STATE_HOME/runtime or ~/.local/state/runtime;\n"
              "                               env RUNTIME_STATE_DIR)\n"
              "  --image-dir DIR              images (default <state-dir>/images)\n"
              "  --driver auto|NAME           the default driver (default auto)\n"
              "  --drivers LIST               drivers offered, comma-separated (default: every\n"
              "                               driver whose probe passes)\n"
              "  --agent PATH                 the runtime-agent binary\n"
              "  --image-builder PATH         the runtime-image-build program\n"
              "  --egress-proxy PATH          the runtime-egress program\n"
              "  --cgroup-parent NAME         cgroup under which sandboxes live (default runtime)\n"
              "  --max-sandboxes N            (256)   --max-sandboxes-per-key N (128)\n"
              "  --max-vcpu N                 (8)     --max-memory-mib N        (16384)\n"
              "  --max-disk-mib N             (65536) --max-file-mib N          (1024)\n"
              "  --max-connections N          (512)\n"
              "  --heartbeat-interval-ms N    ping each sandbox's agent this often (5000)\n"
              "  --heartbeat-timeout-ms N     fail a sandbox whose agent is silent this long\n"
              "                               while a ping waits (default per driver: 30000,\n"
              "                               microvm 90000); both 1000..600000\n"
              "  --price-vcpu-hour-micros N   (9375)  --price-gib-hour-micros N (3125)\n"
              "  --price-disk-gib-hour-micros N  a paused sandbox's disk, per GiB of diskMiB (100)\n"
              "  --idle-pause-min-seconds N   the shortest idlePauseSeconds; shorter is raised to it (60)\n"
              "  --trial-hours N              free sandbox-hours per trial key (50)\n"
              "  --max-trial-keys N           trial keys handed out on this host, 0: none (100)\n"
              "  --egress-public-cidr CIDR    treat addresses in CIDR as public upstreams, for a\n"
              "                               package gateway or proxy on a private or reserved\n"
              "                               address (repeatable; never loopback, link-local,\n"
              "                               metadata or this host's own addresses)\n"
              "  --egress-trust-ca FILE       trust the CA certificates in FILE (PEM) for upstream\n"
              "                               TLS and inside every sandbox\n"
              "  --egress-workers N           threads serving egress connections at once, each\n"
              "                               with one more for a tunnel (256; 1..4096)\n"
              "  --egress-workers-per-sandbox N  of those, at most N for one sandbox (64)\n"
              "  --egress-wait-timeout-ms N   a connection waiting for a worker longer than this\n"
              "                               is refused with a 503 (30000; 100..600000)\n"
              "  --egress-test-upstream NAME=127.0.0.1:PORT\n"
              "                               TESTS ONLY: the egress proxy sends NAME to this loopback\n"
              "                               server, past the address checks (repeatable)\n"
              "  --egress-extra-ca FILE       TESTS ONLY: also trust FILE for upstream certificates\n"
              "  --log-level error|warn|info|debug (info)\n"
              "  --doctor [--json]            print what this host supports and exit\n"
              "  --help, --version\n",
              f);
}

static int parse_uint(const char *opt, const char *s, unsigned long long max, unsigned long long *ret) {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(s, &end, 10);
        if (errno || end == s || *end || s[0] == '-' || v > max) {
                fprintf(stderr, "runtimed: --%s wants a number up to %llu, not '%s'\n", opt, max, s);
                return -EINVAL;
        }
        *ret = v;
        return 0;
}

static const char *option_name(const struct option *opts, int val) {
        for (; opts->name; opts++)
                if (opts->val == val)
                        return opts->name;
        return "option";
}

static char *default_state_dir(void) {
        const char *env = getenv("RUNTIME_STATE_DIR");
        char *s = NULL;
        if (env && *env)
                return strdup(env);
        if (geteuid() == 0)
                return strdup("/var/lib/runtime");
        const char *xdg = getenv("XDG_STATE_HOME");
        if (xdg && *xdg && asprintf(&s, "%s/runtime", xdg) >= 0)
                return s;
        const char *home = getenv("HOME");
        if (!home || !*home) {
                struct passwd *pw = getpwuid(geteuid());
                home = pw ? pw->pw_dir : "/";
        }
        if (asprintf(&s, "%s/.local/state/runtime", home) < 0)
                return NULL;
        return s;
}

/* mkdir -p, with the last component 0700 and owned by us. */
static int make_state_dir(const char *path) {
        _cleanup_free_ char *p = strdup(path);
        if (!p)
                return -ENOMEM;
        for (char *s = p + 1; *s; s++)
                if (*s == '/') {
                        *s = '\0';
                        if (mkdir(p, 0755) < 0 && errno != EEXIST)
                                return -errno;
                        *s = '/';
                }
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
                return -errno;
        struct stat st;
        if (lstat(p, &st) < 0)
                return -errno;
        if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid())
                return -EPERM;
        if ((st.st_mode & 07777) != 0700 && chmod(p, 0700) < 0)
                return -errno;
        return 0;
}

/* A layer pool (scripts/layer-pool.sh) is an image beside the state dir,
 * loop-mounted on it. After a reboot the mount is gone: a daemon started then
 * would make a new, empty state on the filesystem under it and lose sight of
 * every sandbox and snapshot. So an image without its mount stops the start.
 * The mount is told by the directory being on another device than its parent. */
static int check_layer_pool(const char *state_dir) {
        _cleanup_free_ char *img = NULL, *parent = NULL;
        if (asprintf(&img, "%s.layer-pool.img", state_dir) < 0 || asprintf(&parent, "%s/..", state_dir) < 0)
                return -ENOMEM;
        struct stat si, sd, sp;
        if (stat(img, &si) < 0)
                return errno == ENOENT ? 0 : -errno;
        if (stat(state_dir, &sd) < 0 || stat(parent, &sp) < 0)
                return -errno;
        if (sd.st_dev == sp.st_dev) {
                log_error(NULL, "the layer pool %s is not mounted at %s (a reboot unmounts it): "
                          "run scripts/layer-pool.sh %s, then start runtimed again", img, state_dir, state_dir);
                return -ENOENT;
        }
        return 0;
}

/* Whether the API's TCP port is one only NET_BIND_SERVICE may bind. */
static bool listen_port_privileged(const DaemonConfig *cfg) {
        if (cfg->socket_path)
                return false;
        const char *colon = strrchr(cfg->listen_addr, ':');
        char *end;
        unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
        return colon && *end == '\0' && port < 1024;
}

/* A companion program next to our own executable, else in ../libexec/runtime/. */
static char *find_companion(const char *name) {
        char self[PATH_MAX];
        if (path_self_dir(self, sizeof self) < 0)
                return strdup(name);
        char *p = NULL;
        if (asprintf(&p, "%s/%s", self, name) < 0)
                return NULL;
        if (access(p, X_OK) == 0)
                return p;
        free(p);
        if (asprintf(&p, "%s/../libexec/runtime/%s", self, name) < 0)
                return NULL;
        return p;
}

static int ensure_admin_key(Db *db, const char *state_dir) {
        int64_t n;
        int r = db_key_count(db, &n);
        if (r < 0 || n > 0)
                return r;
        char key[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1], idhex[17], id[24];
        if ((r = auth_generate_key(key)) < 0 || (r = auth_hash_key(key, hash)) < 0 || (r = random_hex(idhex, 8)) < 0)
                return r;
        snprintf(id, sizeof(id), "key_%s", idhex);
        _cleanup_close_ int dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        _cleanup_close_ int fd = -1;
        for (int attempt = 0; attempt < 2 && fd < 0; attempt++) {
                fd = openat(dfd, "admin.key", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
                if (fd < 0 && errno == EEXIST && attempt == 0) {
                        /* A key file without any key in the database is stale: it opens nothing. */
                        log_warn(NULL, "replacing a stale admin.key (the database has no keys)");
                        if (unlinkat(dfd, "admin.key", 0) < 0)
                                return -errno;
                } else if (fd < 0)
                        return -errno;
        }
        char line[AUTH_KEY_LEN + 2];
        snprintf(line, sizeof(line), "%s\n", key);
        if (write(fd, line, strlen(line)) != (ssize_t)strlen(line) || fsync(fd) < 0)
                return -EIO;
        if ((r = db_key_insert(db, id, "admin", "admin", true, hash, false)) < 0) {
                unlinkat(dfd, "admin.key", 0);
                return r;
        }
        log_info(NULL, "made the admin key: %s/admin.key", state_dir);
        return 0;
}

static int listen_tcp(const char *spec, char *desc, size_t desc_len) {
        _cleanup_free_ char *s = strdup(spec);
        if (!s)
                return -ENOMEM;
        char *host = s, *port = strrchr(s, ':');
        if (!port)
                return -EINVAL;
        *port++ = '\0';
        if (host[0] == '[') {
                host++;
                char *end = strchr(host, ']');
                if (!end)
                        return -EINVAL;
                *end = '\0';
        }
        struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                                  .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE };
        struct addrinfo *ai = NULL;
        if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
                return -EINVAL;
        int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0) {
                freeaddrinfo(ai);
                return -errno;
        }
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, 512) < 0) {
                int r = -errno;
                close(fd);
                freeaddrinfo(ai);
                return r;
        }
        freeaddrinfo(ai);
        snprintf(desc, desc_len, "http://%s", spec);
        return fd;
}

static int listen_unix(const char *path, char *desc, size_t desc_len) {
        struct sockaddr_un sa = { .sun_family = AF_UNIX };
        if (strlen(path) >= sizeof(sa.sun_path))
                return -ENAMETOOLONG;
        strcpy(sa.sun_path, path);
        struct stat st;
        /* Replace a socket left by an earlier run, never any other file. */
        if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
                unlink(path);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
                return -errno;
        mode_t old = umask(0117);
        int r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
        umask(old);
        if (r < 0 || listen(fd, 512) < 0) {
                r = -errno;
                close(fd);
                return r;
        }
        snprintf(desc, desc_len, "unix:%s", path);
        return fd;
}

enum {
        OPT_LISTEN = 256,
        OPT_SOCKET,
        OPT_STATE_DIR,
        OPT_IMAGE_DIR,
        OPT_DRIVER,
        OPT_DRIVERS,
        OPT_AGENT,
        OPT_BUILDER,
        OPT_CGROUP,
        OPT_MAX_SANDBOXES,
        OPT_MAX_PER_KEY,
        OPT_MAX_VCPU,
        OPT_MAX_MEMORY,
        OPT_MAX_DISK,
        OPT_MAX_FILE,
        OPT_MAX_CONN,
        OPT_PRICE_VCPU,
        OPT_PRICE_GIB,
        OPT_PRICE_DISK,
        OPT_IDLE_PAUSE_MIN,
        OPT_TRIAL_HOURS,
        OPT_MAX_TRIAL_KEYS,
        OPT_EGRESS_TEST_UPSTREAM,
        OPT_EGRESS_EXTRA_CA,
        OPT_EGRESS_PUBLIC_CIDR,
        OPT_EGRESS_TRUST_CA,
        OPT_EGRESS_WORKERS,
        OPT_EGRESS_PROXY,
        OPT_EGRESS_WORKERS_PER_SANDBOX,
        OPT_EGRESS_WAIT_TIMEOUT,
        OPT_LOG_LEVEL,
        OPT_HEARTBEAT_INTERVAL,
        OPT_HEARTBEAT_TIMEOUT,
        OPT_DOCTOR,
        OPT_JSON,
        OPT_VERSION,
};

int main(int argc, char **argv) {
        static const struct option opts[] = {
                { "listen", required_argument, NULL, OPT_LISTEN },
                { "socket", required_argument, NULL, OPT_SOCKET },
                { "state-dir", required_argument, NULL, OPT_STATE_DIR },
                { "image-dir", required_argument, NULL, OPT_IMAGE_DIR },
                { "driver", required_argument, NULL, OPT_DRIVER },
                { "drivers", required_argument, NULL, OPT_DRIVERS },
                { "agent", required_argument, NULL, OPT_AGENT },
                { "image-builder", required_argument, NULL, OPT_BUILDER },
                { "cgroup-parent", required_argument, NULL, OPT_CGROUP },
                { "max-sandboxes", required_argument, NULL, OPT_MAX_SANDBOXES },
                { "max-sandboxes-per-key", required_argument, NULL, OPT_MAX_PER_KEY },
                { "max-vcpu", required_argument, NULL, OPT_MAX_VCPU },
                { "max-memory-mib", required_argument, NULL, OPT_MAX_MEMORY },
                { "max-disk-mib", required_argument, NULL, OPT_MAX_DISK },
                { "max-file-mib", required_argument, NULL, OPT_MAX_FILE },
                { "max-connections", required_argument, NULL, OPT_MAX_CONN },
                { "price-vcpu-hour-micros", required_argument, NULL, OPT_PRICE_VCPU },
                { "price-gib-hour-micros", required_argument, NULL, OPT_PRICE_GIB },
                { "price-disk-gib-hour-micros", required_argument, NULL, OPT_PRICE_DISK },
                { "idle-pause-min-seconds", required_argument, NULL, OPT_IDLE_PAUSE_MIN },
                { "trial-hours", required_argument, NULL, OPT_TRIAL_HOURS },
                { "max-trial-keys", required_argument, NULL, OPT_MAX_TRIAL_KEYS },
                { "egress-test-upstream", required_argument, NULL, OPT_EGRESS_TEST_UPSTREAM },
                { "egress-extra-ca", required_argument, NULL, OPT_EGRESS_EXTRA_CA },
                { "egress-public-cidr", required_argument, NULL, OPT_EGRESS_PUBLIC_CIDR },
                { "egress-trust-ca", required_argument, NULL, OPT_EGRESS_TRUST_CA },
                { "egress-workers", required_argument, NULL, OPT_EGRESS_WORKERS },
                { "egress-proxy", required_argument, NULL, OPT_EGRESS_PROXY },
                { "egress-workers-per-sandbox", required_argument, NULL, OPT_EGRESS_WORKERS_PER_SANDBOX },
                { "egress-wait-timeout-ms", required_argument, NULL, OPT_EGRESS_WAIT_TIMEOUT },
                { "log-level", required_argument, NULL, OPT_LOG_LEVEL },
                { "heartbeat-interval-ms", required_argument, NULL, OPT_HEARTBEAT_INTERVAL },
                { "heartbeat-timeout-ms", required_argument, NULL, OPT_HEARTBEAT_TIMEOUT },
                { "doctor", no_argument, NULL, OPT_DOCTOR },
                { "json", no_argument, NULL, OPT_JSON },
                { "help", no_argument, NULL, 'h' },
                { "version", no_argument, NULL, OPT_VERSION },
                {},
        };
        DaemonConfig cfg = {
                .listen_addr = "127.0.0.1:7878",
                .cgroup_parent = "runtime",
                .max_sandboxes = 256,
                .max_sandboxes_per_key = 128,
                .max_vcpu = 8,
                .max_memory_mib = 16384,
                .max_disk_mib = 65536,
                .max_file_mib = 1024,
                .max_connections = 512,
                .price_vcpu_hour_micros = 9375,
                .price_gib_hour_micros = 3125,
                .price_disk_gib_hour_micros = 100,
                .idle_pause_min_seconds = 60,
                .trial_allowance_seconds = KEYS_TRIAL_ALLOWANCE_SECONDS,
                .max_trial_keys = 100,
        };
        const char *driver_opt = "auto", *drivers_opt = NULL;
        char *state_dir = NULL, *image_dir = NULL, *agent = NULL, *builder = NULL, *microvm_builder = NULL;
        const char *egress_proxy = NULL;
        unsigned egress_wait_ms = 0;
        bool doctor = false, json = false;
        int64_t hb_interval_ms = 0, hb_timeout_ms = 0;
        int c;
        while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
                unsigned long long v = 0;
                int r = 0;
                switch (c) {
                case OPT_LISTEN:
                        cfg.listen_addr = optarg;
                        break;
                case OPT_SOCKET:
                        cfg.socket_path = optarg;
                        break;
                case OPT_STATE_DIR:
                        state_dir = strdup(optarg);
                        break;
                case OPT_IMAGE_DIR:
                        image_dir = strdup(optarg);
                        break;
                case OPT_DRIVER:
                        driver_opt = optarg;
                        break;
                case OPT_DRIVERS:
                        drivers_opt = optarg;
                        break;
                case OPT_AGENT:
                        agent = strdup(optarg);
                        break;
                case OPT_BUILDER:
                        builder = strdup(optarg);
                        break;
                case OPT_CGROUP:
                        cfg.cgroup_parent = optarg;
                        break;
#define UINT_OPT(id, field, max)                                                                            \
        case id:                                                                                            \
                if ((r = parse_uint(option_name(opts, c), optarg, max, &v)) == 0)                          \
                        cfg.field = v;                                                                      \
                break;
                UINT_OPT(OPT_MAX_SANDBOXES, max_sandboxes, 100000)
                UINT_OPT(OPT_MAX_PER_KEY, max_sandboxes_per_key, 100000)
                UINT_OPT(OPT_MAX_VCPU, max_vcpu, 1024)
                UINT_OPT(OPT_MAX_MEMORY, max_memory_mib, 16u * 1024 * 1024)
                UINT_OPT(OPT_MAX_DISK, max_disk_mib, 64u * 1024 * 1024)
                UINT_OPT(OPT_MAX_FILE, max_file_mib, 1024u * 1024)
                UINT_OPT(OPT_MAX_CONN, max_connections, 65536)
                UINT_OPT(OPT_PRICE_VCPU, price_vcpu_hour_micros, 1000000000000ULL)
                UINT_OPT(OPT_PRICE_GIB, price_gib_hour_micros, 1000000000000ULL)
                UINT_OPT(OPT_PRICE_DISK, price_disk_gib_hour_micros, 1000000000000ULL)
                UINT_OPT(OPT_IDLE_PAUSE_MIN, idle_pause_min_seconds, 86400)
                UINT_OPT(OPT_MAX_TRIAL_KEYS, max_trial_keys, 100000)
                case OPT_HEARTBEAT_INTERVAL:
                case OPT_HEARTBEAT_TIMEOUT:
                        if ((r = parse_uint(option_name(opts, c), optarg, 600000, &v)) == 0 && v < 1000) {
                                fprintf(stderr, "runtimed: --%s is 1000..600000 ms\n", option_name(opts, c));
                                r = -EINVAL;
                        }
                        if (r == 0 && c == OPT_HEARTBEAT_INTERVAL)
                                hb_interval_ms = (int64_t)v;
                        else if (r == 0)
                                hb_timeout_ms = (int64_t)v;
                        break;
                case OPT_TRIAL_HOURS:
                        if ((r = parse_uint(option_name(opts, c), optarg, 100000, &v)) == 0)
                                cfg.trial_allowance_seconds = (int64_t)v * 3600;
                        break;
                case OPT_EGRESS_TEST_UPSTREAM:
                        if (cfg.n_egress_test_upstreams >= ELEMENTSOF(cfg.egress_test_upstreams)) {
                                fprintf(stderr, "runtimed: at most %zu --egress-test-upstream\n",
                                        ELEMENTSOF(cfg.egress_test_upstreams));
                                return 2;
                        }
                        cfg.egress_test_upstreams[cfg.n_egress_test_upstreams++] = optarg;
                        break;
                case OPT_EGRESS_EXTRA_CA:
                        cfg.egress_extra_ca = optarg;
                        break;
                case OPT_EGRESS_PUBLIC_CIDR:
                        if (cfg.n_egress_public_cidrs >= ELEMENTSOF(cfg.egress_public_cidrs)) {
                                fprintf(stderr, "runtimed: at most %zu --egress-public-cidr\n",
                                        ELEMENTSOF(cfg.egress_public_cidrs));
                                return 2;
                        }
                        cfg.egress_public_cidrs[cfg.n_egress_public_cidrs++] = optarg;
                        break;
                case OPT_EGRESS_TRUST_CA:
                        cfg.egress_trust_ca = optarg;
                        break;
                case OPT_EGRESS_PROXY:
                        egress_proxy = optarg;
                        break;
                case OPT_EGRESS_WORKERS:
                case OPT_EGRESS_WORKERS_PER_SANDBOX:
                        if ((r = parse_uint(option_name(opts, c), optarg, EGRESS_MAX_WORKERS, &v)) == 0 && v == 0) {
                                fprintf(stderr, "runtimed: --%s wants at least 1\n", option_name(opts, c));
                                r = -EINVAL;
                        }
                        if (r == 0 && c == OPT_EGRESS_WORKERS)
                                cfg.egress_workers = (unsigned)v;
                        else if (r == 0)
                                cfg.egress_workers_per_sandbox = (unsigned)v;
                        break;
                case OPT_EGRESS_WAIT_TIMEOUT:
                        if ((r = parse_uint(option_name(opts, c), optarg, EGRESS_MAX_WAIT_TIMEOUT_MS, &v)) == 0 &&
                            v < EGRESS_MIN_WAIT_TIMEOUT_MS) {
                                fprintf(stderr, "runtimed: --%s is %u..%u ms\n", option_name(opts, c),
                                        EGRESS_MIN_WAIT_TIMEOUT_MS, EGRESS_MAX_WAIT_TIMEOUT_MS);
                                r = -EINVAL;
                        }
                        if (r == 0)
                                egress_wait_ms = (unsigned)v;
                        break;
                case OPT_LOG_LEVEL: {
                        LogLevel l;
                        if (log_parse_level(optarg, &l) < 0) {
                                fprintf(stderr, "runtimed: --log-level is error, warn, info or debug\n");
                                return 2;
                        }
                        log_set_level(l);
                        break;
                }
                case OPT_DOCTOR:
                        doctor = true;
                        break;
                case OPT_JSON:
                        json = true;
                        break;
                case 'h':
                        usage(stdout);
                        return 0;
                case OPT_VERSION:
                        printf("runtimed %s\n", RUNTIME_VERSION);
                        return 0;
                default:
                        usage(stderr);
                        return 2;
                }
                if (r < 0)
                        return 2;
        }
        if (optind < argc) {
                fprintf(stderr, "runtimed: unexpected argument '%s'\n", argv[optind]);
                return 2;
        }
        if (cfg.max_vcpu < 1 || cfg.max_memory_mib < 64 || cfg.max_disk_mib < 64 || cfg.max_connections < 1) {
                fprintf(stderr, "runtimed: --max-vcpu >= 1, --max-memory-mib and --max-disk-mib >= 64\n");
                return 2;
        }
        if (doctor) {
                _cleanup_free_ char *dir = state_dir ? strdup(state_dir) : default_state_dir();
                return doctor_run(json, dir);
        }

        signal(SIGPIPE, SIG_IGN);
        /* Before any thread: capsets are per thread. What nothing ever
         * uses goes first, before the drivers' probes run; the rest of what
         * the offered drivers do not use once they are chosen, below. */
        if (geteuid() == 0) {
                int cr = caps_keep_only(~caps_never_needed());
                if (cr < 0) {
                        log_error(NULL, "cannot drop the capabilities no driver needs: %s", strerror(-cr));
                        return 1;
                }
        }
        /* Every thread inherits this mask; main alone waits for the signals. */
        sigset_t stop_signals;
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGTERM);
        sigaddset(&stop_signals, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

        if (!state_dir)
                state_dir = default_state_dir();
        if (!state_dir) {
                log_error(NULL, "out of memory");
                return 1;
        }
        int r = check_layer_pool(state_dir);
        if (r == -ENOENT)
                return 1;
        if (r < 0) {
                log_error(NULL, "cannot check the layer pool beside %s: %s", state_dir, strerror(-r));
                return 1;
        }
        r = make_state_dir(state_dir);
        if (r < 0) {
                log_error(NULL, "cannot use the state directory %s: %s", state_dir, strerror(-r));
                return 1;
        }
        {
                char why[PATH_MAX + 256];
                (void)doctor_layer_copies(state_dir, why, sizeof why);
                log_info(NULL, "layer copies (snapshots, forks, new layers): %s", why);
        }
        if (!image_dir && asprintf(&image_dir, "%s/images", state_dir) < 0)
                return 1;
        if (!agent)
                agent = find_companion("runtime-agent");
        if (!builder)
                builder = find_companion("runtime-image-build");
        cfg.state_dir = state_dir;
        cfg.image_dir = image_dir;
        cfg.agent_path = agent;
        cfg.image_builder = builder;
        /* Beside the image builder, so that --image-builder carries both. */
        char *slash = strrchr(builder, '/');
        if (slash && asprintf(&microvm_builder, "%.*s/runtime-microvm-build", (int)(slash - builder), builder) < 0)
                microvm_builder = NULL;
        if (microvm_builder && access(microvm_builder, X_OK) == 0)
                cfg.microvm_builder = microvm_builder;
        if (access(agent, X_OK) < 0)
                log_warn(NULL, "the agent %s is not executable: sandboxes will not start", agent);

        /* Probe each driver once; --drivers narrows what is offered. */
        for (const Driver *const *d = driver_all(); *d && cfg.n_drivers < CONFIG_MAX_DRIVERS; d++) {
                DriverOffer *o = &cfg.drivers[cfg.n_drivers++];
                o->driver = *d;
                o->available = (*d)->probe(o->reason, sizeof(o->reason)) >= 0;
                o->offered = o->available;
                log_info(NULL, "driver %s: %s (%s)", (*d)->name, o->available ? "available" : "unavailable", o->reason);
        }
        if (drivers_opt) {
                _cleanup_free_ char *list = strdup(drivers_opt);
                for (unsigned i = 0; i < cfg.n_drivers; i++)
                        cfg.drivers[i].offered = false;
                char *save = NULL;
                for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                        DriverOffer *o = (DriverOffer *)config_driver_offer(&cfg, tok);
                        if (!o) {
                                log_error(NULL, "--drivers: no driver named %s", tok);
                                return 2;
                        }
                        if (!o->available)
                                log_warn(NULL, "--drivers: %s cannot run here: %s", tok, o->reason);
                        o->offered = o->available;
                }
        }
        if (strcmp(driver_opt, "auto") == 0) {
                char why[1024] = "";
                const Driver *pick = driver_pick_auto(why, sizeof(why));
                const DriverOffer *o = pick ? config_driver_offer(&cfg, pick->name) : NULL;
                if (o && o->offered)
                        cfg.default_driver = pick;
                else
                        for (unsigned i = 0; i < cfg.n_drivers && !cfg.default_driver; i++)
                                if (cfg.drivers[i].offered)
                                        cfg.default_driver = cfg.drivers[i].driver;
                if (cfg.default_driver)
                        log_info(NULL, "default driver (auto): %s; %s", cfg.default_driver->name, why);
                else
                        log_warn(NULL, "no driver can run sandboxes on this host: %s", why);
        } else {
                const DriverOffer *o = config_driver_offer(&cfg, driver_opt);
                if (!o) {
                        log_error(NULL, "--driver: no driver named %s", driver_opt);
                        return 2;
                }
                if (!o->offered) {
                        log_error(NULL, "--driver %s cannot run on this host: %s", driver_opt, o->reason);
                        return 1;
                }
                cfg.default_driver = o->driver;
                log_info(NULL, "default driver: %s", driver_opt);
        }

        if (geteuid() == 0) {
                const char *offered[CONFIG_MAX_DRIVERS];
                size_t n_offered = 0;
                for (unsigned i = 0; i < cfg.n_drivers; i++)
                        if (cfg.drivers[i].offered)
                                offered[n_offered++] = cfg.drivers[i].driver->name;
                CapSet keep = caps_needed(offered, n_offered, listen_port_privileged(&cfg));
                int cr = caps_keep_only(keep);
                if (cr < 0) {
                        log_error(NULL, "cannot drop the capabilities the offered drivers do not need: %s",
                                  cr == -EBUSY ? "a thread started before the drop" : strerror(-cr));
                        return 1;
                }
                char names[1024];
                caps_format(keep, names, sizeof(names));
                log_info(NULL, "capabilities kept for runtimed and the offered drivers: %s", names);
        }

        _cleanup_free_ char *db_path = NULL;
        if (asprintf(&db_path, "%s/runtime.db", state_dir) < 0)
                return 1;
        Db *db = NULL;
        if ((r = db_open(db_path, &db)) < 0) {
                log_error(NULL, "cannot open the database %s: %s", db_path, strerror(-r));
                return 1;
        }
        if ((r = ensure_admin_key(db, state_dir)) < 0) {
                log_error(NULL, "cannot make the admin key: %s", strerror(-r));
                return 1;
        }
        Ledger *ledger = NULL;
        KeyStore *keys = NULL;
        if ((r = ledger_open(db_path, &ledger)) < 0 || (r = keystore_open(db_path, &keys)) < 0) {
                log_error(NULL, "cannot open the ledger in %s: %s", db_path, strerror(-r));
                return 1;
        }
        EgressService *egress = NULL;
        _cleanup_free_ char *egress_proxy_found = egress_proxy ? NULL : find_companion("runtime-egress");
        {
                char why[256] = "";
                EgressServiceConfig ec = { .state_dir = state_dir, .db_path = db_path,
                                           .test_upstreams = cfg.egress_test_upstreams,
                                           .n_test_upstreams = cfg.n_egress_test_upstreams,
                                           .extra_ca_file = cfg.egress_extra_ca,
                                           .public_cidrs = cfg.egress_public_cidrs,
                                           .n_public_cidrs = cfg.n_egress_public_cidrs,
                                           .trust_ca_file = cfg.egress_trust_ca,
                                           .workers = cfg.egress_workers,
                                           .workers_per_sandbox = cfg.egress_workers_per_sandbox,
                                           .wait_timeout_ms = egress_wait_ms,
                                           .proxy_path = egress_proxy ? egress_proxy : egress_proxy_found };
                if ((r = egress_service_new(&ec, &egress, why, sizeof(why))) < 0) {
                        log_error(NULL, "egress: %s", why);
                        return 1;
                }
                for (unsigned i = 0; i < cfg.n_egress_test_upstreams; i++)
                        log_warn(NULL, "TEST SETTING: egress to %s bypasses the address checks; never use "
                                       "--egress-test-upstream outside a test suite", cfg.egress_test_upstreams[i]);
                if (cfg.egress_extra_ca)
                        log_warn(NULL, "TEST SETTING: upstream certificates signed by %s are trusted",
                                 cfg.egress_extra_ca);
                for (unsigned i = 0; i < cfg.n_egress_public_cidrs; i++)
                        log_info(NULL, "egress: addresses in %s count as public upstreams (--egress-public-cidr)",
                                 cfg.egress_public_cidrs[i]);
                if (cfg.egress_trust_ca)
                        log_info(NULL, "egress: the CAs in %s are trusted upstream and in every sandbox",
                                 cfg.egress_trust_ca);
        }
        SnapshotStore *snapshots = NULL;
        if ((r = snapshot_store_open(db_path, state_dir, cfg.price_disk_gib_hour_micros, &snapshots)) < 0) {
                log_error(NULL, "cannot open the snapshot store: %s", strerror(-r));
                return 1;
        }
        snapshot_store_set_ledger(snapshots, ledger);
        if ((r = snapshot_store_recover(snapshots)) < 0)
                log_error(NULL, "recovering snapshots: %s", strerror(-r));
        Uploads *uploads = NULL;
        if ((r = uploads_open(db_path, state_dir, &uploads)) < 0) {
                log_error(NULL, "cannot open the uploads in %s: %s", db_path, strerror(-r));
                return 1;
        }
        Manager *m = NULL;
        if ((r = manager_new(&cfg, db, &m)) < 0 ||
            (manager_set_heartbeat(m, hb_interval_ms, hb_timeout_ms), manager_set_ledger(m, ledger),
             manager_set_egress(m, egress), manager_set_snapshots(m, snapshots), manager_set_uploads(m, uploads), r = manager_recover(m)) < 0) {
                log_error(NULL, "recovering sandboxes: %s", strerror(-r));
                return 1;
        }
        {
                /* After the sandboxes: a lease end with onLeaseEnd delete
                 * during recovery has dropped its uploads already. */
                unsigned kept = 0, dropped = 0;
                if ((r = uploads_restore(uploads, (uint64_t)cfg.max_file_mib << 20, &kept, &dropped)) < 0)
                        log_error(NULL, "restoring the uploads in progress: %s", strerror(-r));
                else if (kept || dropped)
                        log_info(NULL, "uploads in progress: %u kept, %u dropped (sandbox deleted, idle an hour, "
                                       "past the bounds or their staging file missing)",
                                 kept, dropped);
        }
        char desc[512];
        int fd = cfg.socket_path ? listen_unix(cfg.socket_path, desc, sizeof(desc))
                                 : listen_tcp(cfg.listen_addr, desc, sizeof(desc));
        if (fd < 0) {
                log_error(NULL, "cannot listen on %s: %s", cfg.socket_path ? cfg.socket_path : cfg.listen_addr,
                          fd == -EINVAL ? "not ADDR:PORT" : strerror(-fd));
                return 1;
        }
        ProcTable *procs = proc_table_new();
        if (!procs) {
                log_error(NULL, "out of memory");
                return 1;
        }
        App app = { .cfg = &cfg, .db = db, .manager = m, .ledger = ledger, .keys = keys, .egress = egress,
                    .procs = procs, .snapshots = snapshots, .uploads = uploads };
        HttpServer *srv = NULL;
        if ((r = http_server_new(api_routes, api_n_routes, &app, db, cfg.max_connections, &srv)) < 0 ||
            (r = http_server_start(srv, fd)) < 0) {
                log_error(NULL, "cannot start the HTTP server");
                return 1;
        }
        if ((r = snapshot_store_start(snapshots)) < 0) {
                log_error(NULL, "cannot start the snapshot expiry: %s", strerror(-r));
                return 1;
        }
        if ((r = uploads_start(uploads)) < 0) {
                log_error(NULL, "cannot start the upload expiry: %s", strerror(-r));
                return 1;
        }
        if ((r = manager_start(m)) < 0) {
                log_error(NULL, "cannot start the lease timer: %s", strerror(-r));
                return 1;
        }
        printf("runtimed listening on %s\n", desc);
        fflush(stdout);
        log_info(NULL, "runtimed %s listening on %s (state %s)", RUNTIME_VERSION, desc, state_dir);

        int sig = 0;
        while (sigwait(&stop_signals, &sig) != 0)
                ;
        log_info(NULL, "signal %d: stopping", sig);
        http_server_quiesce(srv);
        manager_shutdown(m);
        /* Upgraded connections are ours, not the HTTP server's, to end. */
        terminal_close_all();
        tunnel_close_all();
        http_server_stop(srv);
        http_server_free(srv);
        /* After the manager's shutdown closed every channel: each process has
         * ended, and its thread is joined here. */
        proc_table_free(procs);
        manager_free(m);
        uploads_close(uploads);
        snapshot_store_close(snapshots);
        egress_service_free(egress);
        keystore_close(keys);
        ledger_close(ledger);
        db_close(db);
        if (cfg.socket_path)
                unlink(cfg.socket_path);
        log_info(NULL, "stopped");
        free(state_dir);
        free(image_dir);
        free(agent);
        free(builder);
        free(microvm_builder);
        return 0;
}
