#include "daemon/egress_service.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/io.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/agent_client.h"
#include "common/log.h"
#include "daemon/store/sqldb.h"
#include "egress/cabundle.h"
#include "egress/cidr.h"
#include "egress/policy.h"
#include "egress/proxy.h"
#include "egress/secret.h"
#include "egress/wire.h"

#define MAX_TEST_UPSTREAMS 32
#define MAX_SECRETS_PER_OWNER 100
#define MAX_SECRET_HOSTS 64
#define AUDIT_KEEP_PER_SANDBOX 10000
#define RELAY_URL "http://127.0.0.1:3128"
#define SANDBOX_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define SANDBOX_CA_FILE "/usr/local/share/ca-certificates/runtime-egress.crt"
#define MAX_BUNDLE (4u * 1024u * 1024u)

static const char schema[] =
        "CREATE TABLE IF NOT EXISTS egress_secrets ("
        " owner TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL, hosts TEXT NOT NULL,"
        " placeholder TEXT NOT NULL, created_at INTEGER NOT NULL, updated_at INTEGER NOT NULL,"
        " header TEXT, format TEXT, rules TEXT, PRIMARY KEY (owner, name));"
        "CREATE TABLE IF NOT EXISTS egress_log ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, sandbox TEXT NOT NULL, at INTEGER NOT NULL,"
        " host TEXT NOT NULL, port INTEGER NOT NULL, kind TEXT NOT NULL, allowed INTEGER NOT NULL,"
        " reason TEXT NOT NULL, addr TEXT, bytes_out INTEGER NOT NULL, bytes_in INTEGER NOT NULL,"
        " intercepted INTEGER NOT NULL, secrets_used INTEGER NOT NULL, rule TEXT, duration_ms INTEGER,"
        " end_reason TEXT);"
        "CREATE INDEX IF NOT EXISTS egress_log_by_sandbox ON egress_log (sandbox, id);";

typedef struct Conn Conn;

struct EgressService {
        sqlite3 *sql;
        pthread_mutex_t lock; /* the connection; the counters and the pool below */
        pthread_cond_t idle;
        unsigned active;      /* connections served, waiting or being refused */
        unsigned inserts;     /* audit rows since the last trim */
        /* The pool: at most max_workers threads serve connections, each with
         * at most one helper thread of the proxy's (one direction of a
         * tunnel), and a sandbox holds at most `share` of them at once. The
         * rest wait in `queue`, bounded per sandbox and in all; past that
         * they go to the one refuser thread, which answers 503 and writes the
         * audit entry. */
        pthread_cond_t work, refusal;
        Conn *queue, *queue_tail;
        unsigned n_waiting;
        unsigned max_workers, share;
        unsigned wait_ms; /* the longest a connection waits for a worker */
        unsigned workers, idle_workers, wakeups;
        Conn *refusals, *refusals_tail;
        unsigned n_refusals;
        bool refuser;
        bool stopping;
        EgressTestHost test_hosts[MAX_TEST_UPSTREAMS];
        size_t n_test_hosts;
        EgressCidr public_cidrs[EGRESS_MAX_PUBLIC_CIDRS];
        size_t n_public_cidrs;
        char *sandbox_ca_pem; /* the daemon's CA, then the operator's trusted CAs */
        /* The proxy process (runtime-egress): started at start and again
         * when a connection finds it gone. */
        pthread_mutex_t proxy_lock;
        char **proxy_argv;
        pid_t proxy_pid;
        int proxy_ctl; /* -1: none running */
        char *ca_pem;  /* what the proxy's CA looks like, from its hello */
};

struct SandboxEgress {
        EgressService *svc;
        atomic_int refs;
        char id[32];
        char owner[128];
        bool trial;
        json_t *scope;   /* the names of the secrets it may use; NULL: all; fixed for its life */
        pthread_mutex_t lock;
        json_t *network; /* under lock */
        /* Under svc->lock: connections being served, waiting for a worker,
         * and refused without an audit entry of their own (the refusal list
         * was full) since the last one that was logged. */
        unsigned serving, waiting;
        unsigned unlogged;
};

/* Refuses, at start, a range that would let a sandbox reach what it must
 * never reach, whatever the operator meant: see egress/cidr.h. */
static int public_cidrs_load(EgressService *svc, const EgressServiceConfig *cfg, char *err, size_t err_len) {
        if (cfg->n_public_cidrs == 0)
                return 0;
        if (cfg->n_public_cidrs > EGRESS_MAX_PUBLIC_CIDRS) {
                snprintf(err, err_len, "at most %d --egress-public-cidr ranges", EGRESS_MAX_PUBLIC_CIDRS);
                return -EINVAL;
        }
        struct sockaddr_storage own[256];
        size_t n_own = 0;
        int r = egress_host_addrs(own, ELEMENTSOF(own), &n_own);
        if (r < 0) {
                snprintf(err, err_len, "--egress-public-cidr: cannot list this host's addresses: %s", strerror(-r));
                return r;
        }
        for (size_t i = 0; i < cfg->n_public_cidrs; i++) {
                const char *text = cfg->public_cidrs[i];
                EgressCidr *c = &svc->public_cidrs[i];
                if (egress_cidr_parse(text, c) < 0) {
                        snprintf(err, err_len,
                                 "--egress-public-cidr %.64s: want ADDRESS/PREFIX, IPv4 as a dotted quad or IPv6, "
                                 "with the host bits zero (203.0.113.0/24, 2001:db8:5::/48)",
                                 text);
                        return -EINVAL;
                }
                char why[200];
                if ((r = egress_cidr_check_public(c, own, n_own, why, sizeof(why))) < 0) {
                        snprintf(err, err_len, "--egress-public-cidr refused: %s", why);
                        return r;
                }
                svc->n_public_cidrs++;
        }
        return 0;
}

/* ---- the proxy process ---- */

#define PROXY_HELLO_MS 30000
#define PROXY_STOP_MS 5000

static int argv_push(char ***argv, size_t *n, const char *a, const char *b) {
        char **nv = realloc(*argv, (*n + 3) * sizeof(char *));
        if (!nv)
                return -ENOMEM;
        *argv = nv;
        nv[*n] = strdup(a);
        nv[*n + 1] = b ? strdup(b) : NULL;
        nv[*n + 1 + !!b] = NULL;
        if (!nv[*n] || (b && !nv[*n + 1]))
                return -ENOMEM;
        *n += 1 + !!b;
        return 0;
}

static int proxy_argv_new(EgressService *svc, const EgressServiceConfig *cfg) {
        char **argv = NULL;
        size_t n = 0;
        char max[16];
        snprintf(max, sizeof(max), "%u", svc->max_workers);
        int r = argv_push(&argv, &n, cfg->proxy_path ? cfg->proxy_path : "runtime-egress", NULL);
        if (r == 0)
                r = argv_push(&argv, &n, "--state-dir", cfg->state_dir);
        if (r == 0)
                r = argv_push(&argv, &n, "--max-connections", max);
        if (r == 0 && cfg->proxy_user)
                r = argv_push(&argv, &n, "--user", cfg->proxy_user);
        for (size_t i = 0; r == 0 && i < cfg->n_test_upstreams; i++)
                r = argv_push(&argv, &n, "--test-upstream", cfg->test_upstreams[i]);
        if (r == 0 && cfg->extra_ca_file)
                r = argv_push(&argv, &n, "--extra-ca", cfg->extra_ca_file);
        for (size_t i = 0; r == 0 && i < cfg->n_public_cidrs; i++)
                r = argv_push(&argv, &n, "--public-cidr", cfg->public_cidrs[i]);
        if (r == 0 && cfg->trust_ca_file)
                r = argv_push(&argv, &n, "--trust-ca", cfg->trust_ca_file);
        svc->proxy_argv = argv;
        return r;
}

/* Under proxy_lock. */
static void proxy_stop_locked(EgressService *svc, bool kill_now) {
        if (svc->proxy_ctl >= 0)
                close(svc->proxy_ctl);
        svc->proxy_ctl = -1;
        if (svc->proxy_pid <= 0)
                return;
        /* Without its control socket the proxy ends by itself. */
        if (kill_now)
                kill(svc->proxy_pid, SIGKILL);
        for (int waited = 0;; waited += 10) {
                pid_t w = waitpid(svc->proxy_pid, NULL, WNOHANG);
                if (w == svc->proxy_pid || (w < 0 && errno != EINTR))
                        break;
                if (waited == PROXY_STOP_MS)
                        kill(svc->proxy_pid, SIGKILL);
                usleep(10000);
        }
        svc->proxy_pid = 0;
}

/* Under proxy_lock: forks and execs runtime-egress with its control socket
 * on fd 3, and waits for its hello (the CA it loaded, after it dropped root
 * and its capabilities). */
