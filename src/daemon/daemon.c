/* The wiring of runtimed's parts, in one place: each step a function, each
 * failure logged with what was being done. main.c only reads the options
 * and calls daemon_run. */
#include "daemon/daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <openssl/rand.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/path.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/api/api.h"
#include "daemon/api/api_links.h"
#include "daemon/api/api_mcp.h"
#include "daemon/api/api_previews.h"
#include "daemon/api/api_sessions.h"
#include "daemon/api/preview_proxy.h"
#include "daemon/http/preview_tls.h"
#include "daemon/api/api_terminal.h"
#include "daemon/api/api_tunnel.h"
#include "daemon/model/auth.h"
#include "daemon/caps.h"
#include "daemon/doctor.h"
#include "daemon/egress/egress_seal.h"
#include "daemon/http/forward.h"
#include "daemon/http/hop_tls.h"
#include "daemon/api/routes.h"
#include "daemon/sdnotify.h"
#include "daemon/store/pgdb.h"
#include "daemon/store/store.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/events.h"
#include "daemon/manager/file_links.h"
#include "daemon/manager/previews.h"
#include "daemon/manager/watches.h"
#include "daemon/manager/sessions.h"
#include "daemon/manager/volumes.h"
#include "daemon/manager/user_images.h"
#include "daemon/manager/otel.h"
#include "daemon/manager/request_counts.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/webhooks.h"
#include "daemon/manager/fleet.h"
#include "daemon/manager/process.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/warm_pool.h"
#include "daemon/store/store_hosts.h"

typedef struct Daemon {
        DaemonConfig cfg; /* the options' settings, with the paths worked out below */
        /* What the wiring works out and owns. */
        char *state_dir, *image_dir, *agent, *supervisor, *builder, *microvm_builder, *egress_proxy, *db_path, *db_label;
        Db *db;
        Ledger *ledger;
        KeyStore *keys;
        EgressService *egress;
        SnapshotStore *snapshots;
        Uploads *uploads;
        Manager *manager;
        ProcTable *procs;
        HttpServer *http;
        App app;
        char listening[512]; /* "http://ADDR:PORT" or "unix:PATH" */
        int state_lock;       /* runtimed.lock in the state directory, held while it runs */
        int listen_fd;        /* bound before the store opens: the URL other hosts reach */
        /* This host's record among the hosts (store_hosts.h) and what keeps
         * it alive (manager/fleet.h). */
        const StoreHostOps *host_ops;
        StoreHosts *hosts;
        Fleet *fleet;
        Events *events;
        Webhooks *webhooks;
        Audit *audit;
        Samples *samples;
        RequestCounts *requests;
        Otel *otel;
        FileLinks *links;
        McpSessions *mcp;
        WatchTable *watches; /* the file watches of the sandboxes run here */
        UserImages *user_images; /* NULL: the store keeps no images */
        HttpLinks http_links; /* how the server checks a link: the handlers' functions over app */
        Sessions *sessions;         /* the sandboxes' sessions */
        HttpSessions http_sessions; /* how the server checks a session's token */
        /* Previews (--preview-listen): their records, where they are
         * reached, and their listener (bound before the store opens). */
        Previews *previews;
        Volumes *volumes; /* the volumes' records and disks */
        PreviewSite preview_site;
        int preview_fd;
        PreviewTls *preview_tls; /* --preview-tls-dir; NULL: plain HTTP */
        char preview_listening[512];
        PreviewProxy *preview_proxy;
        int64_t sample_interval_s;
        char fleet_secret[FORWARD_MAX_SECRET + 1]; /* "" : none */
        /* The hop's TLS (--fleet-tls-dir) and its listener (--fleet-listen);
         * NULL and -1: the hop is plain HTTP on the clients' listener. */
        HopTls *hop_tls;
        int hop_fd;
        char hop_listening[512];
} Daemon;

char *daemon_default_state_dir(void) {
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
static int make_state_dir(const char *p) {
        int r = path_mkdir_private(p);
        if (r < 0)
                return r;
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
 * The mount is told by the directory being on another device than its parent.
 * -ENOENT (logged here, with what to do) for a pool that is not mounted. */
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

/* A companion program next to our own executable (the source tree's
 * build/), else in ../libexec/runtime/ beside it (PREFIX/bin and
 * PREFIX/libexec/runtime), else in the libexec directory the build names
 * (RUNTIME_LIBEXECDIR: the package's /usr/libexec/runtime, wherever runtimed
 * itself was started from). */
static char *find_companion(const char *name) {
        char self[PATH_MAX];
        char *p = NULL;
        if (path_self_dir(self, sizeof self) == 0) {
                if (asprintf(&p, "%s/%s", self, name) < 0)
                        return NULL;
                if (access(p, X_OK) == 0)
                        return p;
                free(p);
                if (asprintf(&p, "%s/../libexec/runtime/%s", self, name) < 0)
                        return NULL;
                if (access(p, X_OK) == 0)
                        return p;
                free(p);
        }
        if (asprintf(&p, "%s/%s", RUNTIME_LIBEXECDIR, name) < 0)
                return NULL;
        return p;
}

static int ensure_admin_key(KeyStore *keys, const char *state_dir) {
        int64_t n;
        int r = keystore_count(keys, &n);
        if (r < 0 || n > 0)
                return r;
        char key[AUTH_KEY_LEN + 1], hash[AUTH_HASH_HEX_LEN + 1];
        if ((r = auth_generate_key(key)) < 0 || (r = auth_hash_key(key, hash)) < 0)
                return r;
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
        explicit_bzero(key, sizeof(key));
        explicit_bzero(line, sizeof(line));
        KeyRecord made = { 0 };
        if ((r = keystore_add_admin(keys, hash, &made)) < 0) {
                unlinkat(dfd, "admin.key", 0);
                return r;
        }
        keystore_record_done(&made);
        log_info(NULL, "made the admin key: %s/admin.key", state_dir);
        return 0;
}

/* Whether id may name a host: what the host.id file and --host-id hold. */
static bool host_id_valid(const char *id) {
        size_t n = strlen(id);
        if (n == 0 || n >= sizeof(((HostRecord *)0)->id))
                return false;
        for (const char *c = id; *c; c++)
                if (!(*c >= 'a' && *c <= 'z') && !(*c >= 'A' && *c <= 'Z') && !(*c >= '0' && *c <= '9') &&
                    *c != '_' && *c != '-' && *c != '.')
                        return false;
        return true;
}

/* The fleet's secret from FILE: a regular file of runtimed's user that no
 * one else may read or write (mode 0600 or stricter), holding 16 to 256
 * printable bytes (a final newline dropped). */
static int load_fleet_secret(const char *path, char *ret, size_t n, const char **why) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        struct stat st;
        *why = "cannot be read";
        if (fd < 0 || fstat(fd, &st) < 0)
                return -errno;
        *why = "is not a regular file of runtimed's user with mode 0600";
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0077))
                return -EPERM;
        char buf[FORWARD_MAX_SECRET + 3];
        ssize_t len = read(fd, buf, sizeof(buf) - 1);
        *why = "cannot be read";
        if (len < 0)
                return -errno;
        buf[len] = '\0';
        if (len > 0 && buf[len - 1] == '\n')
                buf[--len] = '\0';
        *why = "must hold 16 to 256 printable bytes";
        if (len < 16 || len > FORWARD_MAX_SECRET || (size_t)len >= n)
                return -EINVAL;
        for (ssize_t i = 0; i < len; i++)
                if ((unsigned char)buf[i] < 0x21 || (unsigned char)buf[i] > 0x7e)
                        return -EINVAL;
        memcpy(ret, buf, (size_t)len + 1);
        explicit_bzero(buf, sizeof(buf));
        return 0;
}

