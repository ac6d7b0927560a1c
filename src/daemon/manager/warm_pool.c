#include "daemon/manager/warm_pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"
#include "daemon/manager/images.h"
#include "daemon/manager/supervise.h"

#include "daemon/manager/manager-internal.h"

/* A refill starts only once no client's create has been in progress for
 * this long: a client's create never waits behind the pool's. */
#define WARM_POOL_QUIET_MS 50
/* After a start that failed, the class waits this long before the next. */
#define WARM_POOL_RETRY_MS 5000
/* Where each pool sandbox's marker lives (<state-dir>/warm-pool/<id>:
 * "DRIVER IMAGE"), from before its start until it is handed out or gone,
 * so that what a daemon killed in between left behind is found at the next
 * start: pool sandboxes have no row in the store. */
#define WARM_POOL_DIR "warm-pool"

/* The image's root filesystem as a pool sandbox was started on it: a
 * rebuild replaces it, and a sandbox of the old one is handed to no one. */
typedef struct ImageMark {
        dev_t dev;
        ino_t ino;
        struct timespec mtime;
} ImageMark;

struct PoolEntry {
        Sandbox *sb; /* started, its agent's hello in; on no list of the manager's */
        unsigned cls;
        char nonce[SUPERVISE_NONCE_LEN + 1]; /* its supervisor's; "" without one */
        ImageMark image;
        PoolEntry *next;
};

typedef struct PoolClass {
        WarmPoolSpec spec;
        SandboxSpec sandbox; /* what its sandboxes are started from (no owner's settings) */
        const Driver *driver;
        PoolEntry *ready;
        unsigned n_ready;
        uint64_t hits, misses, failed;
        int64_t retry_at_ms; /* monotonic; 0: now */
} PoolClass;

struct WarmPool {
        pthread_mutex_t lock;
        pthread_cond_t cond; /* quit, a hand-out, a create's end, a discard */
        PoolClass classes[WARM_POOL_MAX_CLASSES];
        unsigned n;
        PoolEntry *discard; /* for the thread to stop and remove */
        unsigned creating;  /* clients' creates in progress */
        int64_t last_create_ms;
        bool quit;
        bool started;
        pthread_t thread;
};

/* ---- the option ---- */

static int parse_fail(char *why, size_t why_len, const char *what, const char *text) {
        snprintf(why, why_len, "%s in '%.80s' (DRIVER:IMAGE[:VCPUxMEMORY_MIBxDISK_MIB]=N, e.g. namespace:default=2)",
                 what, text);
        return -EINVAL;
}

static bool parse_unsigned(const char *s, size_t len, unsigned long long lo, unsigned long long hi, unsigned *ret) {
        unsigned long long v = 0;
        if (len == 0 || len > 9)
                return false;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return false;
                v = v * 10 + (unsigned)(s[i] - '0');
        }
        if (v < lo || v > hi)
                return false;
        *ret = (unsigned)v;
        return true;
}