static int proxy_start_locked(EgressService *svc) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0)
                return -errno;
        char *const *argv = svc->proxy_argv;
        pid_t pid = fork();
        if (pid < 0) {
                int r = -errno;
                close(sv[0]);
                close(sv[1]);
                return r;
        }
        if (pid == 0) {
                /* Async-signal-safe calls only, up to exec: other threads of
                 * the daemon may have held any lock at the fork. */
                sigset_t none;
                sigemptyset(&none);
                sigprocmask(SIG_SETMASK, &none, NULL);
                signal(SIGPIPE, SIG_DFL);
                if (sv[1] == 3 ? fcntl(3, F_SETFD, 0) < 0 : dup2(sv[1], 3) < 0)
                        _exit(127);
                if (syscall(SYS_close_range, 4u, ~0u, 0u) < 0)
                        for (int fd = 4; fd < 65536; fd++)
                                close(fd);
                execv(argv[0], argv);
                _exit(127);
        }
        close(sv[1]);
        struct pollfd pfd = { .fd = sv[0], .events = POLLIN };
        int pr;
        do
                pr = poll(&pfd, 1, PROXY_HELLO_MS);
        while (pr < 0 && errno == EINTR);
        char *buf = pr > 0 ? malloc(EGRESS_WIRE_MAX_HELLO) : NULL;
        ssize_t n = buf ? recv(sv[0], buf, EGRESS_WIRE_MAX_HELLO - 1, 0) : -1;
        json_t *hello = n > 0 && json_depth_ok(buf, (size_t)n, 4) ? json_loadb(buf, (size_t)n, 0, NULL) : NULL;
        free(buf);
        const char *ca = json_string_value(json_object_get(hello, "ca"));
        int r = 0;
        if (!ca || strncmp(ca, "-----BEGIN CERTIFICATE-----", 27) != 0)
                r = pr == 0 ? -ETIMEDOUT : -EPROTO;
        else if (svc->ca_pem && strcmp(svc->ca_pem, ca) != 0)
                r = -EPROTO; /* another CA than the sandboxes trust */
        else if (!svc->ca_pem && !(svc->ca_pem = strdup(ca)))
                r = -ENOMEM;
        json_decref(hello);
        svc->proxy_pid = pid;
        svc->proxy_ctl = sv[0];
        if (r < 0)
                proxy_stop_locked(svc, true);
        else
                log_info(NULL, "egress proxy started (pid %d)", (int)pid);
        return r;
}

/* Hands a connection's descriptors to the proxy, starting it again when it
 * is gone. */
static int proxy_send(EgressService *svc, int data, int meta) {
        pthread_mutex_lock(&svc->proxy_lock);
        int r = -EPIPE;
        for (int attempt = 0; attempt < 2; attempt++) {
                if (svc->proxy_ctl < 0 && (r = proxy_start_locked(svc)) < 0)
                        break;
                if ((r = egress_wire_send_conn(svc->proxy_ctl, data, meta)) != -EPIPE)
                        break;
                log_warn(NULL, "egress proxy (pid %d) is gone; starting another", (int)svc->proxy_pid);
                proxy_stop_locked(svc, true);
        }
        pthread_mutex_unlock(&svc->proxy_lock);
        return r;
}

int egress_service_new(const EgressServiceConfig *cfg, EgressService **ret, char *err, size_t err_len) {
        EgressService *svc = calloc(1, sizeof(*svc));
        if (!svc)
                return -ENOMEM;
        pthread_mutex_init(&svc->lock, NULL);
        pthread_cond_init(&svc->idle, NULL);
        pthread_cond_init(&svc->work, NULL);
        pthread_cond_init(&svc->refusal, NULL);
        pthread_mutex_init(&svc->proxy_lock, NULL);
        svc->proxy_ctl = -1;
        svc->max_workers = cfg->workers ? cfg->workers : EGRESS_DEFAULT_WORKERS;
        svc->share = cfg->workers_per_sandbox ? cfg->workers_per_sandbox : EGRESS_DEFAULT_WORKERS_PER_SANDBOX;
        if (svc->share > svc->max_workers)
                svc->share = svc->max_workers;
        svc->wait_ms = cfg->wait_timeout_ms ? cfg->wait_timeout_ms : EGRESS_DEFAULT_WAIT_TIMEOUT_MS;
        _cleanup_free_ char *trusted = NULL;
        unsigned n_trusted = 0;
        int r = -EINVAL;
        if (cfg->n_test_upstreams > MAX_TEST_UPSTREAMS) {
                snprintf(err, err_len, "at most %d --egress-test-upstream mappings", MAX_TEST_UPSTREAMS);
                goto fail;
        }
        for (size_t i = 0; i < cfg->n_test_upstreams; i++) {
                if (egress_test_host_parse(cfg->test_upstreams[i], &svc->test_hosts[i]) < 0) {
                        snprintf(err, err_len,
                                 "--egress-test-upstream %.100s: want NAME=127.0.0.1:PORT (loopback only)",
                                 cfg->test_upstreams[i]);
                        goto fail;
                }
                svc->n_test_hosts++;
        }
        if ((r = public_cidrs_load(svc, cfg, err, err_len)) < 0)
                goto fail;
        if (cfg->trust_ca_file &&
            (r = egress_ca_bundle_load(cfg->trust_ca_file, &trusted, &n_trusted, err, err_len)) < 0)
                goto fail;
        if ((r = proxy_argv_new(svc, cfg)) < 0) {
                snprintf(err, err_len, "out of memory");
                goto fail;
        }
        pthread_mutex_lock(&svc->proxy_lock);
        r = proxy_start_locked(svc);
        pthread_mutex_unlock(&svc->proxy_lock);
        if (r < 0) {
                snprintf(err, err_len, "cannot start the egress proxy %.200s (see its messages above): %s",
                         svc->proxy_argv[0], strerror(-r));
                goto fail;
        }
        if (asprintf(&svc->sandbox_ca_pem, "%s%s", svc->ca_pem, trusted ? trusted : "") < 0) {
                svc->sandbox_ca_pem = NULL;
                r = -ENOMEM;
                goto fail;
        }
        if ((r = sqldb_open(cfg->db_path, &svc->sql)) < 0) {
                snprintf(err, err_len, "cannot open the database");
                goto fail;
        }
        if ((r = sqldb_exec(svc->sql, schema)) < 0) {
                snprintf(err, err_len, "cannot make the egress tables");
                goto fail;
        }
        /* Columns added after the table's first release: a database made
         * before them gains them; the error of one that has them is expected. */
        (void)sqldb_exec(svc->sql, "ALTER TABLE egress_secrets ADD COLUMN header TEXT");
        (void)sqldb_exec(svc->sql, "ALTER TABLE egress_secrets ADD COLUMN format TEXT");
        (void)sqldb_exec(svc->sql, "ALTER TABLE egress_secrets ADD COLUMN rules TEXT");
        (void)sqldb_exec(svc->sql, "ALTER TABLE egress_log ADD COLUMN rule TEXT");
        (void)sqldb_exec(svc->sql, "ALTER TABLE egress_log ADD COLUMN duration_ms INTEGER");
        /* Entries from before the column were written when their connection
         * ended; since then an entry is written at the decision, and one
         * still open here was cut short by the daemon's own end. */
        if (sqldb_exec(svc->sql, "ALTER TABLE egress_log ADD COLUMN end_reason TEXT") == 0)
                (void)sqldb_exec(svc->sql, "UPDATE egress_log SET end_reason = 'closed' WHERE end_reason IS NULL");
        (void)sqldb_exec(svc->sql, "UPDATE egress_log SET end_reason = 'the daemon stopped during the connection' "
                                   "WHERE end_reason IS NULL");
        *ret = svc;
        return 0;
fail:
        egress_service_free(svc);
        return r;
}

void egress_service_free(EgressService *svc) {
        if (!svc)
                return;
        /* Connections end once their sandboxes' channels close; a tunnel
         * waiting on a silent upstream notices within a second. */
        pthread_mutex_lock(&svc->lock);
        svc->stopping = true;
        pthread_cond_broadcast(&svc->work);
        pthread_cond_broadcast(&svc->refusal);
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += 5;
        while (svc->active > 0 || svc->workers > 0 || svc->refuser)
                if (pthread_cond_timedwait(&svc->idle, &svc->lock, &dl) == ETIMEDOUT)
                        break;
        bool busy = svc->active > 0 || svc->workers > 0 || svc->refuser;
        pthread_mutex_unlock(&svc->lock);
        if (busy)
                return; /* leaked on purpose: a thread still uses it, and the process is ending */
        sqlite3_close(svc->sql);
        pthread_mutex_lock(&svc->proxy_lock);
        proxy_stop_locked(svc, false);
        pthread_mutex_unlock(&svc->proxy_lock);
        pthread_mutex_destroy(&svc->proxy_lock);
        if (svc->proxy_argv)
                for (char **a = svc->proxy_argv; *a; a++)
                        free(*a);
        free(svc->proxy_argv);
        free(svc->ca_pem);
        free(svc->sandbox_ca_pem);
        pthread_mutex_destroy(&svc->lock);
        pthread_cond_destroy(&svc->idle);
        pthread_cond_destroy(&svc->work);
        pthread_cond_destroy(&svc->refusal);
        free(svc);
}

/* ---- secrets ---- */

/* Whether a sandbox whose create named `scope` (NULL: every secret) gets
 * the secret `name`. */
static bool in_scope(const json_t *scope, const char *name) {
        if (!scope)
                return true;
        size_t i;
        json_t *v;
        json_array_foreach(scope, i, v) {
                if (json_is_string(v) && strcmp(json_string_value(v), name) == 0)
                        return true;
        }
        return false;
}