/* The key egress secrets are sealed with: from `path` (which must be there,
 * a regular file of runtimed's user, mode 0600 or stricter), or the state
 * directory's secrets.key, made with a fresh key at the first start. Never
 * the database's: a copy of the database alone opens no secret. */
static int load_secrets_key(const char *state_dir, const char *path, uint8_t ret[SEAL_KEY_LEN], const char **why) {
        _cleanup_close_ int dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (!path && dfd < 0)
                return -errno;
        _cleanup_close_ int fd = path ? open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)
                                      : openat(dfd, "secrets.key", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        char text[2 * SEAL_KEY_LEN + 2];
        if (fd < 0 && errno == ENOENT && !path) {
                uint8_t k[SEAL_KEY_LEN];
                if (RAND_bytes(k, sizeof(k)) != 1)
                        return -EIO;
                for (size_t i = 0; i < SEAL_KEY_LEN; i++)
                        snprintf(text + 2 * i, 3, "%02x", k[i]);
                text[2 * SEAL_KEY_LEN] = '\n';
                explicit_bzero(k, sizeof(k));
                _cleanup_close_ int wfd = openat(dfd, "secrets.key", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                                                 0600);
                *why = "cannot be made";
                if (wfd < 0)
                        return -errno;
                if (write(wfd, text, 2 * SEAL_KEY_LEN + 1) != 2 * SEAL_KEY_LEN + 1 || fsync(wfd) < 0) {
                        (void)unlinkat(dfd, "secrets.key", 0);
                        return -EIO;
                }
                text[2 * SEAL_KEY_LEN + 1] = '\0';
                int r = seal_key_parse(text, ret);
                explicit_bzero(text, sizeof(text));
                return r;
        }
        struct stat st;
        *why = "cannot be read";
        if (fd < 0 || fstat(fd, &st) < 0)
                return -errno;
        *why = "is not a regular file of runtimed's user with mode 0600";
        if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0077))
                return -EPERM;
        ssize_t len = read(fd, text, sizeof(text) - 1);
        *why = "must hold 64 hex digits";
        if (len < 0)
                return -errno;
        text[len] = '\0';
        int r = seal_key_parse(text, ret);
        explicit_bzero(text, sizeof(text));
        return r;
}

/* The id kept in the state directory's host.id, made on the first start
 * ("host_" and 16 hex digits) so that a restart registers the same host. */