int warm_pool_spec_parse(const char *text, WarmPoolSpec *ret, char *why, size_t why_len) {
        WarmPoolSpec s = { .vcpu = 1, .memory_mib = 1024, .disk_mib = 2048 };
        const char *eq = strrchr(text, '=');
        if (!eq)
                return parse_fail(why, why_len, "no =N", text);
        if (!parse_unsigned(eq + 1, strlen(eq + 1), 1, WARM_POOL_MAX_SIZE, &s.size)) {
                char what[64];
                snprintf(what, sizeof what, "a size that is not 1..%u", WARM_POOL_MAX_SIZE);
                return parse_fail(why, why_len, what, text);
        }
        const char *p = text;
        size_t n = strcspn(p, ":=");
        char name[65];
        if (n == 0 || n >= sizeof name || p[n] != ':')
                return parse_fail(why, why_len, "no driver", text);
        memcpy(name, p, n);
        name[n] = '\0';
        if (sandbox_driver_from_name(name, &s.driver) < 0)
                return parse_fail(why, why_len, "a driver that is not namespace, gvisor or microvm", text);
        p += n + 1;
        n = strcspn(p, ":=");
        if (n == 0 || n >= sizeof s.image)
                return parse_fail(why, why_len, "no image", text);
        memcpy(s.image, p, n);
        s.image[n] = '\0';
        if (!image_name_ok(s.image))
                return parse_fail(why, why_len, "an image name that is not one", text);
        p += n;
        if (*p == ':') {
                p++;
                const char *x1 = memchr(p, 'x', (size_t)(eq - p));
                const char *x2 = x1 ? memchr(x1 + 1, 'x', (size_t)(eq - x1 - 1)) : NULL;
                if (!x1 || !x2 || !parse_unsigned(p, (size_t)(x1 - p), 1, 1024, &s.vcpu) ||
                    !parse_unsigned(x1 + 1, (size_t)(x2 - x1 - 1), 64, 16u * 1024 * 1024, &s.memory_mib) ||
                    !parse_unsigned(x2 + 1, (size_t)(eq - x2 - 1), 64, 64u * 1024 * 1024, &s.disk_mib))
                        return parse_fail(why, why_len, "a shape that is not VCPUxMEMORY_MIBxDISK_MIB", text);
        } else if (p != eq)
                return parse_fail(why, why_len, "no =N", text);
        *ret = s;
        return 0;
}

void warm_pool_spec_shape(const WarmPoolSpec *s, char *buf, size_t n) {
        snprintf(buf, n, "%ux%ux%u", s->vcpu, s->memory_mib, s->disk_mib);
}

/* ---- markers ---- */

static int marker_path(Manager *m, const char *id, char **ret) {
        if (asprintf(ret, "%s/" WARM_POOL_DIR "/%s", m->cfg->state_dir, id) < 0) {
                *ret = NULL;
                return -ENOMEM;
        }
        return 0;
}

static int marker_write(Manager *m, const char *id, const PoolClass *k) {
        _cleanup_free_ char *dir = NULL, *path = NULL;
        if (asprintf(&dir, "%s/" WARM_POOL_DIR, m->cfg->state_dir) < 0) {
                dir = NULL;
                return -ENOMEM;
        }
        (void)mkdir(dir, 0700);
        if (marker_path(m, id, &path) < 0)
                return -ENOMEM;
        _cleanup_close_ int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
        if (fd < 0)
                return -errno;
        char line[160];
        int len = snprintf(line, sizeof line, "%s %s\n", k->driver->name, k->spec.image);
        if (write(fd, line, (size_t)len) != len)
                return -EIO;
        return 0;
}

void warm_pool_marker_remove(Manager *m, const char *id) {
        _cleanup_free_ char *path = NULL;
        if (marker_path(m, id, &path) == 0 && unlink(path) < 0 && errno != ENOENT)
                log_warn(NULL, "warm pool: removing the marker of %s: %s", id, strerror(errno));
}

/* Kills what is left of a pool sandbox a daemon left behind and removes its
 * files, from its marker alone. One with a row was handed out: its row's
 * recovery has it. */