/* The owner's secrets within scope, values included, for one connection:
 * what the proxy process gets, and nothing more of the database. */
static int secrets_json(EgressService *svc, const char *owner, const json_t *scope, json_t **ret) {
        json_t *out = json_array();
        if (!out)
                return -ENOMEM;
        LOCKED(svc);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = 0;
        if (sqlite3_prepare_v2(svc->sql,
                               "SELECT name, value, hosts, placeholder, header, format, rules FROM egress_secrets "
                               "WHERE owner = ?1 ORDER BY name LIMIT 100",
                               -1, &st, NULL) != SQLITE_OK)
                r = -EIO;
        else {
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                while (sqlite3_step(st) == SQLITE_ROW) {
                        const char *name = (const char *)sqlite3_column_text(st, 0);
                        if (!in_scope(scope, name))
                                continue;
                        json_t *o = json_pack("{s:s,s:s,s:s,s:s,s:s?,s:s?,s:s?}", "name", name, "value",
                                              (const char *)sqlite3_column_text(st, 1), "hosts",
                                              (const char *)sqlite3_column_text(st, 2), "placeholder",
                                              (const char *)sqlite3_column_text(st, 3), "header",
                                              (const char *)sqlite3_column_text(st, 4), "format",
                                              (const char *)sqlite3_column_text(st, 5), "rules",
                                              (const char *)sqlite3_column_text(st, 6));
                        if (!o || json_array_append_new(out, o) < 0) {
                                r = -ENOMEM;
                                break;
                        }
                }
        }
        if (r < 0) {
                json_decref(out);
                return r;
        }
        *ret = out;
        return 0;
}

#define SECRET_COLUMNS "name, hosts, placeholder, created_at, updated_at, header, format, rules"

void egress_secret_info_done(EgressSecretInfo *s) {
        if (!s)
                return;
        free(s->name);
        free(s->hosts);
        free(s->placeholder);
        free(s->header);
        free(s->format);
        free(s->rules);
        *s = (EgressSecretInfo){ 0 };
}

void egress_secret_infos_free(EgressSecretInfo *s, size_t n) {
        for (size_t i = 0; s && i < n; i++)
                egress_secret_info_done(&s[i]);
        free(s);
}

static char *column_dup(sqlite3_stmt *st, int col) {
        const char *t = (const char *)sqlite3_column_text(st, col);
        return t ? strdup(t) : NULL;
}

/* A row of SECRET_COLUMNS. */
static int secret_info(sqlite3_stmt *st, EgressSecretInfo *ret) {
        EgressSecretInfo s = {
                .name = column_dup(st, 0),
                .hosts = column_dup(st, 1),
                .placeholder = column_dup(st, 2),
                .created_at = sqlite3_column_int64(st, 3),
                .updated_at = sqlite3_column_int64(st, 4),
                .header = column_dup(st, 5),
                .format = column_dup(st, 6),
                .rules = column_dup(st, 7),
        };
        if (!s.name || !s.hosts || !s.placeholder || (sqlite3_column_text(st, 5) && !s.header) ||
            (sqlite3_column_text(st, 6) && !s.format) || (sqlite3_column_text(st, 7) && !s.rules)) {
                egress_secret_info_done(&s);
                return -ENOMEM;
        }
        *ret = s;
        return 0;
}

static int secret_query_one(EgressService *svc, const char *owner, const char *name, EgressSecretInfo *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r = -ENOENT;
        if (sqlite3_prepare_v2(svc->sql,
                               "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = ?1 AND name = ?2", -1,
                               &st, NULL) != SQLITE_OK)
                return -EIO;
        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
        sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
        if (sqlite3_step(st) == SQLITE_ROW)
                r = secret_info(st, ret);
        return r;
}

static int name_error(SandboxError *e) {
        return sandbox_error(e, SANDBOX_ERR_INVALID, "use an environment variable name such as OPENAI_API_KEY",
                         "a secret's name must be [A-Za-z_][A-Za-z0-9_]{0,63} and not one the daemon sets "
                         "itself (HTTP_PROXY, PATH, ...)");
}

static int value_error(SandboxError *e) {
        return sandbox_error(e, SANDBOX_ERR_INVALID, "values go into HTTP headers, so they cannot hold line breaks",
                             "value must be a string of 1 to %d bytes of visible ASCII and spaces (no CR, LF, "
                             "tab or NUL)",
                             EGRESS_SECRET_MAX_VALUE);
}

/* Fields of the published client's secrets that a self-hosted daemon does
 * not serve: refused by name, never ignored, so no caller believes a secret
 * is narrower than it is. */
static const struct {
        const char *field, *what;
} not_served[] = {
        { "only", "per-secret sandbox selectors; name the secrets a sandbox may use in its create's "
                  "\"secrets\" instead" },
        { "githubApp", "GitHub App secrets" },
        { "git", "git push rules" },
        { "api", "per-secret API call budgets" },
        { "env", "another variable name than the secret's own; store it under that name" },
};

int egress_secret_put(EgressService *svc, const char *owner, const char *name, const json_t *body,
                      EgressSecretInfo *ret, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return name_error(e);
        if (!json_is_object(body))
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL,
                                     "the body must be an object {value, hosts, header, format, rules}");
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)body, key, v) {
                if (!strcmp(key, "value") || !strcmp(key, "hosts") || !strcmp(key, "header") ||
                    !strcmp(key, "format") || !strcmp(key, "rules"))
                        continue;
                for (size_t i = 0; i < ELEMENTSOF(not_served); i++)
                        if (strcmp(key, not_served[i].field) == 0)
                                return sandbox_error(e, SANDBOX_ERR_NOT_IMPLEMENTED,
                                                     "leave it out: this daemon serves value, hosts, header, "
                                                     "format and rules",
                                                     "%s: this self-hosted daemon has no %s", key, not_served[i].what);
                return sandbox_error(e, SANDBOX_ERR_INVALID, "the fields are value, hosts, header, format and rules",
                                     "unknown field %.64s", key);
        }
        json_t *value = json_object_get(body, "value"), *hosts = json_object_get(body, "hosts");
        if (!json_is_string(value) ||
            !egress_secret_value_valid(json_string_value(value), json_string_length(value)))
                return value_error(e);
        if (!json_is_array(hosts) || json_array_size(hosts) == 0 || json_array_size(hosts) > MAX_SECRET_HOSTS)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example [\"api.openai.com\"]",
                                 "hosts must be an array of 1 to %d host patterns the secret may go to",
                                 MAX_SECRET_HOSTS);
        json_t *header = json_object_get(body, "header"), *format = json_object_get(body, "format");
        json_t *rules = json_object_get(body, "rules");
        if (json_is_null(header))
                header = NULL;
        if (json_is_null(format))
                format = NULL;
        if (json_is_null(rules))
                rules = NULL;
        if (header && (!json_is_string(header) || strlen(json_string_value(header)) != json_string_length(header) ||
                       !egress_secret_header_valid(json_string_value(header))))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example \"Authorization\" or \"X-Api-Key\"",
                                     "header must be a header name (a token of 1 to %d bytes) that does not frame "
                                     "the request (not Host, Content-Length, Transfer-Encoding, Connection, "
                                     "Upgrade, TE, Trailer, Expect or Proxy-*)",
                                     EGRESS_SECRET_MAX_HEADER);
        if (format && !header)
                return sandbox_error(e, SANDBOX_ERR_INVALID, "give header with format", "format needs a header");
        if (format && (!json_is_string(format) || strlen(json_string_value(format)) != json_string_length(format) ||
                       !egress_secret_format_valid(json_string_value(format))))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "for example \"Bearer {value}\"",
                                     "format must be 1 to %d bytes of visible ASCII and spaces holding {value} "
                                     "exactly once",
                                     EGRESS_SECRET_MAX_FORMAT);
        _cleanup_json_ json_t *rules_norm = NULL;
        _cleanup_free_ char *rules_text = NULL;
        if (rules) {
                char err[256] = "";
                if (egress_secret_rules_parse(rules, &rules_norm, NULL, NULL, err, sizeof(err)) < 0)
                        return sandbox_error(e, SANDBOX_ERR_INVALID,
                                             "for example [{\"methods\": [\"GET\"], \"paths\": [\"/repos/acme/*\"]}]",
                                             "%s", err);
                if (!(rules_text = json_dumps(rules_norm, JSON_COMPACT)))
                        return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        }
        _cleanup_json_ json_t *net = json_pack("{s:b,s:O}", "internet", 1, "allow", hosts);
        EgressPolicy *p = NULL;
        char err[256] = "";
        if (!net || egress_policy_parse(net, &p, err, sizeof(err)) < 0)
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL, "hosts: %s", err[0] ? err : "invalid");
        _cleanup_json_ json_t *norm = egress_policy_to_json(p);
        egress_policy_free(p);
        _cleanup_free_ char *hosts_text = norm ? json_dumps(json_object_get(norm, "allow"), JSON_COMPACT) : NULL;
        if (!hosts_text)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");

        char rnd[33], placeholder[96];
        if (random_hex(rnd, 16) < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "no randomness");
        snprintf(placeholder, sizeof(placeholder), "%s%s-%s", EGRESS_PLACEHOLDER_PREFIX, name, rnd);
        int64_t now = time_now_unix();

        LOCKED(svc);
        int r = 0;
        _cleanup_stmt_ sqlite3_stmt *cst = NULL, *st = NULL;
        int64_t count = 0;
        if (sqlite3_prepare_v2(svc->sql,
                               "SELECT COUNT(*) FROM egress_secrets WHERE owner = ?1 AND name != ?2", -1, &cst,
                               NULL) == SQLITE_OK) {
                sqlite3_bind_text(cst, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(cst, 2, name, -1, SQLITE_STATIC);
                if (sqlite3_step(cst) == SQLITE_ROW)
                        count = sqlite3_column_int64(cst, 0);
        }
        if (count >= MAX_SECRETS_PER_OWNER)
                return sandbox_error(e, SANDBOX_ERR_CONFLICT, "delete one you no longer use",
                                     "at most %d secrets per owner", MAX_SECRETS_PER_OWNER);
        /* The placeholder is made once and kept across replaces and rotations:
         * running sandboxes hold it in their environment. A replace sets
         * every field but the placeholder: rules or a header left out are
         * cleared, never kept from the old value's time. */
        if (sqlite3_prepare_v2(svc->sql,
                               "INSERT INTO egress_secrets (owner, name, value, hosts, placeholder, created_at, "
                               "updated_at, header, format, rules) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6, ?7, ?8, ?9) "
                               "ON CONFLICT (owner, name) DO UPDATE SET value = excluded.value, hosts = "
                               "excluded.hosts, header = excluded.header, format = excluded.format, rules = "
                               "excluded.rules, updated_at = excluded.updated_at",
                               -1, &st, NULL) != SQLITE_OK)
                r = -EIO;
        else {
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, json_string_value(value), -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 4, hosts_text, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 5, placeholder, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 6, now);
                if (header)
                        sqlite3_bind_text(st, 7, json_string_value(header), -1, SQLITE_STATIC);
                if (format)
                        sqlite3_bind_text(st, 8, json_string_value(format), -1, SQLITE_STATIC);
                if (rules_text)
                        sqlite3_bind_text(st, 9, rules_text, -1, SQLITE_STATIC);
                r = sqlite3_step(st) == SQLITE_DONE ? 0 : -EIO;
        }
        if (r == 0)
                r = secret_query_one(svc, owner, name, ret);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not store the secret");
        return 0;
}