static int load_host_id(const char *state_dir, char *ret, size_t n) {
        _cleanup_close_ int dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0)
                return -errno;
        char buf[128];
        _cleanup_close_ int fd = openat(dfd, "host.id", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t len = read(fd, buf, sizeof(buf) - 1);
                if (len < 0)
                        return -errno;
                buf[len] = '\0';
                buf[strcspn(buf, "\r\n")] = '\0';
                size_t idlen = strlen(buf);
                if (!host_id_valid(buf) || idlen >= n)
                        return -EINVAL;
                memcpy(ret, buf, idlen + 1);
                return 0;
        }
        if (errno != ENOENT)
                return -errno;
        char hex[17];
        int r = random_hex(hex, 8);
        if (r < 0)
                return r;
        snprintf(buf, sizeof(buf), "host_%s\n", hex);
        if ((fd = openat(dfd, "host.id", O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
                return -errno;
        if (write(fd, buf, strlen(buf)) != (ssize_t)strlen(buf) || fsync(fd) < 0) {
                (void)unlinkat(dfd, "host.id", 0);
                return -EIO;
        }
        snprintf(ret, n, "host_%s", hex);
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

/* The state directory (made, ours, 0700) and the paths that default to
 * places in it or beside runtimed. */
static int lock_state_dir(Daemon *d) {
        _cleanup_free_ char *path = NULL;
        if (asprintf(&path, "%s/runtimed.lock", d->state_dir) < 0)
                return -ENOMEM;
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
                int r = -errno;
                close(fd);
                return r;
        }
        d->state_lock = fd;
        return 0;
}

static int prepare_paths(Daemon *d, const DaemonOptions *o) {
        d->state_dir = o->cfg.state_dir ? strdup(o->cfg.state_dir) : daemon_default_state_dir();
        if (!d->state_dir) {
                log_error(NULL, "working out the state directory: out of memory");
                return 1;
        }
        int r = check_layer_pool(d->state_dir);
        if (r == -ENOENT)
                return 1;
        if (r < 0) {
                log_error(NULL, "cannot check the layer pool beside %s: %s", d->state_dir, strerror(-r));
                return 1;
        }
        if ((r = make_state_dir(d->state_dir)) < 0) {
                log_error(NULL, "cannot use the state directory %s: %s", d->state_dir, strerror(-r));
                return 1;
        }
        /* One runtimed a state directory: a second would reap the first's
         * sandboxes as its own leftovers. */
        if ((r = lock_state_dir(d)) < 0) {
                if (r == -EWOULDBLOCK)
                        log_error(NULL, "another runtimed uses the state directory %s; stop it first, or give "
                                  "this one --state-dir", d->state_dir);
                else
                        log_error(NULL, "cannot lock the state directory %s: %s", d->state_dir, strerror(-r));
                return 1;
        }
        char why[PATH_MAX + 256];
        (void)doctor_layer_copies(d->state_dir, why, sizeof why);
        log_info(NULL, "layer copies (snapshots, forks, new layers): %s", why);

        if (o->cfg.image_dir)
                d->image_dir = strdup(o->cfg.image_dir);
        else if (asprintf(&d->image_dir, "%s/images", d->state_dir) < 0)
                d->image_dir = NULL;
        d->agent = o->cfg.agent_path ? strdup(o->cfg.agent_path) : find_companion("runtime-agent");
        d->builder = o->cfg.image_builder ? strdup(o->cfg.image_builder) : find_companion("runtime-image-build");
        if (!o->cfg.no_live_restore) {
                d->supervisor = o->cfg.supervisor_path ? strdup(o->cfg.supervisor_path)
                                                       : find_companion("runtime-supervisor");
                if (d->supervisor && access(d->supervisor, X_OK) < 0) {
                        log_warn(NULL, "the supervisor %s is not executable: sandboxes will end with the daemon",
                                 d->supervisor);
                        free(d->supervisor);
                        d->supervisor = NULL;
                }
        }
        d->egress_proxy = o->egress_proxy ? strdup(o->egress_proxy) : find_companion("runtime-egress");
        /* The store: the state directory's SQLite file, or the database the
         * options name (whose URL may hold a password: never logged). */
        if (o->cfg.database) {
                if (!pgdb_is_url(o->cfg.database)) {
                        log_error(NULL, "--database must be a postgresql:// URL");
                        return 2;
                }
                d->db_path = strdup(o->cfg.database);
                d->db_label = strdup("the database of --database");
        } else if (asprintf(&d->db_path, "%s/runtime.db", d->state_dir) < 0)
                d->db_path = NULL;
        else
                d->db_label = strdup(d->db_path);
        char missing[128];
        if (d->db_path && store_backend_missing(store_backend_for(d->db_path), missing, sizeof(missing))) {
                log_error(NULL, "--database: the PostgreSQL store does not keep %s yet; leave --database out to "
                          "use the state directory's database", missing);
                return 2;
        }
        if (!d->image_dir || !d->agent || !d->builder || !d->egress_proxy || !d->db_path || !d->db_label) {
                log_error(NULL, "working out the paths in %s: out of memory", d->state_dir);
                return 1;
        }
        d->cfg.state_dir = d->state_dir;
        d->cfg.image_dir = d->image_dir;
        d->cfg.agent_path = d->agent;
        d->cfg.supervisor_path = d->supervisor;
        d->cfg.image_builder = d->builder;
        /* Beside the image builder, so that --image-builder carries both. */
        const char *slash = strrchr(d->builder, '/');
        if (slash && asprintf(&d->microvm_builder, "%.*s/runtime-microvm-build", (int)(slash - d->builder),
                              d->builder) < 0)
                d->microvm_builder = NULL;
        if (d->microvm_builder && access(d->microvm_builder, X_OK) == 0)
                d->cfg.microvm_builder = d->microvm_builder;
        if (access(d->agent, X_OK) < 0)
                log_warn(NULL, "the agent %s is not executable: sandboxes will not start", d->agent);
        return 0;
}

/* Probes each driver once; --drivers narrows what is offered, --driver
 * picks the default among them. */
static int choose_drivers(Daemon *d, const DaemonOptions *o) {
        DaemonConfig *cfg = &d->cfg;
        for (const Driver *const *drv = driver_all(); *drv && cfg->n_drivers < CONFIG_MAX_DRIVERS; drv++) {
                DriverOffer *offer = &cfg->drivers[cfg->n_drivers++];
                offer->driver = *drv;
                offer->available = (*drv)->probe(offer->reason, sizeof(offer->reason)) >= 0;
                offer->offered = offer->available;
                log_info(NULL, "driver %s: %s (%s)", (*drv)->name, offer->available ? "available" : "unavailable",
                         offer->reason);
        }
        if (o->drivers) {
                _cleanup_free_ char *list = strdup(o->drivers);
                if (!list) {
                        log_error(NULL, "reading --drivers: out of memory");
                        return 1;
                }
                for (unsigned i = 0; i < cfg->n_drivers; i++)
                        cfg->drivers[i].offered = false;
                char *save = NULL;
                for (char *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                        DriverOffer *offer = (DriverOffer *)config_driver_offer(cfg, tok);
                        if (!offer) {
                                log_error(NULL, "--drivers: no driver named %s", tok);
                                return 2;
                        }
                        if (!offer->available)
                                log_warn(NULL, "--drivers: %s cannot run here: %s", tok, offer->reason);
                        offer->offered = offer->available;
                }
        }
        if (strcmp(o->driver, "auto") != 0) {
                const DriverOffer *offer = config_driver_offer(cfg, o->driver);
                if (!offer) {
                        log_error(NULL, "--driver: no driver named %s", o->driver);
                        return 2;
                }
                if (!offer->offered) {
                        log_error(NULL, "--driver %s cannot run on this host: %s", o->driver, offer->reason);
                        return 1;
                }
                cfg->default_driver = offer->driver;
                log_info(NULL, "default driver: %s", o->driver);
                return 0;
        }
        char why[1024] = "";
        const Driver *pick = driver_pick_auto(why, sizeof(why));
        const DriverOffer *offer = pick ? config_driver_offer(cfg, pick->name) : NULL;
        if (offer && offer->offered)
                cfg->default_driver = pick;
        else
                for (unsigned i = 0; i < cfg->n_drivers && !cfg->default_driver; i++)
                        if (cfg->drivers[i].offered)
                                cfg->default_driver = cfg->drivers[i].driver;
        if (cfg->default_driver)
                log_info(NULL, "default driver (auto): %s; %s", cfg->default_driver->name, why);
        else
                log_warn(NULL, "no driver can run sandboxes on this host: %s", why);
        return 0;
}

/* As root, keeps only the capabilities runtimed and the offered drivers
 * use (docs/drivers.md's table). Before any thread: capsets are per thread. */
static int keep_capabilities(const Daemon *d) {
        if (geteuid() != 0)
                return 0;
        const char *offered[CONFIG_MAX_DRIVERS];
        size_t n_offered = 0;
        for (unsigned i = 0; i < d->cfg.n_drivers; i++)
                if (d->cfg.drivers[i].offered)
                        offered[n_offered++] = d->cfg.drivers[i].driver->name;
        CapSet keep = caps_needed(offered, n_offered, listen_port_privileged(&d->cfg));
        int r = caps_keep_only(keep);
        if (r < 0) {
                log_error(NULL, "cannot drop the capabilities the offered drivers do not need: %s",
                          r == -EBUSY ? "a thread started before the drop" : strerror(-r));
                return 1;
        }
        char names[1024];
        caps_format(keep, names, sizeof(names));
        log_info(NULL, "capabilities kept for runtimed and the offered drivers: %s", names);
        return 0;
}

/* The store: the database with the sandboxes and keys, the key store and
 * the ledger over it. Every durable part opens here, and the admin key is
 * made on the first start. */
static int open_store(Daemon *d) {
        int r;
        /* Many hosts may share a database: each works on its own sandboxes
         * (manager/fleet.h); one runtimed a state directory (runtimed.lock). */
        if ((r = db_open(store_backend_for(d->db_path), d->db_path, &d->db)) < 0) {
                if (r == -EPROTONOSUPPORT)
                        log_error(NULL, "cannot open the database %s: a newer runtimed wrote it; run that version",
                                  d->db_label);
                else
                        log_error(NULL, "cannot open the database %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        /* A row this daemon cannot read (a spec of a newer version, a
         * corrupt row) is refused here, by id, rather than found later. */
        if ((r = db_sandbox_check(d->db)) != 0) {
                if (r > 0)
                        log_error(NULL, "refusing to start: %d sandbox row%s in %s cannot be read (named above); "
                                  "run the runtimed that wrote them, or restore the database from a backup",
                                  r, r == 1 ? "" : "s", d->db_label);
                else
                        log_error(NULL, "cannot read the sandboxes in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = keystore_open(store_backend_for(d->db_path), d->db_path, &d->keys)) < 0) {
                log_error(NULL, "cannot open the key store in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = ensure_admin_key(d->keys, d->state_dir)) < 0) {
                log_error(NULL, "cannot make the admin key in %s: %s", d->state_dir, strerror(-r));
                return 1;
        }
        if ((r = ledger_open(store_backend_for(d->db_path), d->db_path, &d->ledger)) < 0) {
                log_error(NULL, "cannot open the ledger in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = events_open(store_backend_for(d->db_path), d->db_path, &d->events)) < 0) {
                log_error(NULL, "cannot open the events in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = audit_open(store_backend_for(d->db_path), d->db_path, &d->audit)) < 0) {
                log_error(NULL, "cannot open the audit trail in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = samples_open(store_backend_for(d->db_path), d->db_path, &d->samples)) < 0) {
                log_error(NULL, "cannot open the sandbox metrics in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = request_counts_open(store_backend_for(d->db_path), d->db_path, &d->requests)) < 0) {
                log_error(NULL, "cannot open the request counts in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        d->host_ops = store_backend_for(d->db_path)->hosts;
        if ((r = d->host_ops->open(d->db_path, &d->hosts)) < 0) {
                log_error(NULL, "cannot open the hosts in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        return 0;
}

/* The preview listener (--preview-listen) and where previews are reached:
 * PORT-SANDBOX.DOMAIN, at the listener's port unless a proxy in front
 * listens on another. */
static int open_preview_listener(Daemon *d, const DaemonOptions *o) {
        preview_proxy_set_relay_max(o->preview_relay_max);
        if (!o->preview_listen)
                return 0;
        const char *domain = o->preview_domain ? o->preview_domain : "localhost";
        bool ok = *domain && strlen(domain) < sizeof d->preview_site.domain && domain[0] != '.' &&
                  domain[strlen(domain) - 1] != '.';
        for (const char *p = domain; ok && *p; p++)
                ok = (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '.';
        if (!ok) {
                log_error(NULL, "--preview-domain %s: not a lowercase DNS name", domain);
                return 2;
        }
        const char *colon = strrchr(o->preview_listen, ':');
        unsigned long port = colon ? strtoul(colon + 1, NULL, 10) : 0;
        d->preview_fd = listen_tcp(o->preview_listen, d->preview_listening, sizeof d->preview_listening);
        if (d->preview_fd < 0 || port == 0 || port > 65535) {
                log_error(NULL, "cannot listen on --preview-listen %s: %s", o->preview_listen,
                          d->preview_fd == -EINVAL || d->preview_fd >= 0 ? "not ADDR:PORT" : strerror(-d->preview_fd));
                return 1;
        }
        if (o->preview_tls_dir) {
                char why[512] = "";
                int r = preview_tls_load(o->preview_tls_dir, &d->preview_tls, why, sizeof why);
                if (r < 0) {
                        log_error(NULL, "--preview-tls-dir %s: %s", o->preview_tls_dir, why[0] ? why : strerror(-r));
                        return 2;
                }
        }
        snprintf(d->preview_site.domain, sizeof d->preview_site.domain, "%s", domain);
        d->preview_site.public_port = o->preview_public_port ? o->preview_public_port : (unsigned)port;
        d->preview_site.https = o->preview_https || d->preview_tls;
        return 0;
}

/* TLS for the hop (docs/fleet.md, "TLS between hosts"): its files and its
 * listener, both given or neither, with the fleet's secret and an https://
 * advertised URL; an https:// URL needs them. Bound before this host
 * registers, so that the URL answers once the others read it. */
static int open_hop(Daemon *d, const DaemonOptions *o) {
        bool https = o->advertise && strncmp(o->advertise, "https://", 8) == 0;
        if (!o->fleet_tls_dir && !o->fleet_listen) {
                if (https) {
                        log_error(NULL, "--advertise %s: an https:// URL needs --fleet-tls-dir and --fleet-listen",
                                  o->advertise);
                        return 2;
                }
                return 0;
        }
        if (!o->fleet_tls_dir || !o->fleet_listen) {
                log_error(NULL, "--fleet-tls-dir and --fleet-listen go together");
                return 2;
        }
        if (!d->fleet_secret[0]) {
                log_error(NULL, "--fleet-tls-dir needs --fleet-secret-file: TLS carries the hop, the secret "
                                "authenticates it");
                return 2;
        }
        if (!https) {
                log_error(NULL, "--fleet-tls-dir: --advertise must be an https:// URL, the --fleet-listen address "
                                "as the certificate names it");
                return 2;
        }
        char why[256] = "";
        int r = hop_tls_load(o->fleet_tls_dir, &d->hop_tls, why, sizeof why);
        if (r < 0) {
                log_error(NULL, "--fleet-tls-dir %s: %s", o->fleet_tls_dir, why[0] ? why : strerror(-r));
                return 2;
        }
        d->hop_fd = listen_tcp(o->fleet_listen, d->hop_listening, sizeof d->hop_listening);
        if (d->hop_fd < 0) {
                log_error(NULL, "cannot listen on --fleet-listen %s: %s", o->fleet_listen,
                          d->hop_fd == -EINVAL ? "not ADDR:PORT" : strerror(-d->hop_fd));
                return 1;
        }
        forward_set_tls(hop_tls_client(d->hop_tls));
        return 0;
}

/* This host's record among the hosts: its id, where it is reached, what
 * it offers. Joining registers it (a new epoch) before its own sandboxes
 * are recovered, so that every write of theirs is this epoch's. */
static int join_fleet(Daemon *d, const DaemonOptions *o) {
        int r;
        char host_id[64];
        if (o->host_id) {
                if (!host_id_valid(o->host_id)) {
                        log_error(NULL, "--host-id: up to 63 letters, digits, '_', '-' or '.'");
                        return 2;
                }
                snprintf(host_id, sizeof host_id, "%s", o->host_id);
        } else if ((r = load_host_id(d->state_dir, host_id, sizeof host_id)) < 0) {
                log_error(NULL, "cannot read or make the host id in %s/host.id: %s", d->state_dir, strerror(-r));
                return 1;
        }
        char drivers[256] = "";
        size_t at = 0;
        for (unsigned i = 0; i < d->cfg.n_drivers; i++) {
                const DriverOffer *offer = &d->cfg.drivers[i];
                if (offer->offered && offer->available && at < sizeof drivers)
                        at += (size_t)snprintf(drivers + at, sizeof drivers - at, "%s%s", at ? "," : "",
                                               offer->driver->name);
        }
        long cpus = sysconf(_SC_NPROCESSORS_ONLN), pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
        HostRecord rec = { .url = o->advertise ? o->advertise : d->listening,
                           .drivers = drivers,
                           .version = (char *)RUNTIME_VERSION,
                           .vcpu = cpus > 0 ? cpus : 0,
                           .memory_mib = pages > 0 && page > 0 ? (int64_t)pages * page / (1024 * 1024) : 0 };
        snprintf(rec.id, sizeof rec.id, "%s", host_id);
        FleetConfig fc = { .ops = d->host_ops,
                           .hosts = d->hosts,
                           .db = d->db,
                           .ledger = d->ledger,
                           .manager = d->manager,
                           .self = &rec,
                           .events = d->events,
                           .snapshots = d->snapshots,
                           .uploads = d->uploads,
                           .webhooks = d->webhooks,
                           .audit = d->audit,
                           .samples = d->samples,
                           .requests = d->requests,
                           .links = d->links,
                           .previews = d->previews,
                           .sessions = d->sessions,
                           .volumes = d->volumes,
                           .sample_retention_days = o->sandbox_metrics_retention_days
                                                            ? o->sandbox_metrics_retention_days
                                                            : SAMPLES_RETENTION_DAYS_DEFAULT,
                           .audit_retention_days = o->audit_retention_days ? o->audit_retention_days
                                                                           : AUDIT_RETENTION_DAYS_DEFAULT,
                           .event_retention_days = o->event_retention_days ? o->event_retention_days
                                                                           : EVENTS_RETENTION_DAYS_DEFAULT,
                           .dead_after_seconds = o->host_dead_after_seconds ? o->host_dead_after_seconds
                                                                            : FLEET_DEAD_AFTER_DEFAULT_SECONDS };
        if (o->fleet_secret_file) {
                const char *why = "";
                if ((r = load_fleet_secret(o->fleet_secret_file, d->fleet_secret, sizeof d->fleet_secret, &why)) < 0) {
                        log_error(NULL, "--fleet-secret-file %s %s", o->fleet_secret_file, why);
                        return 2;
                }
        }
        if ((r = open_hop(d, o)) != 0)
                return r;
        if ((r = fleet_join(&fc, &d->fleet)) < 0) {
                log_error(NULL, "cannot register host %s in %s: %s", host_id, d->db_label, strerror(-r));
                return 1;
        }
        log_info(NULL, "registered as host %s (epoch %lld) at %s", host_id, (long long)fleet_epoch(d->fleet),
                 rec.url);
        return 0;
}

/* The webhooks (docs/api.md, "Webhooks"): their secrets are sealed with the
 * egress secrets' key. */
static int open_webhooks(Daemon *d, const DaemonOptions *o, const uint8_t *seal_key) {
        EgressCidr allow[WEBHOOK_MAX_ALLOW_CIDRS];
        for (unsigned i = 0; i < o->n_webhook_allow_cidrs && i < WEBHOOK_MAX_ALLOW_CIDRS; i++)
                if (egress_cidr_parse(o->webhook_allow_cidrs[i], &allow[i]) < 0) {
                        log_error(NULL, "--webhook-allow-cidr %s: not a range (a.b.c.d/n or x:y::/n, host bits zero)",
                                  o->webhook_allow_cidrs[i]);
                        return 2;
                }
        WebhooksConfig wc = { .store = store_backend_for(d->db_path),
                              .location = d->db_path,
                              .seal_key = seal_key,
                              .allow = allow,
                              .n_allow = o->n_webhook_allow_cidrs,
                              .retry_seconds = o->webhook_retry_seconds,
                              .workers = o->webhook_workers,
                              .per_owner = o->webhook_workers_per_owner };
        int r = webhooks_open(&wc, &d->webhooks);
        if (r < 0) {
                log_error(NULL, "cannot open the webhooks in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        for (unsigned i = 0; i < o->n_webhook_allow_cidrs; i++)
                log_info(NULL, "webhooks: receivers in %s are allowed (--webhook-allow-cidr)", o->webhook_allow_cidrs[i]);
        /* The OpenTelemetry exports push under the webhooks' rules, their
         * headers sealed with the same key. */
        OtelConfig oc = { .store = store_backend_for(d->db_path),
                          .location = d->db_path,
                          .seal_key = seal_key,
                          .poster = d->webhooks,
                          .events = d->events,
                          .samples = d->samples,
                          .interval_seconds = o->otel_interval_seconds };
        if ((r = otel_open(&oc, &d->otel)) < 0) {
                log_error(NULL, "cannot open the OpenTelemetry exports in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        /* The file links' secrets are sealed with it too. */
        if ((r = file_links_open(store_backend_for(d->db_path), d->db_path, seal_key, &d->links)) < 0) {
                log_error(NULL, "cannot open the file links in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = sessions_open(store_backend_for(d->db_path), d->db_path, &d->sessions)) < 0) {
                log_error(NULL, "cannot open the sessions in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        /* A preview's secret too. */
        if (d->preview_fd >= 0 &&
            (r = previews_open(store_backend_for(d->db_path), d->db_path, seal_key, &d->previews)) < 0) {
                log_error(NULL, "cannot open the previews in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        return 0;
}

/* The egress service and its proxy process (docs/egress.md). */
static int open_egress(Daemon *d, const DaemonOptions *o) {
        const DaemonConfig *cfg = &d->cfg;
        char err[256] = "";
        uint8_t seal_key[SEAL_KEY_LEN];
        const char *why = "";
        int kr = load_secrets_key(d->state_dir, o->secrets_key_file, seal_key, &why);
        if (kr < 0) {
                log_error(NULL, "the secrets key %s %s", o->secrets_key_file ? o->secrets_key_file : "<state-dir>/secrets.key",
                          why);
                return 2;
        }
        EgressServiceConfig ec = { .state_dir = d->state_dir, .db_path = d->db_path, .seal_key = seal_key,
                                   .store = store_backend_for(d->db_path),
                                   .test_upstreams = cfg->egress_test_upstreams,
                                   .n_test_upstreams = cfg->n_egress_test_upstreams,
                                   .extra_ca_file = cfg->egress_extra_ca,
                                   .public_cidrs = cfg->egress_public_cidrs,
                                   .n_public_cidrs = cfg->n_egress_public_cidrs,
                                   .trust_ca_file = cfg->egress_trust_ca,
                                   .workers = cfg->egress_workers,
                                   .workers_per_sandbox = cfg->egress_workers_per_sandbox,
                                   .wait_timeout_ms = o->egress_wait_timeout_ms,
                                   .proxy_path = d->egress_proxy };
        int er = egress_service_new(&ec, &d->egress, err, sizeof(err));
        int wr = er < 0 ? 0 : open_webhooks(d, o, seal_key);
        explicit_bzero(seal_key, sizeof(seal_key));
        if (er < 0) {
                log_error(NULL, "egress: %s", err);
                return 1;
        }
        if (wr != 0)
                return wr;
        for (unsigned i = 0; i < cfg->n_egress_test_upstreams; i++)
                log_warn(NULL, "TEST SETTING: egress to %s bypasses the address checks; never use "
                               "--egress-test-upstream outside a test suite", cfg->egress_test_upstreams[i]);
        if (cfg->egress_extra_ca)
                log_warn(NULL, "TEST SETTING: upstream certificates signed by %s are trusted", cfg->egress_extra_ca);
        for (unsigned i = 0; i < cfg->n_egress_public_cidrs; i++)
                log_info(NULL, "egress: addresses in %s count as public upstreams (--egress-public-cidr)",
                         cfg->egress_public_cidrs[i]);
        if (cfg->egress_trust_ca)
                log_info(NULL, "egress: the CAs in %s are trusted upstream and in every sandbox", cfg->egress_trust_ca);
        return 0;
}

/* An upload in parts is this host's when its sandbox is (or is gone: then
 * it is dropped wherever its row is read). */
static bool upload_is_ours(void *userdata, const char *sandbox_id) {
        Daemon *d = userdata;
        SandboxRow row;
        int r = db_sandbox_get(d->db, sandbox_id, &row);
        if (r < 0)
                return r == -ENOENT; /* unread: left for the next start */
        bool ours = !row.host_id[0] || strcmp(row.host_id, fleet_host_id(d->fleet)) == 0;
        sandbox_row_done(&row);
        return ours;
}

/* A process the agent of a re-attached sandbox kept running. */
static int adopt_process(void *userdata, Sandbox *sb, json_t *kept) {
        Daemon *d = userdata;
        return proc_adopt(d->procs, sb, kept);
}

/* The snapshots, the uploads in parts and the manager, each recovering what
 * an earlier run left. */
static int open_manager(Daemon *d, const DaemonOptions *o) {
        int r;
        if ((r = snapshot_store_open(store_backend_for(d->db_path), d->db_path, d->state_dir,
                                     d->cfg.price_disk_gib_hour_micros, &d->snapshots)) < 0) {
                log_error(NULL, "cannot open the snapshot store in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        snapshot_store_set_ledger(d->snapshots, d->ledger);
        if (snapshot_store_set_owner_max_mib(d->snapshots, d->cfg.max_snapshot_mib_per_owner) < 0)
                log_warn(NULL, "max-snapshot-mib-per-owner %u is outside 1..%u: keeping %llu",
                         d->cfg.max_snapshot_mib_per_owner, SNAPSHOT_OWNER_MIB_MAX,
                         (unsigned long long)snapshot_store_owner_max_mib(d->snapshots));
        if ((r = uploads_open(store_backend_for(d->db_path), d->db_path, d->state_dir, &d->uploads)) == 0)
                uploads_set_owner_bounds(d->uploads, d->cfg.max_uploads_per_owner, d->cfg.max_upload_mib_per_owner);
        if (r < 0) {
                log_error(NULL, "cannot open the uploads in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        VolumeLimits vl = { .max_mib = o->volume_max_mib, .max_count = o->volume_max_count,
                            .max_total_mib = o->volume_max_total_mib };
        if ((r = volumes_open(store_backend_for(d->db_path), d->db_path, d->state_dir, &vl, &d->volumes)) < 0) {
                log_error(NULL, "cannot open the volumes in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        if ((r = volumes_start_sweep(d->volumes, o->volume_backup_sweep_seconds, o->volume_backup_day_seconds)) < 0) {
                log_error(NULL, "cannot start the volume backups' sweep: %s", strerror(-r));
                return 1;
        }
        if ((r = manager_new(&d->cfg, d->db, &d->manager)) < 0) {
                log_error(NULL, "cannot make the sandbox manager: %s", strerror(-r));
                return 1;
        }
        manager_set_heartbeat(d->manager, o->heartbeat_interval_ms, o->heartbeat_timeout_ms);
        manager_set_ledger(d->manager, d->ledger);
        manager_set_egress(d->manager, d->egress);
        manager_set_snapshots(d->manager, d->snapshots);
        manager_set_uploads(d->manager, d->uploads);
        manager_set_volumes(d->manager, d->volumes);
        if ((r = join_fleet(d, o)) != 0)
                return r;
        snapshot_store_set_host(d->snapshots, fleet_host_id(d->fleet));
        events_set_host(d->events, fleet_host_id(d->fleet));
        webhooks_set_host(d->webhooks, fleet_host_id(d->fleet));
        audit_set_host(d->audit, fleet_host_id(d->fleet));
        otel_set_host(d->otel, fleet_host_id(d->fleet));
        events_set_webhooks(d->events, d->webhooks);
        manager_set_events(d->manager, d->events);
        if (d->egress) {
                egress_service_set_events(d->egress, d->events);
                egress_service_set_audit(d->egress, d->audit);
        }
        d->sample_interval_s = o->sandbox_metrics_interval_seconds ? o->sandbox_metrics_interval_seconds
                                                                   : SAMPLES_INTERVAL_SECONDS_DEFAULT;
        manager_set_samples(d->manager, d->samples, d->sample_interval_s);
        if ((r = snapshot_store_recover(d->snapshots)) < 0)
                log_error(NULL, "recovering snapshots: %s", strerror(-r));
        /* Before the recovery: the processes of re-attached sandboxes go in it. */
        if (!(d->watches = watch_table_new())) {
                log_error(NULL, "out of memory");
                return 1;
        }
        if (!(d->procs = proc_table_new())) {
                log_error(NULL, "making the process table: out of memory");
                return 1;
        }
        if (!(d->mcp = mcp_sessions_new())) {
                log_error(NULL, "making the MCP sessions' table: out of memory");
                return 1;
        }
        if (proc_table_set_owner_max(d->procs, d->cfg.max_processes_per_owner) < 0)
                log_warn(NULL, "max-processes-per-owner %u is outside 1..%u: keeping %u",
                         d->cfg.max_processes_per_owner, PROC_OWNER_RUNNING_MAX,
                         proc_table_owner_max(d->procs));
        manager_set_adopter(d->manager, adopt_process, d);
        if ((r = user_images_open(store_backend_for(d->db_path), d->db_path, d->state_dir, &d->user_images)) < 0) {
                log_error(NULL, "cannot open the images in %s: %s", d->db_label, strerror(-r));
                return 1;
        }
        user_images_set_manager(d->user_images, &d->cfg, d->manager, d->snapshots);
        {
                uint8_t seal_key[SEAL_KEY_LEN];
                const char *why = "";
                if (load_secrets_key(d->state_dir, o->secrets_key_file, seal_key, &why) == 0)
                        user_images_set_seal_key(d->user_images, seal_key);
                explicit_bzero(seal_key, sizeof seal_key);
        }
        user_images_set_host(d->user_images, fleet_host_id(d->fleet), !fleet_single(d->fleet));
        if ((r = fleet_set_images(d->fleet, d->user_images)) < 0) {
                log_error(NULL, "cannot write the images at this host's epoch: %s", strerror(-r));
                return 1;
        }
        /* Before the sandboxes' recovery, which may stop one that does not
         * re-attach: the builds' sandboxes are noted while their rows still
         * say they run. */
        if ((r = user_images_recover_sandboxes(d->user_images)) < 0)
                log_error(NULL, "noting the sandboxes of builds cut by the stop: %s", strerror(-r));
        if ((r = manager_recover(d->manager)) < 0) {
                log_error(NULL, "recovering sandboxes: %s", strerror(-r));
                return 1;
        }
        /* After the sandboxes: a build cut by a stop has its sandbox, noted
         * before their recovery, deleted here, and its record failed. */
        if ((r = user_images_start(d->user_images)) < 0) {
                log_error(NULL, "starting the image builds: %s", strerror(-r));
                return 1;
        }
        /* After the sandboxes: a lease end with onLeaseEnd delete during
         * recovery has dropped its uploads already. */
        unsigned kept = 0, dropped = 0;
        if ((r = uploads_restore(d->uploads, (uint64_t)d->cfg.max_file_mib << 20, upload_is_ours, d, &kept,
                                 &dropped)) < 0)
                log_error(NULL, "restoring the uploads in progress: %s", strerror(-r));
        else if (kept || dropped)
                log_info(NULL, "uploads in progress: %u kept, %u dropped (sandbox deleted, idle an hour, "
                               "past the bounds or their staging file missing)",
                         kept, dropped);
        return 0;
}

/* The listening socket, the HTTP server over the route table, and the
 * timers (snapshot and upload expiry, leases). */
static int open_listener(Daemon *d) {
        const DaemonConfig *cfg = &d->cfg;
        int fd = cfg->socket_path ? listen_unix(cfg->socket_path, d->listening, sizeof(d->listening))
                                  : listen_tcp(cfg->listen_addr, d->listening, sizeof(d->listening));
        if (fd < 0) {
                log_error(NULL, "cannot listen on %s: %s", cfg->socket_path ? cfg->socket_path : cfg->listen_addr,
                          fd == -EINVAL ? "not ADDR:PORT" : strerror(-fd));
                return 1;
        }
        d->listen_fd = fd;
        return 0;
}

static int serve(Daemon *d) {
        const DaemonConfig *cfg = &d->cfg;
        int fd = d->listen_fd;
        d->listen_fd = -1;
        if (!d->procs) {
                close(fd);
                log_error(NULL, "making the process table: out of memory");
                return 1;
        }
        d->app = (App){ .cfg = cfg, .db = d->db, .manager = d->manager, .ledger = d->ledger, .keys = d->keys,
                        .egress = d->egress, .procs = d->procs, .snapshots = d->snapshots, .uploads = d->uploads,
                        .host_ops = d->host_ops, .hosts = d->hosts, .fleet = d->fleet, .events = d->events,
                        .webhooks = d->webhooks, .audit = d->audit, .samples = d->samples,
                        .sample_interval_s = d->sample_interval_s, .requests = d->requests,
                        .otel = d->otel, .links = d->links, .mcp = d->mcp, .previews = d->previews,
                        .preview_site = &d->preview_site, .volumes = d->volumes,
                        .user_images = d->user_images, .watches = d->watches, .sessions = d->sessions };
        /* Before the API serves: every create sees the pool or none. */
        char why[512] = "";
        manager_set_warmer(d->manager, interpreter_pool_warm, &d->app);
        int r = manager_start_warm_pool(d->manager, why, sizeof why);
        if (r < 0) {
                close(fd);
                log_error(NULL, "%s", why[0] ? why : strerror(-r));
                return 1;
        }
        r = http_server_new(api_routes, api_n_routes, &d->app, d->db, d->keys, cfg->max_connections,
                                cfg->max_connections_per_peer, &d->http);
        if (r == 0) {
                http_server_set_fleet(d->http, d->fleet);
                http_server_set_bounds(d->http, cfg->max_requests_per_owner, cfg->max_waiting_connections,
                                       cfg->http_head_timeout_s);
                http_server_set_audit(d->http, d->audit);
                http_server_set_requests(d->http, d->requests);
                http_server_set_fleet_secret(d->http, d->fleet_secret[0] ? d->fleet_secret : NULL);
                d->http_links = (HttpLinks){ .check = api_links_check, .claim = api_links_claim, .userdata = &d->app };
                http_server_set_links(d->http, &d->http_links);
                if (d->sessions) {
                        d->http_sessions = api_sessions_edge(&d->app);
                        http_server_set_sessions(d->http, &d->http_sessions);
                }
        }
        if (r < 0 || (r = http_server_start(d->http, fd)) < 0) {
                log_error(NULL, "cannot start the HTTP server on %s: %s", d->listening, strerror(-r));
                return 1;
        }
        if (d->hop_fd >= 0) {
                int hop_fd = d->hop_fd;
                d->hop_fd = -1;
                if ((r = http_server_start_hop(d->http, hop_fd, hop_tls_cert_pem(d->hop_tls),
                                               hop_tls_key_pem(d->hop_tls))) < 0) {
                        log_error(NULL, "cannot serve the fleet's hop over TLS on %s", d->hop_listening);
                        return 1;
                }
                const char *at = d->hop_listening;
                log_info(NULL, "the fleet's hop: TLS on %s", strncmp(at, "http://", 7) == 0 ? at + 7 : at);
        }
        if (d->preview_fd >= 0) {
                int preview_fd = d->preview_fd;
                d->preview_fd = -1;
                if ((r = preview_proxy_start(&d->app, preview_fd, d->preview_tls ? preview_tls_ctx(d->preview_tls) : NULL,
                                             &d->preview_proxy)) < 0) {
                        close(preview_fd);
                        log_error(NULL, "cannot serve previews: %s", strerror(-r));
                        return 1;
                }
                preview_proxy_set_fleet_secret(d->preview_proxy, d->fleet_secret);
                log_info(NULL, "previews: %s://PORT-SANDBOX.%s:%u, served on %s",
                         d->preview_site.https ? "https" : "http", d->preview_site.domain,
                         d->preview_site.public_port, d->preview_listening);
        }
        if ((r = snapshot_store_start(d->snapshots)) < 0) {
                log_error(NULL, "cannot start the snapshot expiry: %s", strerror(-r));
                return 1;
        }
        if ((r = uploads_start(d->uploads)) < 0) {
                log_error(NULL, "cannot start the upload expiry: %s", strerror(-r));
                return 1;
        }
        if ((r = manager_start(d->manager)) < 0) {
                log_error(NULL, "cannot start the lease timer: %s", strerror(-r));
                return 1;
        }
        if ((r = fleet_start(d->fleet)) < 0) {
                log_error(NULL, "cannot start the host heartbeat: %s", strerror(-r));
                return 1;
        }
        if ((r = webhooks_start(d->webhooks)) < 0) {
                log_error(NULL, "cannot start the webhook deliveries: %s", strerror(-r));
                return 1;
        }
        if ((r = otel_start(d->otel)) < 0) {
                log_error(NULL, "cannot start the OpenTelemetry exports: %s", strerror(-r));
                return 1;
        }
        return 0;
}

/* The parts in reverse: no new connection, every sandbox stopped (its
 * supervisor told), the upgraded connections (ours, not the HTTP server's)
 * ended, then the server, the processes (each ended with its channel, its
 * thread joined here) and the stores. */
static void stop(Daemon *d) {
        fleet_stop(d->fleet);
        otel_stop(d->otel);
        webhooks_stop(d->webhooks);
        http_server_quiesce(d->http);
        /* Before the sandboxes stop: a build whose sandbox stops under it
         * says the daemon stopped, not that its sandbox failed. */
        user_images_stop(d->user_images);
        manager_shutdown(d->manager);
        /* Readers of the processes left running get their `continue`. */
        if (!api_output_streams_wait(2000))
                log_warn(NULL, "stopping with output streams still open");
        terminal_close_all();
        tunnel_close_all();
        preview_proxy_stop(d->preview_proxy);
        preview_tls_free(d->preview_tls);
        http_server_stop(d->http);
        http_server_free(d->http);
        forward_pool_drain();
        forward_set_tls(NULL);
        hop_tls_free(d->hop_tls);
        proc_table_free(d->procs);
        watch_table_free(d->watches);
        mcp_sessions_free(d->mcp);
        fleet_free(d->fleet);
        /* Before the manager: a build's worker drives its sandbox through it. */
        user_images_close(d->user_images);
        manager_free(d->manager);
        otel_close(d->otel);
        file_links_close(d->links);
        previews_close(d->previews);
        sessions_close(d->sessions);
        volumes_close(d->volumes);
        webhooks_close(d->webhooks);
        uploads_close(d->uploads);
        snapshot_store_close(d->snapshots);
        egress_service_free(d->egress);
        keystore_close(d->keys);
        ledger_close(d->ledger);
        if (d->host_ops)
                d->host_ops->close(d->hosts);
        events_close(d->events);
        audit_close(d->audit);
        samples_close(d->samples);
        request_counts_close(d->requests);
        db_close(d->db);
        if (d->cfg.socket_path)
                unlink(d->cfg.socket_path);
}

static void daemon_free(Daemon *d) {
        if (!d)
                return;
        free(d->state_dir);
        free(d->image_dir);
        free(d->agent);
        free(d->builder);
        free(d->microvm_builder);
        free(d->egress_proxy);
        free(d->supervisor);
        free(d->db_path);
        free(d->db_label);
        if (d->listen_fd >= 0)
                close(d->listen_fd);
        if (d->hop_fd >= 0)
                close(d->hop_fd);
        if (d->preview_fd >= 0)
                close(d->preview_fd);
        if (d->state_lock >= 0)
                close(d->state_lock);
        free(d);
}

int daemon_run(const DaemonOptions *opts) {
        signal(SIGPIPE, SIG_IGN);
        /* Before any thread: capsets are per thread. What nothing ever uses
         * goes first, before the drivers' probes run; the rest of what the
         * offered drivers do not use once they are chosen. */
        if (geteuid() == 0) {
                int r = caps_keep_only(~caps_never_needed());
                if (r < 0) {
                        log_error(NULL, "cannot drop the capabilities no driver needs: %s", strerror(-r));
                        return 1;
                }
        }
        /* Every thread inherits this mask; this thread alone waits for the signals. */
        sigset_t stop_signals;
        sigemptyset(&stop_signals);
        sigaddset(&stop_signals, SIGTERM);
        sigaddset(&stop_signals, SIGINT);
        pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);

        Daemon *d = calloc(1, sizeof *d);
        if (!d) {
                log_error(NULL, "out of memory");
                return 1;
        }
        d->state_lock = -1;
        d->listen_fd = -1;
        d->hop_fd = -1;
        d->preview_fd = -1;
        d->cfg = opts->cfg;
        int status = prepare_paths(d, opts);
        if (status == 0)
                status = choose_drivers(d, opts);
        if (status == 0)
                status = keep_capabilities(d);
        if (status != 0) {
                daemon_free(d);
                return status;
        }
        /* From here a failure leaves the parts as they are: the process is
         * about to end, and stopping the manager would stop every sandbox
         * it recovered, which the next start re-attaches instead. */
        if ((status = open_listener(d)) != 0 || (status = open_preview_listener(d, opts)) != 0 ||
            (status = open_store(d)) != 0 ||
            (status = open_egress(d, opts)) != 0 || (status = open_manager(d, opts)) != 0 ||
            (status = serve(d)) != 0)
                return status;
        printf("runtimed listening on %s\n", d->listening);
        fflush(stdout);
        log_info(NULL, "runtimed %s listening on %s (state %s)", RUNTIME_VERSION, d->listening, d->state_dir);
        sdnotify_ready(d->listening);

        int sig = 0;
        while (sigwait(&stop_signals, &sig) != 0)
                ;
        log_info(NULL, "signal %d: stopping", sig);
        sdnotify_stopping();
        stop(d);
        log_info(NULL, "stopped");
        daemon_free(d);
        return 0;
}