static void sweep_one(Manager *m, const char *id) {
        _cleanup_free_ char *path = NULL;
        if (marker_path(m, id, &path) < 0)
                return;
        char line[160] = "", driver[40], image[IMAGE_MAX_NAME + 1];
        {
                _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
                ssize_t n = fd >= 0 ? read(fd, line, sizeof line - 1) : -1;
                line[n > 0 ? n : 0] = '\0';
        }
        SandboxRow row;
        if (db_sandbox_get(m->db, id, &row) == 0) {
                sandbox_row_done(&row);
        } else if (sscanf(line, "%39s %64s", driver, image) == 2 && image_name_ok(image) && driver_by_name(driver)) {
                const Driver *d = driver_by_name(driver);
                SandboxSpec spec;
                sandbox_spec_init(&spec);
                spec.image = image;
                SpecPaths p = { 0 };
                if (spec_paths(m, id, image, &p) == 0) {
                        DriverSpec ds;
                        driver_spec_from(m, id, &spec, &p, &ds);
                        int r = d->reap_orphan(&ds);
                        if (r == 0)
                                r = d->destroy(&ds);
                        if (r < 0)
                                log_error(NULL, "warm pool: removing sandbox %s left by the last run: %s", id,
                                          strerror(-r));
                        else
                                log_info(NULL, "warm pool: sandbox %s left by the last run removed", id);
                }
                spec_paths_done(&p);
        } else
                log_error(NULL, "warm pool: the marker of %s names no driver and image; its files stay", id);
        if (unlink(path) < 0 && errno != ENOENT)
                log_warn(NULL, "warm pool: removing the marker of %s: %s", id, strerror(errno));
}

void warm_pool_recover(Manager *m) {
        _cleanup_free_ char *dir = NULL;
        if (asprintf(&dir, "%s/" WARM_POOL_DIR, m->cfg->state_dir) < 0)
                return;
        DIR *dp = opendir(dir);
        if (!dp)
                return;
        struct dirent *de;
        while ((de = readdir(dp)))
                if (strncmp(de->d_name, "sbx_", 4) == 0 && strlen(de->d_name) < 32)
                        sweep_one(m, de->d_name);
        closedir(dp);
}

/* ---- the pool's sandboxes ---- */

static int image_mark(Manager *m, const char *image, ImageMark *ret) {
        _cleanup_free_ char *rootfs = NULL;
        if (asprintf(&rootfs, "%s/%s/rootfs", m->cfg->image_dir, image) < 0) {
                rootfs = NULL;
                return -ENOMEM;
        }
        struct stat st;
        if (stat(rootfs, &st) < 0)
                return -errno;
        *ret = (ImageMark){ .dev = st.st_dev, .ino = st.st_ino, .mtime = st.st_mtim };
        return 0;
}

static bool image_current(Manager *m, const PoolClass *k, const ImageMark *was) {
        ImageMark now;
        return image_mark(m, k->spec.image, &now) == 0 && now.dev == was->dev && now.ino == was->ino &&
               now.mtime.tv_sec == was->mtime.tv_sec && now.mtime.tv_nsec == was->mtime.tv_nsec;
}

static bool entry_alive(Sandbox *sb) {
        pthread_mutex_lock(&sb->lock);
        bool ok = sb->inst && (!sb->driver->alive || sb->driver->alive(sb->inst));
        pthread_mutex_unlock(&sb->lock);
        return ok && channel_is_open(sb->channel);
}

/* Stops a pool sandbox that was never handed out and removes everything
 * of it: its processes, supervisor, cgroup, files and marker. */
static void entry_destroy(Manager *m, const PoolClass *k, PoolEntry *en) {
        Sandbox *sb = en->sb;
        live_stop(sb);
        DriverSpec ds;
        driver_spec_from(m, sb->id, &k->sandbox, &sb->paths, &ds);
        int r = k->driver->destroy(&ds);
        if (r < 0)
                log_error(NULL, "warm pool: removing sandbox %s left files behind: %s", sb->id, strerror(-r));
        warm_pool_marker_remove(m, sb->id);
        sandbox_unref(sb);
        free(en);
}

/* Starts one sandbox of class c, as a boot does, for no one: no row, no
 * egress policy, no charge. NULL when it could not start (nothing of it is
 * left then). */