int egress_secret_rotate(EgressService *svc, const char *owner, const char *name, const json_t *body,
                         EgressSecretInfo *ret, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %.64s",
                                     name);
        const char *key;
        json_t *v;
        if (!json_is_object(body))
                return sandbox_error(e, SANDBOX_ERR_INVALID, NULL, "the body must be an object {value}");
        json_object_foreach((json_t *)body, key, v) {
                if (strcmp(key, "value") != 0)
                        return sandbox_error(e, SANDBOX_ERR_INVALID,
                                             "a rotation changes the value alone; to change the rest, PUT the secret",
                                             "unknown field %.64s", key);
        }
        json_t *value = json_object_get(body, "value");
        if (!json_is_string(value) ||
            !egress_secret_value_valid(json_string_value(value), json_string_length(value)))
                return value_error(e);
        LOCKED(svc);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int changed = -1, r = 0;
        if (sqlite3_prepare_v2(svc->sql,
                               "UPDATE egress_secrets SET value = ?3, updated_at = ?4 WHERE owner = ?1 AND name = ?2",
                               -1, &st, NULL) == SQLITE_OK) {
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 3, json_string_value(value), -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 4, time_now_unix());
                if (sqlite3_step(st) == SQLITE_DONE)
                        changed = sqlite3_changes(svc->sql);
        }
        if (changed > 0)
                r = secret_query_one(svc, owner, name, ret);
        if (changed == 0)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "store it first with PUT /v1/egress-secrets/{name}",
                                     "no secret %s", name);
        if (changed < 0 || r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not rotate the secret");
        return 0;
}

int egress_secret_get(EgressService *svc, const char *owner, const char *name, EgressSecretInfo *ret,
                      SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %.64s",
                                 name);
        pthread_mutex_lock(&svc->lock);
        int r = secret_query_one(svc, owner, name, ret);
        pthread_mutex_unlock(&svc->lock);
        if (r == -ENOENT)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, "list them with GET /v1/egress-secrets", "no secret %s", name);
        if (r < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the secret");
        return 0;
}

int egress_secret_list(EgressService *svc, const char *owner, unsigned limit, const char *after,
                       EgressSecretInfo **ret, size_t *ret_n, bool *ret_more, SandboxError *e) {
        if (after && !egress_secret_name_ok(after))
                return sandbox_error(e, SANDBOX_ERR_INVALID, "pass the last name of the page before",
                                     "after must be a secret's name");
        if (limit == 0 || limit > MAX_SECRETS_PER_OWNER)
                limit = MAX_SECRETS_PER_OWNER;
        EgressSecretInfo *list = calloc(limit, sizeof(*list));
        if (!list)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        size_t n = 0;
        bool more = false;
        int r = 0;
        {
                LOCKED(svc);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(svc->sql,
                                       "SELECT " SECRET_COLUMNS " FROM egress_secrets WHERE owner = ?1 AND name > ?2 "
                                       "ORDER BY name LIMIT ?3",
                                       -1, &st, NULL) != SQLITE_OK)
                        r = -EIO;
                else {
                        sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                        sqlite3_bind_text(st, 2, after ? after : "", -1, SQLITE_STATIC);
                        sqlite3_bind_int(st, 3, (int)limit + 1);
                        while (r == 0 && sqlite3_step(st) == SQLITE_ROW) {
                                if (n == limit) {
                                        more = true;
                                        break;
                                }
                                if ((r = secret_info(st, &list[n])) == 0)
                                        n++;
                        }
                }
        }
        if (r < 0) {
                egress_secret_infos_free(list, n);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not list the secrets");
        }
        *ret = list;
        *ret_n = n;
        *ret_more = more;
        return 0;
}

int egress_secret_delete(EgressService *svc, const char *owner, const char *name, SandboxError *e) {
        if (!egress_secret_name_ok(name))
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, NULL, "no secret %.64s", name);
        LOCKED(svc);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int changed = -1;
        if (sqlite3_prepare_v2(svc->sql, "DELETE FROM egress_secrets WHERE owner = ?1 AND name = ?2", -1, &st,
                               NULL) == SQLITE_OK) {
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                sqlite3_bind_text(st, 2, name, -1, SQLITE_STATIC);
                if (sqlite3_step(st) == SQLITE_DONE)
                        changed = sqlite3_changes(svc->sql);
        }
        if (changed < 0)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not delete the secret");
        if (changed == 0)
                return sandbox_error(e, SANDBOX_ERR_NOT_FOUND, NULL, "no secret %s", name);
        /* Connections load the owner's secrets when they open: from now on no
         * new request carries the value. */
        return 0;
}

/* ---- the audit log ---- */

static const char *audit_kind(const EgressRecord *rec) {
        return rec->host[0] ? (rec->connect ? "connect" : "http") : "none";
}

/* A new entry: at the decision (ended false: its end, duration and counts
 * come later, into the same row), or whole, for a connection that ended
 * before the proxy decided anything. Returns the row's id, or 0 when it
 * could not be written. */
static int64_t audit_insert(EgressService *svc, const char *sandbox_id, const EgressRecord *rec, bool ended) {
        LOCKED(svc);
        int64_t id = 0;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(svc->sql,
                               "INSERT INTO egress_log (sandbox, at, host, port, kind, allowed, reason, addr, "
                               "bytes_out, bytes_in, intercepted, secrets_used, rule, duration_ms, end_reason) VALUES "
                               "(?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                               -1, &st, NULL) == SQLITE_OK) {
                sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 2, time_now_unix());
                sqlite3_bind_text(st, 3, rec->host, -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 4, rec->port);
                sqlite3_bind_text(st, 5, audit_kind(rec), -1, SQLITE_STATIC);
                sqlite3_bind_int(st, 6, rec->allowed);
                sqlite3_bind_text(st, 7, rec->reason, -1, SQLITE_STATIC);
                if (rec->addr[0])
                        sqlite3_bind_text(st, 8, rec->addr, -1, SQLITE_STATIC);
                sqlite3_bind_int64(st, 9, (sqlite3_int64)rec->bytes_out);
                sqlite3_bind_int64(st, 10, (sqlite3_int64)rec->bytes_in);
                sqlite3_bind_int(st, 11, rec->intercepted);
                sqlite3_bind_int(st, 12, (int)rec->secrets_used);
                if (rec->rule[0])
                        sqlite3_bind_text(st, 13, rec->rule, -1, SQLITE_STATIC);
                if (ended) {
                        sqlite3_bind_int64(st, 14, (sqlite3_int64)rec->duration_ms);
                        sqlite3_bind_text(st, 15, rec->end[0] ? rec->end : "closed", -1, SQLITE_STATIC);
                }
                if (sqlite3_step(st) == SQLITE_DONE)
                        id = sqlite3_last_insert_rowid(svc->sql);
        }
        /* Bounded per sandbox: a sandbox that opens connections without end
         * cannot grow the database without end. */
        _cleanup_stmt_ sqlite3_stmt *trim = NULL;
        if (++svc->inserts % 256 == 0 &&
            sqlite3_prepare_v2(svc->sql,
                               "DELETE FROM egress_log WHERE sandbox = ?1 AND id <= (SELECT id FROM egress_log "
                               "WHERE sandbox = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
                               -1, &trim, NULL) == SQLITE_OK) {
                sqlite3_bind_text(trim, 1, sandbox_id, -1, SQLITE_STATIC);
                sqlite3_bind_int(trim, 2, AUDIT_KEEP_PER_SANDBOX);
                (void)sqlite3_step(trim);
        }
        return id;
}

