/* The egress service: the proxy process it starts and restarts, its
 * settings, and what a sandbox needs to use it (proxy variables, the CA in
 * its trust store, the placeholders of its owner's secrets). The secrets are
 * egress_secrets.c's; each sandbox's connections and their audit log are
 * egress_relay.c's. */
#include "daemon/egress/egress_service.h"
#include "daemon/egress/egress_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <pthread.h>
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

#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/agent_client.h"
#include "common/log.h"
#include "egress/cabundle.h"
#include "egress/cidr.h"
#include "egress/proxy.h"
#include "egress/wire.h"

#define RELAY_URL "http://127.0.0.1:3128"
#define SANDBOX_CA_BUNDLE "/etc/ssl/certs/ca-certificates.crt"
#define SANDBOX_CA_FILE "/usr/local/share/ca-certificates/runtime-egress.crt"
#define MAX_BUNDLE (4u * 1024u * 1024u)

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

int egress_service_proxy_send(EgressService *svc, int data, int meta) {
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
        atomic_init(&svc->audit_inserts, 0);
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
        const StoreBackend *backend = cfg->store ? cfg->store : store_backend_for(cfg->db_path);
        if (!backend->egress) {
                r = -EOPNOTSUPP;
                snprintf(err, err_len, "the %s store keeps no egress records", backend->name);
                goto fail;
        }
        if ((r = backend->egress->open(cfg->db_path, &svc->records)) < 0) {
                snprintf(err, err_len, "%s",
                         r == -EPROTONOSUPPORT ? "the database's egress tables were written by a newer runtimed"
                                               : "cannot open the egress tables in the database");
                goto fail;
        }
        svc->store = backend->egress;
        if (cfg->seal_key) {
                memcpy(svc->seal_key, cfg->seal_key, sizeof(svc->seal_key));
                svc->sealed = true;
        }
        /* An entry still open was cut short by the daemon's own end. */
        (void)svc->store->audit_end_open(svc->records, "the daemon stopped during the connection");
        *ret = svc;
        return 0;
fail:
        egress_service_free(svc);
        return r;
}

void egress_service_set_events(EgressService *svc, struct Events *ev) {
        svc->events = ev;
}

void egress_service_set_audit(EgressService *svc, struct Audit *a) {
        svc->audit = a;
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
        if (svc->store)
                svc->store->close(svc->records);
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
        StoreEgressSecret *list = NULL;
        size_t n = 0;
        bool more = false;
        if (svc->store->secret_list(svc->records, owner, NULL, 0, false, &list, &n, &more) == 0)
                for (size_t i = 0; i < n; i++)
                        if (egress_secret_in_scope(scope, list[i].name))
                                json_object_set_new(env, list[i].name, json_string(list[i].placeholder));
        store_egress_secrets_free(list, n);
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