static PoolEntry *entry_start(Manager *m, unsigned c) {
        PoolClass *k = &m->pool->classes[c];
        const Driver *d = k->driver;
        PoolEntry *en = calloc(1, sizeof(*en));
        char hex[21];
        if (!en || random_hex(hex, 10) < 0) {
                free(en);
                return NULL;
        }
        en->cls = c;
        SandboxRow row = { 0 };
        snprintf(row.id, sizeof row.id, "sbx_%s", hex);
        row.owner = (char *)"";
        row.spec = k->sandbox;
        bool supervised = m->cfg->supervisor_path && d->handles && d->adopt;
        row.spec.supervisor_nonce[0] = '\0';
        if (supervised && supervise_nonce(row.spec.supervisor_nonce) < 0) {
                free(en);
                return NULL;
        }
        snprintf(en->nonce, sizeof en->nonce, "%s", row.spec.supervisor_nonce);
        int r = image_mark(m, k->spec.image, &en->image);
        if (r == 0)
                r = marker_write(m, row.id, k);
        if (r < 0) {
                log_error(NULL, "warm pool: starting a %s sandbox of %s: %s", d->name, k->spec.image, strerror(-r));
                free(en);
                return NULL;
        }
        Sandbox *sb = sandbox_alloc(m, &row, d);
        if (!sb) {
                warm_pool_marker_remove(m, row.id);
                free(en);
                return NULL;
        }
        en->sb = sb;
        DriverError err = { .reason = "" };
        const char *fail = NULL;
        uint64_t t0 = time_now_mono_ms();
        if (sandbox_launch(m, sb, &row, d, supervised, NULL, &err, &fail) < 0) {
                log_warn(NULL, "warm pool: a %s sandbox of %s did not start: %s", d->name, k->spec.image,
                         fail ? fail : "unknown");
                entry_destroy(m, k, en);
                return NULL;
        }
        /* Its kernel, started before it counts as ready, runs as the
         * image's default user with no one's env: the hand-out gives it the
         * owner's (docs/warm-pool.md). */
        bool kernel = false;
        if (m->warm_fn && !m->cfg->no_warm_pool_kernel && !m->cfg->no_interpreter_prestart)
                kernel = m->warm_fn(m->warm_userdata, sb, k->spec.driver, k->spec.memory_mib) == 0;
        atomic_store(&sb->pool_kernel, kernel);
        log_info(NULL, "warm pool: sandbox %s ready (driver %s, image %s%s, %llu ms)", sb->id, d->name,
                 k->spec.image, kernel ? ", kernel started" : "", (unsigned long long)(time_now_mono_ms() - t0));
        return en;
}

/* Whether the host has room for one more sandbox of class k beside the
 * live ones and the pool's: the daemon's bound on sandboxes, and the
 * memory it could use free now. */
static bool host_has_room(Manager *m, const PoolClass *k, unsigned pooled) {
        unsigned live = 0;
        pthread_mutex_lock(&m->lock);
        for (Sandbox *sb = m->live; sb; sb = sb->next)
                live++;
        pthread_mutex_unlock(&m->lock);
        if (live + pooled + 1 > m->cfg->max_sandboxes)
                return false;
        FILE *f = fopen("/proc/meminfo", "re");
        if (!f)
                return true;
        char line[128];
        unsigned long long kib = 0;
        bool found = false;
        while (!found && fgets(line, sizeof line, f))
                found = sscanf(line, "MemAvailable: %llu kB", &kib) == 1;
        fclose(f);
        return !found || kib / 1024 >= k->spec.memory_mib;
}

/* The class furthest below its size that may start one now (-1: none), and
 * how long until one may (*wait_ms). Under p->lock. */
static int class_to_fill(WarmPool *p, int64_t now, int64_t *wait_ms) {
        int best = -1;
        unsigned best_missing = 0;
        for (unsigned i = 0; i < p->n; i++) {
                PoolClass *k = &p->classes[i];
                unsigned missing = k->spec.size > k->n_ready ? k->spec.size - k->n_ready : 0;
                if (!missing)
                        continue;
                if (k->retry_at_ms > now) {
                        if (k->retry_at_ms - now < *wait_ms)
                                *wait_ms = k->retry_at_ms - now;
                        continue;
                }
                if (missing > best_missing) {
                        best = (int)i;
                        best_missing = missing;
                }
        }
        return best;
}