/* The same entry, in place: a later refusal of what was allowed (ended
 * false), or its end. The host, port, kind, address and rule stay as
 * decided. */
static void audit_update(EgressService *svc, int64_t id, const char *sandbox_id, const EgressRecord *rec,
                         bool ended) {
        LOCKED(svc);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        const char *sql = ended ? "UPDATE egress_log SET allowed = ?3, reason = ?4, bytes_out = ?5, bytes_in = ?6, "
                                  "intercepted = ?7, secrets_used = ?8, duration_ms = ?9, end_reason = ?10 "
                                  "WHERE id = ?1 AND sandbox = ?2"
                                : "UPDATE egress_log SET allowed = ?3, reason = ?4 WHERE id = ?1 AND sandbox = ?2";
        if (sqlite3_prepare_v2(svc->sql, sql, -1, &st, NULL) != SQLITE_OK)
                return;
        sqlite3_bind_int64(st, 1, id);
        sqlite3_bind_text(st, 2, sandbox_id, -1, SQLITE_STATIC);
        sqlite3_bind_int(st, 3, rec->allowed);
        sqlite3_bind_text(st, 4, rec->reason, -1, SQLITE_STATIC);
        if (ended) {
                sqlite3_bind_int64(st, 5, (sqlite3_int64)rec->bytes_out);
                sqlite3_bind_int64(st, 6, (sqlite3_int64)rec->bytes_in);
                sqlite3_bind_int(st, 7, rec->intercepted);
                sqlite3_bind_int(st, 8, (int)rec->secrets_used);
                sqlite3_bind_int64(st, 9, (sqlite3_int64)rec->duration_ms);
                sqlite3_bind_text(st, 10, rec->end[0] ? rec->end : "closed", -1, SQLITE_STATIC);
        }
        (void)sqlite3_step(st);
}

static void column_copy(sqlite3_stmt *st, int col, char *buf, size_t len) {
        const char *t = (const char *)sqlite3_column_text(st, col);
        snprintf(buf, len, "%s", t ? t : "");
}

int egress_audit_list(EgressService *svc, const char *sandbox_id, unsigned limit, EgressAuditEntry **ret,
                      size_t *ret_n, SandboxError *e) {
        EgressAuditEntry *list = calloc(limit ? limit : 1, sizeof(*list));
        if (!list)
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "out of memory");
        size_t n = 0;
        int r = 0;
        {
                LOCKED(svc);
                _cleanup_stmt_ sqlite3_stmt *st = NULL;
                if (sqlite3_prepare_v2(svc->sql,
                                       "SELECT at, host, port, kind, allowed, reason, addr, bytes_out, bytes_in, "
                                       "intercepted, secrets_used, rule, duration_ms, end_reason FROM egress_log "
                                       "WHERE sandbox = ?1 ORDER BY id DESC LIMIT ?2",
                                       -1, &st, NULL) != SQLITE_OK)
                        r = -EIO;
                else {
                        sqlite3_bind_text(st, 1, sandbox_id, -1, SQLITE_STATIC);
                        sqlite3_bind_int(st, 2, (int)limit);
                        while (n < limit && sqlite3_step(st) == SQLITE_ROW) {
                                EgressAuditEntry *a = &list[n++];
                                a->at = sqlite3_column_int64(st, 0);
                                column_copy(st, 1, a->rec.host, sizeof a->rec.host);
                                a->rec.port = (uint16_t)sqlite3_column_int(st, 2);
                                column_copy(st, 3, a->kind, sizeof a->kind);
                                a->rec.connect = strcmp(a->kind, "connect") == 0;
                                a->rec.allowed = sqlite3_column_int(st, 4) != 0;
                                column_copy(st, 5, a->rec.reason, sizeof a->rec.reason);
                                column_copy(st, 6, a->rec.addr, sizeof a->rec.addr);
                                a->rec.bytes_out = (uint64_t)sqlite3_column_int64(st, 7);
                                a->rec.bytes_in = (uint64_t)sqlite3_column_int64(st, 8);
                                a->rec.intercepted = sqlite3_column_int(st, 9) != 0;
                                a->rec.secrets_used = (unsigned)sqlite3_column_int(st, 10);
                                column_copy(st, 11, a->rec.rule, sizeof a->rec.rule);
                                a->ended = sqlite3_column_type(st, 13) != SQLITE_NULL;
                                a->rec.duration_ms = (uint64_t)sqlite3_column_int64(st, 12);
                                column_copy(st, 13, a->rec.end, sizeof a->rec.end);
                        }
                }
        }
        if (r < 0) {
                free(list);
                return sandbox_error(e, SANDBOX_ERR_INTERNAL, NULL, "could not read the egress log");
        }
        *ret = list;
        *ret_n = n;
        return 0;
}

/* ---- what a sandbox gets ---- */

json_t *egress_service_sandbox_env(EgressService *svc, const char *owner, const json_t *scope) {
        json_t *env = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "HTTP_PROXY", RELAY_URL,
                                "HTTPS_PROXY", RELAY_URL, "http_proxy", RELAY_URL, "https_proxy", RELAY_URL,
                                "NO_PROXY", "localhost,127.0.0.1,::1", "no_proxy", "localhost,127.0.0.1,::1",
                                "SSL_CERT_FILE", SANDBOX_CA_BUNDLE, "REQUESTS_CA_BUNDLE", SANDBOX_CA_BUNDLE,
                                "PIP_CERT", SANDBOX_CA_BUNDLE, "CURL_CA_BUNDLE", SANDBOX_CA_BUNDLE,
                                "NODE_EXTRA_CA_CERTS", SANDBOX_CA_FILE);
        if (!env)
                return NULL;
        LOCKED(svc);
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        if (sqlite3_prepare_v2(svc->sql, "SELECT name, placeholder FROM egress_secrets WHERE owner = ?1", -1, &st,
                               NULL) == SQLITE_OK) {
                sqlite3_bind_text(st, 1, owner, -1, SQLITE_STATIC);
                while (sqlite3_step(st) == SQLITE_ROW)
                        if (in_scope(scope, (const char *)sqlite3_column_text(st, 0)))
                                json_object_set_new(env, (const char *)sqlite3_column_text(st, 0),
                                                    json_string((const char *)sqlite3_column_text(st, 1)));
        }
        return env;
}

/* The image's bundle, read on the host: what a fresh sandbox of the image
 * starts with. The image's root is a tree its builder filled from packages,
 * so it is opened like hostile input: symlinks resolve inside it (as they do
 * in the sandbox) and never out of it, no magic links, no other filesystem,
 * only a regular file of at most MAX_BUNDLE bytes. -ENOENT when the image has
 * no bundle; another error when the host cannot tell. */
static int read_image_bundle(const char *image_dir, char **ret, size_t *ret_len) {
        _cleanup_free_ char *root = NULL;
        if (asprintf(&root, "%s/rootfs", image_dir) < 0)
                return -ENOMEM;
        _cleanup_close_ int dfd = open(root, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (dfd < 0)
                return errno == ENOENT ? -ENOTDIR : -errno; /* no rootfs is not "no bundle" */
        struct open_how how = {
                .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
                .resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
        };
        _cleanup_close_ int fd = (int)syscall(SYS_openat2, dfd, SANDBOX_CA_BUNDLE + 1, &how, sizeof how);
        if (fd < 0)
                return -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        if (st.st_size < 0 || (uint64_t)st.st_size > MAX_BUNDLE)
                return -E2BIG;
        /* The size may change under us: read to EOF, bounded all the same. */
        size_t cap = (size_t)st.st_size + 1, len = 0;
        _cleanup_free_ char *buf = malloc(cap + 1);
        if (!buf)
                return -ENOMEM;
        for (;;) {
                if (len == cap) {
                        if (cap > MAX_BUNDLE)
                                return -E2BIG;
                        size_t ncap = cap * 2 > MAX_BUNDLE + 1 ? MAX_BUNDLE + 1 : cap * 2;
                        char *nb = realloc(buf, ncap + 1);
                        if (!nb)
                                return -ENOMEM;
                        buf = nb;
                        cap = ncap;
                }
                ssize_t n = read(fd, buf + len, cap - len);
                if (n < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (n == 0)
                        break;
                len += (size_t)n;
        }
        if (len > MAX_BUNDLE)
                return -E2BIG;
        buf[len] = '\0';
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

/* The agent's answers to the CA install's reads and writes. */
#define AGENT_TIMEOUT_MS 10000

int egress_service_install_ca(EgressService *svc, Channel *c, const char *image_dir) {
        const char *pem = svc->sandbox_ca_pem;
        size_t pem_len = strlen(pem);
        _cleanup_free_ char *bundle = NULL;
        size_t len = 0;
        int r = image_dir ? read_image_bundle(image_dir, &bundle, &len) : -EOPNOTSUPP;
        if (r < 0 && r != -ENOENT) {
                /* The host cannot tell (no openat2, say): ask the sandbox. */
                if (image_dir)
                        log_warn(NULL, "egress CA: cannot read the image's trust store on the host (%s); "
                                       "reading it through the agent", strerror(-r));
                r = agent_read_file(c, SANDBOX_CA_BUNDLE, MAX_BUNDLE, AGENT_TIMEOUT_MS, &bundle, &len);
        }
        if (r == -ENOENT) {
                free(bundle);
                bundle = strdup("");
                len = 0;
                r = bundle ? 0 : -ENOMEM;
        }
        if (r < 0)
                return r;
        _cleanup_free_ char *out = NULL;
        size_t out_len = 0;
        if (!strstr(bundle, pem)) { /* else a restarted sandbox has it already */
                size_t sep = len > 0 && bundle[len - 1] != '\n';
                out_len = len + sep + pem_len;
                if (!(out = malloc(out_len)))
                        return -ENOMEM;
                memcpy(out, bundle, len);
                if (sep)
                        out[len] = '\n';
                memcpy(out + len + sep, pem, pem_len);
        }
        /* Both writes in flight before either answer is awaited. */
        ChanStream *ca = NULL, *all = NULL;
        if ((r = agent_write_begin(c, SANDBOX_CA_FILE, pem, pem_len, AGENT_TIMEOUT_MS, &ca)) < 0)
                return r;
        int r2 = out ? agent_write_begin(c, SANDBOX_CA_BUNDLE, out, out_len, AGENT_TIMEOUT_MS, &all) : 0;
        r = agent_write_finish(ca, AGENT_TIMEOUT_MS);
        if (all)
                r2 = agent_write_finish(all, AGENT_TIMEOUT_MS);
        return r < 0 ? r : r2;
}

/* ---- per sandbox ---- */

int egress_sandbox_new(EgressService *svc, const char *sandbox_id, const char *owner, const json_t *network,
                       const json_t *scope, bool trial, SandboxEgress **ret) {
        SandboxEgress *se = calloc(1, sizeof(*se));
        if (!se)
                return -ENOMEM;
        se->svc = svc;
        atomic_init(&se->refs, 1);
        snprintf(se->id, sizeof(se->id), "%s", sandbox_id);
        snprintf(se->owner, sizeof(se->owner), "%s", owner);
        se->trial = trial;
        pthread_mutex_init(&se->lock, NULL);
        se->network = network ? json_deep_copy(network) : json_pack("{s:b}", "internet", 0);
        se->scope = scope ? json_deep_copy(scope) : NULL;
        if (!se->network || (scope && !se->scope)) {
                egress_sandbox_unref(se);
                return -ENOMEM;
        }
        *ret = se;
        return 0;
}

int egress_sandbox_set_network(SandboxEgress *se, const json_t *network) {
        json_t *copy = json_deep_copy(network);
        if (!copy)
                return -ENOMEM;
        pthread_mutex_lock(&se->lock);
        json_t *old = se->network;
        se->network = copy;
        pthread_mutex_unlock(&se->lock);
        json_decref(old);
        return 0;
}

void egress_sandbox_unref(SandboxEgress *se) {
        if (!se || atomic_fetch_sub(&se->refs, 1) != 1)
                return;
        json_decref(se->network);
        json_decref(se->scope);
        pthread_mutex_destroy(&se->lock);
        free(se);
}

struct Conn {
        SandboxEgress *se;
        ChanStream *s;
        Conn *next;
        uint64_t queued_ms; /* when it joined the waiting room */
        bool over_total;    /* refused for the pool's waiting room, not the sandbox's */
        bool timed_out;     /* refused after waiting longer than wait_ms */
};

/* Idle workers and the refuser end after this long without work. */
#define POOL_IDLE_MS 30000
/* A connection past its sandbox's share waits for one of its own to end;
 * this many may wait per sandbox, and this many in all. */
#define WAIT_PER_SANDBOX 128u
#define WAIT_TOTAL 4096u
/* Refused connections waiting for their 503 and audit entry; past this
 * they are closed unanswered and counted into the next entry. */
#define REFUSALS_MAX 256u
#define REFUSAL_WRITE_MS 1000

/* The proxy's answers on the meta socket, and a connection's settings. */
#define SETTINGS_MS 10000
#define RECORD_MS 5000
#define PUMP_CHUNK 65536

/* A connection's audit entry, made from the proxy's records as they come
 * on the meta socket: written at the decision, completed at the end. Used
 * by the pump towards the sandbox while it runs, then by the worker. */
typedef struct Audit {
        EgressService *svc;
        SandboxEgress *se;
        int fd;     /* meta */
        int64_t id; /* the entry's row; 0 before the decision */
        EgressRecord rec;
        unsigned records;
        bool ended; /* the end record came */
        bool done;  /* no more records: ended, closed, or broken */
        bool broken; /* a record over the bounds, or malformed */
        uint64_t started_ms;
} Audit;

static void audit_log_decision(const Audit *a) {
        log_info(NULL, "egress %s %s %s:%u %s (%s%s%s)", a->se->id, a->rec.connect ? "CONNECT" : "HTTP",
                 a->rec.host[0] ? a->rec.host : "-", a->rec.port, a->rec.allowed ? "allowed" : "refused", a->rec.reason,
                 a->rec.rule[0] ? "; rule: " : "", a->rec.rule);
}

/* One record from the proxy, into the audit log at once. -EPIPE once the
 * proxy has nothing more to say (or is gone), -EBADMSG for a record out of
 * its bounds (the connection is then ended). */
static int audit_read(Audit *a, int timeout_ms) {
        if (a->done)
                return -EPIPE;
        json_t *j = NULL;
        EgressRecord rec;
        EgressWireKind kind;
        uint64_t decided_us = 0;
        int r = egress_wire_read(a->fd, EGRESS_WIRE_MAX_RECORD, timeout_ms, &j);
        if (r == 0 && (egress_wire_record_parse(j, &rec, &kind, &decided_us) < 0 ||
                       ++a->records > EGRESS_WIRE_MAX_RECORDS || (a->ended && kind == EGRESS_WIRE_END)))
                r = -EBADMSG;
        json_decref(j);
        if (r < 0) {
                a->done = true;
                a->broken = r == -EBADMSG;
                return r == -EBADMSG ? r : -EPIPE;
        }
        if (kind == EGRESS_WIRE_DECISION) {
                if (a->id == 0) {
                        a->rec = rec;
                        a->id = audit_insert(a->svc, a->se->id, &rec, false);
                        /* How long the entry took from the proxy's decision
                         * (both clocks are the host's CLOCK_MONOTONIC). */
                        struct timespec ts;
                        clock_gettime(CLOCK_MONOTONIC, &ts);
                        uint64_t now_us = (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
                        if (decided_us && now_us >= decided_us && now_us - decided_us < 60000000u)
                                log_debug(NULL, "egress %s: audit entry %lld written %llu us after the decision",
                                          a->se->id, (long long)a->id, (unsigned long long)(now_us - decided_us));
                        audit_log_decision(a);
                } else if (a->rec.allowed || !rec.allowed) {
                        /* Only ever narrower: what was refused stays refused. */
                        a->rec.allowed = rec.allowed;
                        memcpy(a->rec.reason, rec.reason, sizeof(rec.reason));
                        audit_update(a->svc, a->id, a->se->id, &a->rec, false);
                        audit_log_decision(a);
                }
                return 0;
        }
        a->ended = true;
        a->done = true;
        if (a->id == 0) {
                /* Nothing was decided before the end (the proxy could not
                 * read the connection's settings, say): the end is the whole
                 * entry, when it says anything. */
                a->rec = rec;
                if (rec.host[0] || rec.reason[0]) {
                        a->id = audit_insert(a->svc, a->se->id, &rec, true);
                        audit_log_decision(a);
                }
        } else {
                if (!a->rec.allowed)
                        rec.allowed = false;
                if (!a->rec.allowed && !rec.allowed && rec.reason[0] == '\0')
                        memcpy(rec.reason, a->rec.reason, sizeof(rec.reason));
                a->rec.allowed = rec.allowed;
                memcpy(a->rec.reason, rec.reason, sizeof(rec.reason));
                a->rec.bytes_out = rec.bytes_out;
                a->rec.bytes_in = rec.bytes_in;
                a->rec.intercepted = rec.intercepted;
                a->rec.secrets_used = rec.secrets_used;
                a->rec.duration_ms = rec.duration_ms;
                memcpy(a->rec.end, rec.end, sizeof(rec.end));
                audit_update(a->svc, a->id, a->se->id, &a->rec, true);
        }
        log_debug(NULL, "egress %s %s:%u ended: %s (%llu bytes out, %llu in, %llu ms)", a->se->id,
                  a->rec.host[0] ? a->rec.host : "-", a->rec.port, a->rec.end, (unsigned long long)a->rec.bytes_out,
                  (unsigned long long)a->rec.bytes_in, (unsigned long long)a->rec.duration_ms);
        return 0;
}

/* Every record the proxy has already sent, without waiting for more. */
static int audit_drain(Audit *a) {
        while (!a->done) {
                struct pollfd pfd = { .fd = a->fd, .events = POLLIN };
                int r = poll(&pfd, 1, 0);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r <= 0)
                        return 0;
                if ((r = audit_read(a, RECORD_MS)) == -EBADMSG)
                        return r;
        }
        return 0;
}

/* The proxy gave no end (it died, or broke the protocol): the entry ends
 * here with why, one entry all the same. */
static void audit_finish(Audit *a, const char *why) {
        if (a->ended)
                return;
        snprintf(a->rec.end, sizeof(a->rec.end), "%s", why);
        a->rec.duration_ms = time_now_mono_ms() - a->started_ms;
        if (a->id) {
                audit_update(a->svc, a->id, a->se->id, &a->rec, true);
        } else {
                memset(&a->rec, 0, sizeof(a->rec));
                snprintf(a->rec.reason, sizeof(a->rec.reason), "%s", why);
                snprintf(a->rec.end, sizeof(a->rec.end), "%s", why);
                a->rec.duration_ms = time_now_mono_ms() - a->started_ms;
                a->id = audit_insert(a->svc, a->se->id, &a->rec, true);
                audit_log_decision(a);
        }
        a->ended = a->done = true;
}

/* The proxy towards the sandbox: its bytes on the data socket become the
 * stream's, and its end the stream's EOF. The connection's records are
 * read here too, and always before the bytes that came after them: the
 * proxy writes a decision before it answers or relays, so a sandbox's
 * client never has an answer whose audit entry is not written yet. */
typedef struct Pump {
        ChanStream *s;
        int fd;
        Audit *audit;
        atomic_bool stop;
        atomic_bool done;
} Pump;

static void *pump_to_sandbox(void *arg) {
        Pump *p = arg;
        Audit *a = p->audit;
        uint8_t *buf = malloc(PUMP_CHUNK);
        while (buf && !atomic_load(&p->stop)) {
                struct pollfd pfd[2] = { { .fd = p->fd, .events = POLLIN }, { .fd = a->fd, .events = POLLIN } };
                int r = poll(pfd, a->done ? 1 : 2, 1000);
                if (r < 0 && errno != EINTR)
                        break;
                if (r <= 0)
                        continue;
                if (!a->done && pfd[1].revents && audit_read(a, RECORD_MS) == -EBADMSG)
                        break;
                if (!pfd[0].revents)
                        continue;
                ssize_t n = recv(p->fd, buf, PUMP_CHUNK, MSG_DONTWAIT);
                if (n < 0 && (errno == EAGAIN || errno == EINTR))
                        continue;
                /* A record sent before these bytes is readable now: it goes
                 * into the log first. */
                if (audit_drain(a) < 0)
                        break;
                if (n <= 0 || chan_stream_write(p->s, buf, (size_t)n, 60000) < 0)
                        break;
        }
        free(buf);
        (void)chan_stream_close_write(p->s);
        atomic_store(&p->done, true);
        return NULL;
}

/* The sandbox towards the proxy, until the proxy is done with the
 * connection (it closed the data socket) or the sandbox is gone. */
static void pump_to_proxy(Pump *p) {
        bool sandbox_eof = false;
        while (!atomic_load(&p->done)) {
                ChanEvent ev;
                if (chan_stream_next(p->s, 1000, &ev) < 0)
                        continue;
                if (ev.type == CHAN_EV_DATA && !sandbox_eof) {
                        int r = io_send_all(p->fd, ev.data, ev.len);
                        chan_event_clear(&ev);
                        if (r < 0)
                                break;
                } else if (ev.type == CHAN_EV_EOF) {
                        sandbox_eof = true;
                        (void)shutdown(p->fd, SHUT_WR);
                } else {
                        chan_event_clear(&ev); /* the agent gave up, or the channel closed */
                        break;
                }
        }
}

/* A refusal the daemon answers itself, in the proxy's form: the entry is
 * written first, then the sandbox hears why. */
static void refuse_stream(EgressService *svc, SandboxEgress *se, ChanStream *s, int status, const char *title,
                          const EgressRecord *rec) {
        EgressRecord r = *rec;
        if (!r.end[0])
                snprintf(r.end, sizeof(r.end), "refused");
        (void)audit_insert(svc, se->id, &r, true);
        char body[320];
        int bl = snprintf(body, sizeof(body), "runtime egress: %s\n", rec->reason);
        if (bl < 0 || (size_t)bl >= sizeof(body))
                bl = (int)sizeof(body) - 1;
        char msg[640];
        int ml = snprintf(msg, sizeof(msg),
                          "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"
                          "%sConnection: close\r\nX-Runtime-Egress: refused\r\n\r\n%.*s",
                          status, title, bl, status == 503 ? "Retry-After: 1\r\n" : "", bl, body);
        if (ml > 0 && (size_t)ml < sizeof(msg))
                (void)chan_stream_write(s, msg, (size_t)ml, REFUSAL_WRITE_MS);
        (void)chan_stream_close_write(s);
}

static void serve(EgressService *svc, Conn *conn) {
        SandboxEgress *se = conn->se;
        Audit audit = { .svc = svc, .se = se, .fd = -1, .started_ms = time_now_mono_ms() };
        int data[2] = { -1, -1 }, meta[2] = { -1, -1 };
        json_t *settings = NULL;
        int r;
        pthread_mutex_lock(&se->lock);
        bool internet = json_is_true(json_object_get(se->network, "internet"));
        settings = json_pack("{s:s,s:O,s:b}", "sandbox", se->id, "network", se->network, "trial", se->trial);
        pthread_mutex_unlock(&se->lock);
        /* Secret values go to the proxy only for a sandbox that may reach a
         * host at all; the proxy writes each only towards its own hosts. */
        json_t *secrets = NULL;
        if (settings && internet && secrets_json(svc, se->owner, se->scope, &secrets) == 0)
                json_object_set_new(settings, "secrets", secrets);
        if (!settings || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, data) < 0 ||
            socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, meta) < 0) {
                EgressRecord rec = { 0 };
                snprintf(rec.reason, sizeof(rec.reason), "the daemon is out of resources");
                refuse_stream(svc, se, conn->s, 503, "Service Unavailable", &rec);
                goto done;
        }
        r = proxy_send(svc, data[1], meta[1]);
        close(data[1]);
        close(meta[1]);
        data[1] = meta[1] = -1;
        if (r < 0) {
                EgressRecord rec = { 0 };
                snprintf(rec.reason, sizeof(rec.reason), "the egress proxy is not running");
                refuse_stream(svc, se, conn->s, 502, "Bad Gateway", &rec);
                log_error(NULL, "egress %s: cannot hand the connection to the proxy: %s", se->id, strerror(-r));
                goto done;
        }
        audit.fd = meta[0];
        if (egress_wire_write(meta[0], settings, SETTINGS_MS) < 0) {
                audit_finish(&audit, "the egress proxy ended during the connection");
                goto done;
        }
        Pump pump = { .s = conn->s, .fd = data[0], .audit = &audit };
        pthread_t t;
        if (pthread_create(&t, NULL, pump_to_sandbox, &pump) != 0) {
                audit_finish(&audit, "the daemon is out of resources");
                goto done;
        }
        pump_to_proxy(&pump);
        atomic_store(&pump.stop, true);
        (void)shutdown(data[0], SHUT_RDWR);
        pthread_join(t, NULL);
        /* The end record follows the data socket's end. */
        while (!audit.done)
                (void)audit_read(&audit, RECORD_MS);
        if (audit.broken) {
                log_warn(NULL, "egress %s: the proxy sent a record out of bounds; the connection is ended", se->id);
                audit_finish(&audit, "the egress proxy sent a malformed record");
        } else
                audit_finish(&audit, "the egress proxy ended during the connection");
done:
        egress_wire_settings_free(settings);
        for (int i = 0; i < 2; i++) {
                if (data[i] >= 0)
                        close(data[i]);
                if (meta[i] >= 0)
                        close(meta[i]);
        }
        chan_stream_finish(conn->s, NULL);
        chan_stream_free(conn->s);
}

/* Under svc->lock: the first waiting connection whose sandbox is within its
 * share, taken off the queue. */
static Conn *queue_take(EgressService *svc) {
        for (Conn **p = &svc->queue, *prev = NULL; *p; prev = *p, p = &(*p)->next) {
                Conn *c = *p;
                if (c->se->serving >= svc->share)
                        continue;
                *p = c->next;
                if (svc->queue_tail == c)
                        svc->queue_tail = prev;
                c->next = NULL;
                svc->n_waiting--;
                c->se->waiting--;
                c->se->serving++;
                return c;
        }
        return NULL;
}

/* Under svc->lock: one connection fewer held. */
static void conn_done_locked(EgressService *svc) {
        if (--svc->active == 0)
                pthread_cond_broadcast(&svc->idle);
}

static void deadline_in(struct timespec *dl, long ms) {
        clock_gettime(CLOCK_REALTIME, dl);
        dl->tv_sec += ms / 1000;
        dl->tv_nsec += (ms % 1000) * 1000000L;
        if (dl->tv_nsec >= 1000000000L) {
                dl->tv_sec++;
                dl->tv_nsec -= 1000000000L;
        }
}

static void *worker_main(void *arg) {
        EgressService *svc = arg;
        pthread_mutex_lock(&svc->lock);
        bool timed_out = false;
        for (;;) {
                Conn *conn = queue_take(svc);
                if (conn) {
                        timed_out = false;
                        pthread_mutex_unlock(&svc->lock);
                        SandboxEgress *se = conn->se;
                        serve(svc, conn);
                        free(conn);
                        pthread_mutex_lock(&svc->lock);
                        se->serving--;
                        conn_done_locked(svc);
                        pthread_mutex_unlock(&svc->lock);
                        egress_sandbox_unref(se);
                        pthread_mutex_lock(&svc->lock);
                        continue;
                }
                if (svc->stopping || timed_out)
                        break;
                struct timespec dl;
                deadline_in(&dl, POOL_IDLE_MS);
                svc->idle_workers++;
                int r = pthread_cond_timedwait(&svc->work, &svc->lock, &dl);
                svc->idle_workers--;
                if (svc->wakeups > 0)
                        svc->wakeups--;
                timed_out = r == ETIMEDOUT;
        }
        svc->workers--;
        pthread_cond_broadcast(&svc->idle);
        pthread_mutex_unlock(&svc->lock);
        return NULL;
}

static int thread_start(void *(*fn)(void *), void *arg) {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 256 * 1024);
        pthread_t t;
        int r = pthread_create(&t, &attr, fn, arg);
        pthread_attr_destroy(&attr);
        return -r;
}