/* Ready sandboxes that died, or whose image was rebuilt since they
 * started, go to the discard list. Under p->lock. */
static void check_ready(Manager *m, WarmPool *p) {
        for (unsigned i = 0; i < p->n; i++) {
                PoolClass *k = &p->classes[i];
                for (PoolEntry **q = &k->ready; *q;) {
                        PoolEntry *en = *q;
                        if (entry_alive(en->sb) && image_current(m, k, &en->image)) {
                                q = &en->next;
                                continue;
                        }
                        log_info(NULL, "warm pool: sandbox %s is dropped (%s)", en->sb->id,
                                 entry_alive(en->sb) ? "its image was rebuilt" : "it died");
                        *q = en->next;
                        k->n_ready--;
                        en->next = p->discard;
                        p->discard = en;
                }
        }
}

static unsigned pooled_count(WarmPool *p) {
        unsigned n = 0;
        for (unsigned i = 0; i < p->n; i++)
                n += p->classes[i].n_ready;
        return n;
}

static void *pool_thread(void *userdata) {
        Manager *m = userdata;
        WarmPool *p = m->pool;
        int64_t checked_ms = 0;
        pthread_mutex_lock(&p->lock);
        while (!p->quit) {
                PoolEntry *discard = TAKE_PTR(p->discard);
                if (discard) {
                        pthread_mutex_unlock(&p->lock);
                        while (discard) {
                                PoolEntry *next = discard->next;
                                entry_destroy(m, &p->classes[discard->cls], discard);
                                discard = next;
                        }
                        pthread_mutex_lock(&p->lock);
                        continue;
                }
                int64_t now = (int64_t)time_now_mono_ms();
                if (now - checked_ms >= 1000) {
                        checked_ms = now;
                        check_ready(m, p);
                        if (p->discard)
                                continue;
                }
                int64_t wait_ms = 1000;
                int c = -1;
                if (p->creating == 0 && now - p->last_create_ms >= WARM_POOL_QUIET_MS)
                        c = class_to_fill(p, now, &wait_ms);
                else if (p->creating == 0)
                        wait_ms = WARM_POOL_QUIET_MS - (now - p->last_create_ms);
                if (c >= 0 && !host_has_room(m, &p->classes[c], pooled_count(p))) {
                        p->classes[c].retry_at_ms = now + 1000;
                        c = -1;
                }
                if (c >= 0) {
                        pthread_mutex_unlock(&p->lock);
                        PoolEntry *en = entry_start(m, (unsigned)c);
                        pthread_mutex_lock(&p->lock);
                        PoolClass *k = &p->classes[c];
                        if (en) {
                                en->next = k->ready;
                                k->ready = en;
                                k->n_ready++;
                                k->retry_at_ms = 0;
                        } else {
                                k->failed++;
                                k->retry_at_ms = (int64_t)time_now_mono_ms() + WARM_POOL_RETRY_MS;
                        }
                        continue;
                }
                struct timespec ts;
                clock_gettime(CLOCK_MONOTONIC, &ts);
                ts.tv_sec += wait_ms / 1000;
                ts.tv_nsec += (wait_ms % 1000) * 1000000L;
                if (ts.tv_nsec >= 1000000000L) {
                        ts.tv_sec++;
                        ts.tv_nsec -= 1000000000L;
                }
                pthread_cond_timedwait(&p->cond, &p->lock, &ts);
        }
        pthread_mutex_unlock(&p->lock);
        return NULL;
}

/* ---- the manager's side ---- */