/* The audit log says why, the sandbox side hears it, and the proxy never
 * reads a byte of it. */
static void refuse(EgressService *svc, Conn *conn, unsigned unlogged) {
        SandboxEgress *se = conn->se;
        char reason[150]; /* leaves room in EgressRecord.reason for the count */
        if (conn->timed_out)
                snprintf(reason, sizeof(reason),
                         "waited %u ms for an egress worker (--egress-wait-timeout-ms): %s", svc->wait_ms,
                         conn->over_total ? "all egress workers are busy"
                                          : "this sandbox's share is busy (--egress-workers-per-sandbox)");
        else if (conn->over_total)
                snprintf(reason, sizeof(reason),
                         "too many connections: all %u egress workers are busy and %u connections wait",
                         svc->max_workers, WAIT_TOTAL);
        else
                snprintf(reason, sizeof(reason),
                         "too many connections from this sandbox: %u served (--egress-workers-per-sandbox) "
                         "and %u waiting",
                         svc->share, WAIT_PER_SANDBOX);
        EgressRecord rec = { .allowed = false };
        size_t n = strlen(reason);
        memcpy(rec.reason, reason, n + 1);
        if (unlogged)
                snprintf(rec.reason + n, sizeof(rec.reason) - n, " (%u more refused unanswered)", unlogged);
        snprintf(rec.end, sizeof(rec.end), "refused");
        if (conn->timed_out)
                rec.duration_ms = time_now_mono_ms() - conn->queued_ms;
        refuse_stream(svc, se, conn->s, 503, "Service Unavailable", &rec);
        chan_stream_finish(conn->s, NULL);
        chan_stream_free(conn->s);
        log_warn(NULL, "egress %s refused: %s", se->id, rec.reason);
}

/* Under svc->lock: waiting connections past their time move from the queue
 * to the refusals. The queue is in the order connections came, so the
 * oldest is first. Returns the time (monotonic ms) the next one expires,
 * or 0 when none waits. */
static uint64_t queue_expire_locked(EgressService *svc) {
        uint64_t now = time_now_mono_ms();
        while (svc->queue && now - svc->queue->queued_ms >= svc->wait_ms) {
                Conn *c = svc->queue;
                svc->queue = c->next;
                if (!svc->queue)
                        svc->queue_tail = NULL;
                c->next = NULL;
                svc->n_waiting--;
                c->se->waiting--;
                c->timed_out = true;
                c->over_total = c->se->serving < svc->share;
                if (svc->refusals_tail)
                        svc->refusals_tail->next = c;
                else
                        svc->refusals = c;
                svc->refusals_tail = c;
                svc->n_refusals++;
        }
        return svc->queue ? svc->queue->queued_ms + svc->wait_ms : 0;
}

static void *refuser_main(void *arg) {
        EgressService *svc = arg;
        pthread_mutex_lock(&svc->lock);
        uint64_t idle_since = time_now_mono_ms();
        for (;;) {
                uint64_t next = queue_expire_locked(svc);
                Conn *conn = svc->refusals;
                if (conn) {
                        svc->refusals = conn->next;
                        if (!svc->refusals)
                                svc->refusals_tail = NULL;
                        svc->n_refusals--;
                        unsigned unlogged = conn->se->unlogged;
                        conn->se->unlogged = 0;
                        pthread_mutex_unlock(&svc->lock);
                        refuse(svc, conn, unlogged);
                        egress_sandbox_unref(conn->se);
                        free(conn);
                        pthread_mutex_lock(&svc->lock);
                        conn_done_locked(svc);
                        idle_since = time_now_mono_ms();
                        continue;
                }
                if (svc->stopping)
                        break;
                /* It also times out the waiting room: it stays while anything
                 * waits, and ends after a while with nothing to do. */
                uint64_t now = time_now_mono_ms();
                if (!next && now - idle_since >= POOL_IDLE_MS)
                        break;
                uint64_t until = next ? next : idle_since + POOL_IDLE_MS;
                struct timespec dl;
                deadline_in(&dl, until > now ? (long)(until - now) : 0);
                (void)pthread_cond_timedwait(&svc->refusal, &svc->lock, &dl);
        }
        svc->refuser = false;
        pthread_cond_broadcast(&svc->idle);
        pthread_mutex_unlock(&svc->lock);
        return NULL;
}

/* Under svc->lock: the refuser runs (it answers refusals and times out the
 * waiting room). false when no thread could be started. */
static bool refuser_ensure(EgressService *svc) {
        if (svc->refuser)
                return true;
        if (thread_start(refuser_main, svc) < 0)
                return false;
        svc->refuser = true;
        return true;
}

/* Under svc->lock. Returns false when the connection cannot even be refused
 * with an answer (it is then the caller's to close). */
static bool refusal_push(EgressService *svc, Conn *conn) {
        if (svc->n_refusals >= REFUSALS_MAX || !refuser_ensure(svc))
                return false;
        if (svc->refusals_tail)
                svc->refusals_tail->next = conn;
        else
                svc->refusals = conn;
        svc->refusals_tail = conn;
        svc->n_refusals++;
        pthread_cond_signal(&svc->refusal);
        return true;
}

/* Runs on the channel's reader thread: it queues and never blocks. */
void egress_sandbox_accept(void *userdata, ChanStream *s, json_t *request) {
        SandboxEgress *se = userdata;
        EgressService *svc = se->svc;
        const char *op = json_string_value(json_object_get(request, "op"));
        Conn *conn = op && strcmp(op, "connect") == 0 ? calloc(1, sizeof(*conn)) : NULL;
        json_decref(request);
        if (!conn) {
                chan_stream_free(s);
                return;
        }
        conn->se = se;
        conn->s = s;
        atomic_fetch_add(&se->refs, 1);
        pthread_mutex_lock(&svc->lock);
        svc->active++;
        if (svc->stopping || se->waiting >= WAIT_PER_SANDBOX || svc->n_waiting >= WAIT_TOTAL) {
                conn->over_total = se->waiting < WAIT_PER_SANDBOX;
                if (!refusal_push(svc, conn)) {
                        se->unlogged++;
                        conn_done_locked(svc);
                        pthread_mutex_unlock(&svc->lock);
                        chan_stream_free(s);
                        egress_sandbox_unref(se);
                        free(conn);
                }
                else
                        pthread_mutex_unlock(&svc->lock);
                return;
        }
        conn->queued_ms = time_now_mono_ms();
        if (svc->queue_tail)
                svc->queue_tail->next = conn;
        else {
                svc->queue = conn;
                pthread_cond_signal(&svc->refusal); /* the next to time out, now */
        }
        svc->queue_tail = conn;
        svc->n_waiting++;
        se->waiting++;
        /* Whoever waits is timed out by the refuser; should it not start,
         * the connection waits as long as its client does. */
        (void)refuser_ensure(svc);
        if (se->serving < svc->share) {
                /* Wake an idle worker not already woken, else add one. */
                if (svc->idle_workers > svc->wakeups) {
                        svc->wakeups++;
                        pthread_cond_signal(&svc->work);
                } else if (svc->workers < svc->max_workers && thread_start(worker_main, svc) == 0)
                        svc->workers++;
                /* Else a worker takes it when it ends its connection. */
        }
        pthread_mutex_unlock(&svc->lock);
}