int manager_start_warm_pool(Manager *m, char *why, size_t why_len) {
        const DaemonConfig *cfg = m->cfg;
        if (cfg->n_warm_pools == 0)
                return 0;
        if (cfg->n_warm_pools > WARM_POOL_MAX_CLASSES) {
                snprintf(why, why_len, "--warm-pool is given more than %u times", WARM_POOL_MAX_CLASSES);
                return -EINVAL;
        }
        WarmPool *p = calloc(1, sizeof(*p));
        if (!p)
                return -ENOMEM;
        pthread_mutex_init(&p->lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&p->cond, &ca);
        pthread_condattr_destroy(&ca);
        m->pool = p;
        int r = 0;
        for (unsigned i = 0; i < cfg->n_warm_pools && r == 0; i++) {
                PoolClass *k = &p->classes[p->n];
                char err[200];
                if ((r = warm_pool_spec_parse(cfg->warm_pools[i], &k->spec, err, sizeof err)) < 0) {
                        snprintf(why, why_len, "--warm-pool wants %s", err);
                        break;
                }
                const char *name = sandbox_driver_name(k->spec.driver);
                const DriverOffer *o = config_driver_offer(cfg, name);
                char shape[64];
                warm_pool_spec_shape(&k->spec, shape, sizeof shape);
                if (!o || !o->available || !o->offered) {
                        snprintf(why, why_len, "--warm-pool %s: driver %s is not offered by this daemon%s%s",
                                 cfg->warm_pools[i], name, o && !o->available ? ": " : "",
                                 o && !o->available ? o->reason : "");
                        r = -EINVAL;
                        break;
                }
                if (k->spec.vcpu > cfg->max_vcpu || k->spec.memory_mib > cfg->max_memory_mib ||
                    k->spec.disk_mib > cfg->max_disk_mib) {
                        snprintf(why, why_len, "--warm-pool %s: shape %s is above --max-vcpu, --max-memory-mib or "
                                 "--max-disk-mib, so no create could ask for it", cfg->warm_pools[i], shape);
                        r = -EINVAL;
                        break;
                }
                for (unsigned j = 0; j < p->n; j++)
                        if (p->classes[j].spec.driver == k->spec.driver &&
                            strcmp(p->classes[j].spec.image, k->spec.image) == 0 &&
                            p->classes[j].spec.vcpu == k->spec.vcpu &&
                            p->classes[j].spec.memory_mib == k->spec.memory_mib &&
                            p->classes[j].spec.disk_mib == k->spec.disk_mib) {
                                snprintf(why, why_len, "--warm-pool names %s %s %s twice", name, k->spec.image,
                                         shape);
                                r = -EINVAL;
                        }
                if (r < 0)
                        break;
                k->driver = o->driver;
                sandbox_spec_init(&k->sandbox);
                k->sandbox.driver = k->spec.driver;
                k->sandbox.vcpu = k->spec.vcpu;
                k->sandbox.memory_mib = k->spec.memory_mib;
                k->sandbox.disk_mib = k->spec.disk_mib;
                if (!(k->sandbox.image = strdup(k->spec.image))) {
                        r = -ENOMEM;
                        break;
                }
                p->n++;
                log_info(NULL, "warm pool: %u %s sandbox%s of image %s, shape %s, kept ready", k->spec.size, name,
                         k->spec.size == 1 ? "" : "es", k->spec.image, shape);
        }
        if (r == 0) {
                r = -pthread_create(&p->thread, NULL, pool_thread, m);
                p->started = r == 0;
                if (r < 0)
                        snprintf(why, why_len, "cannot start the warm pool's thread: %s", strerror(-r));
        }
        return r;
}

void warm_pool_shutdown(Manager *m) {
        WarmPool *p = m->pool;
        if (!p)
                return;
        pthread_mutex_lock(&p->lock);
        p->quit = true;
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
        if (p->started) {
                pthread_join(p->thread, NULL);
                p->started = false;
        }
        unsigned n = 0;
        for (unsigned i = 0; i < p->n; i++) {
                PoolClass *k = &p->classes[i];
                while (k->ready) {
                        PoolEntry *en = k->ready;
                        k->ready = en->next;
                        entry_destroy(m, k, en);
                        n++;
                }
                k->n_ready = 0;
        }
        while (p->discard) {
                PoolEntry *en = p->discard;
                p->discard = en->next;
                entry_destroy(m, &p->classes[en->cls], en);
                n++;
        }
        if (n)
                log_info(NULL, "warm pool: %u sandbox%s removed for shutdown", n, n == 1 ? "" : "es");
}

void warm_pool_free(WarmPool *p) {
        if (!p)
                return;
        for (unsigned i = 0; i < p->n; i++)
                sandbox_spec_done(&p->classes[i].sandbox);
        pthread_mutex_destroy(&p->lock);
        pthread_cond_destroy(&p->cond);
        free(p);
}

void warm_pool_create_begin(Manager *m) {
        WarmPool *p = m->pool;
        if (!p)
                return;
        pthread_mutex_lock(&p->lock);
        p->creating++;
        pthread_mutex_unlock(&p->lock);
}

void warm_pool_create_end(Manager *m) {
        WarmPool *p = m->pool;
        if (!p)
                return;
        pthread_mutex_lock(&p->lock);
        if (p->creating)
                p->creating--;
        p->last_create_ms = (int64_t)time_now_mono_ms();
        pthread_cond_broadcast(&p->cond);
        pthread_mutex_unlock(&p->lock);
}

PoolEntry *warm_pool_take(Manager *m, const Driver *d, const SandboxSpec *spec, bool kernel_ok) {
        WarmPool *p = m->pool;
        if (!p)
                return NULL;
        PoolEntry *en = NULL;
        pthread_mutex_lock(&p->lock);
        for (unsigned i = 0; i < p->n && !en; i++) {
                PoolClass *k = &p->classes[i];
                if (k->driver != d || strcmp(k->spec.image, spec->image) != 0 || k->spec.vcpu != spec->vcpu ||
                    k->spec.memory_mib != spec->memory_mib || k->spec.disk_mib != spec->disk_mib)
                        continue;
                /* A sandbox that died, or whose image was rebuilt, since
                 * the last check is handed to no one. */
                for (PoolEntry **q = &k->ready; *q && !en;) {
                        PoolEntry *x = *q;
                        if (!kernel_ok && atomic_load(&x->sb->pool_kernel)) {
                                q = &x->next;
                                continue;
                        }
                        *q = x->next;
                        k->n_ready--;
                        x->next = NULL;
                        if (entry_alive(x->sb) && image_current(m, k, &x->image))
                                en = x;
                        else {
                                x->next = p->discard;
                                p->discard = x;
                        }
                }
                if (en)
                        k->hits++;
                else
                        k->misses++;
                pthread_cond_broadcast(&p->cond);
        }
        pthread_mutex_unlock(&p->lock);
        return en;
}

void warm_pool_put_back(Manager *m, PoolEntry *en) {
        WarmPool *p = m->pool;
        if (!en)
                return;
        pthread_mutex_lock(&p->lock);
        PoolClass *k = &p->classes[en->cls];
        k->hits--;
        en->next = k->ready;
        k->ready = en;
        k->n_ready++;
        pthread_mutex_unlock(&p->lock);
}

const char *warm_pool_entry_id(const PoolEntry *en) {
        return en->sb->id;
}

int warm_pool_hand_out_locked(Manager *m, SandboxRow *row, PoolEntry *en, int64_t lease_seconds, const char *rid,
                              SandboxError *e) {
        Sandbox *sb = en->sb;
        const char *fail = NULL;
        int fail_status = 503;
        snprintf(row->spec.supervisor_nonce, sizeof row->spec.supervisor_nonce, "%s", en->nonce);
        free(en);
        /* The row stands for it from here on: a daemon killed now finds
         * the row, whose recovery stops it. */
        warm_pool_marker_remove(m, row->id);
        /* Everything of the create's that a boot gives its sandbox, given
         * now: the drivers started it from its id, image and shape alone. */
        if (sandbox_take_row(sb, row) < 0)
                return sandbox_boot_failed(m, row, sb, "out of memory", fail_status, rid, e);
        if (m->egress) {
                if (egress_sandbox_new(m->egress, sb->id, row->owner, row->spec.network, row->spec.secrets,
                                       row->spec.trial, &sb->egress) < 0)
                        return sandbox_boot_failed(m, row, sb, "out of memory", fail_status, rid, e);
                channel_set_acceptor(sb->channel, egress_sandbox_accept, sb->egress);
        }
        if (!entry_alive(sb))
                return sandbox_boot_failed(m, row, sb, "the sandbox's agent exited while starting", fail_status, rid,
                                           e);
        if (sandbox_go_live(m, row, sb, lease_seconds, rid, &fail, &fail_status) < 0)
                return sandbox_boot_failed(m, row, sb, fail, fail_status, rid, e);
        log_info(rid, "sandbox %s running (driver %s, from the warm pool)", row->id, sb->driver->name);
        sandbox_unref(sb);
        return 0;
}

void manager_render_warm_pool(Manager *m, FILE *f) {
        WarmPool *p = m->pool;
        if (!p)
                return;
        fprintf(f, "# HELP runtime_warm_pool_ready Sandboxes of the warm pool started and ready to hand out.\n"
                   "# TYPE runtime_warm_pool_ready gauge\n");
        pthread_mutex_lock(&p->lock);
        char labels[WARM_POOL_MAX_CLASSES][160];
        uint64_t ready[WARM_POOL_MAX_CLASSES], size[WARM_POOL_MAX_CLASSES], hits[WARM_POOL_MAX_CLASSES],
                misses[WARM_POOL_MAX_CLASSES], failed[WARM_POOL_MAX_CLASSES];
        unsigned n = p->n;
        for (unsigned i = 0; i < n; i++) {
                PoolClass *k = &p->classes[i];
                char shape[64];
                warm_pool_spec_shape(&k->spec, shape, sizeof shape);
                snprintf(labels[i], sizeof labels[i], "driver=\"%s\",image=\"%s\",shape=\"%s\"", k->driver->name,
                         k->spec.image, shape);
                ready[i] = k->n_ready;
                size[i] = k->spec.size;
                hits[i] = k->hits;
                misses[i] = k->misses;
                failed[i] = k->failed;
        }
        pthread_mutex_unlock(&p->lock);
        for (unsigned i = 0; i < n; i++)
                fprintf(f, "runtime_warm_pool_ready{%s} %llu\n", labels[i], (unsigned long long)ready[i]);
        fprintf(f, "# HELP runtime_warm_pool_size Sandboxes the warm pool keeps ready (--warm-pool).\n"
                   "# TYPE runtime_warm_pool_size gauge\n");
        for (unsigned i = 0; i < n; i++)
                fprintf(f, "runtime_warm_pool_size{%s} %llu\n", labels[i], (unsigned long long)size[i]);
        fprintf(f, "# HELP runtime_warm_pool_hits_total Creates handed a sandbox of the warm pool.\n"
                   "# TYPE runtime_warm_pool_hits_total counter\n");
        for (unsigned i = 0; i < n; i++)
                fprintf(f, "runtime_warm_pool_hits_total{%s} %llu\n", labels[i], (unsigned long long)hits[i]);
        fprintf(f, "# HELP runtime_warm_pool_misses_total Creates of a pool's driver, image and shape that found "
                   "none ready and started cold.\n# TYPE runtime_warm_pool_misses_total counter\n");
        for (unsigned i = 0; i < n; i++)
                fprintf(f, "runtime_warm_pool_misses_total{%s} %llu\n", labels[i], (unsigned long long)misses[i]);
        fprintf(f, "# HELP runtime_warm_pool_start_failures_total Sandboxes the warm pool could not start.\n"
                   "# TYPE runtime_warm_pool_start_failures_total counter\n");
        for (unsigned i = 0; i < n; i++)
                fprintf(f, "runtime_warm_pool_start_failures_total{%s} %llu\n", labels[i],
                        (unsigned long long)failed[i]);
}
