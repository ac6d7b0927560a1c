/* This host among the hosts that share a store: see fleet.h. */
#include "daemon/manager/fleet.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "daemon/store/store.h"
#include "common/timeutil.h"
#include "daemon/manager/db.h"
#include "daemon/manager/audit.h"
#include "daemon/manager/file_links.h"
#include "daemon/manager/previews.h"
#include "daemon/manager/sessions.h"
#include "daemon/manager/volumes.h"
#include "daemon/manager/request_counts.h"
#include "daemon/manager/samples.h"
#include "daemon/manager/events.h"
#include "daemon/manager/snapshot.h"
#include "daemon/manager/uploads.h"
#include "daemon/manager/user_images.h"
#include "daemon/manager/webhooks.h"
#include "daemon/manager/keys.h"
#include "daemon/manager/ledger.h"
#include "daemon/manager/sandbox.h"

#define SWEEPER_LEASE "sweeper"
#define WATCHDOG_MS 200

typedef enum FenceCause {
        FENCE_NONE = 0,
        FENCE_CUT_OFF,  /* no beat got through in time */
        FENCE_DECLARED, /* the fleet declared this host dead */
        FENCE_TAKEN,    /* another runtimed registered this host's id: for good */
} FenceCause;

struct Fleet {
        FleetConfig c;
        HostRecord self; /* strings owned */
        int64_t beat_ms;
        pthread_mutex_t lock; /* epoch, cause, stop */
        pthread_cond_t wake;
        int64_t epoch;
        FenceCause cause;
        bool stop, running;
        pthread_t thread, watchdog;
        uint64_t last_beat_ms; /* monotonic: the last beat that got through */
        bool draining;         /* this host's state at the last look */
        bool sweeper;          /* holds the sweeper lease, as of the last beat */
        uint64_t lost_total;   /* sandboxes this host's sweeps marked lost */
        uint64_t declared_total; /* hosts this host's sweeps declared dead */
        uint64_t last_prune_ms;  /* monotonic: when the sweeper last dropped old events */
        HostRecord *view;      /* every host at the last look; strings owned */
        size_t n_view;
        UserImages *images;    /* may be NULL; set before the thread starts */
};

static void view_free(HostRecord *v, size_t n) {
        for (size_t i = 0; i < n; i++)
                store_host_record_clear(&v[i]);
        free(v);
}

static int record_copy(const HostRecord *in, HostRecord *out) {
        *out = *in;
        out->url = strdup(in->url ? in->url : "");
        out->drivers = strdup(in->drivers ? in->drivers : "");
        out->version = strdup(in->version ? in->version : "");
        if (!out->url || !out->drivers || !out->version) {
                store_host_record_clear(out);
                return -ENOMEM;
        }
        return 0;
}

int64_t fleet_beat_ms(int64_t dead_after_seconds) {
        int64_t ms = dead_after_seconds * 1000 / 6;
        return ms < 500 ? 500 : ms > 5000 ? 5000 : ms;
}

static void fleet_self_clear(Fleet *f) {
        free(f->self.url);
        free(f->self.drivers);
        free(f->self.version);
}

void fleet_free(Fleet *f) {
        if (!f)
                return;
        fleet_stop(f);
        fleet_self_clear(f);
        view_free(f->view, f->n_view);
        pthread_mutex_destroy(&f->lock);
        pthread_cond_destroy(&f->wake);
        free(f);
}

/* Writes from now on are this epoch's: the sandboxes' records, the
 * ledger's (whose charges are this host's), the snapshots', the uploads',
 * the events', the webhook deliveries', the audit's, the samples', the
 * request counts', the file links', the previews', the volumes' and the
 * images'. */
static int take_epoch(Fleet *f, int64_t epoch) {
        int r = db_set_writer(f->c.db, f->self.id, epoch);
        if (r == 0 && f->c.ledger)
                r = ledger_set_epoch(f->c.ledger, epoch);
        if (r == 0 && f->c.snapshots)
                r = snapshot_store_set_epoch(f->c.snapshots, f->self.id, epoch);
        if (r == 0 && f->c.uploads)
                r = uploads_set_epoch(f->c.uploads, f->self.id, epoch);
        if (r == 0 && f->c.events)
                r = events_set_epoch(f->c.events, f->self.id, epoch);
        if (r == 0 && f->c.webhooks)
                r = webhooks_set_epoch(f->c.webhooks, f->self.id, epoch);
        if (r == 0 && f->c.audit)
                r = audit_set_epoch(f->c.audit, f->self.id, epoch);
        if (r == 0 && f->c.samples)
                r = samples_set_epoch(f->c.samples, f->self.id, epoch);
        if (r == 0 && f->c.requests)
                r = request_counts_set_epoch(f->c.requests, f->self.id, epoch);
        if (r == 0 && f->c.links)
                r = file_links_set_epoch(f->c.links, f->self.id, epoch);
        if (r == 0 && f->c.previews)
                r = previews_set_epoch(f->c.previews, f->self.id, epoch);
        if (r == 0 && f->c.sessions)
                r = sessions_set_epoch(f->c.sessions, f->self.id, epoch);
        if (r == 0 && f->c.volumes)
                r = volumes_set_epoch(f->c.volumes, f->self.id, epoch);
        if (r == 0 && f->images)
                r = user_images_set_epoch(f->images, f->self.id, epoch);
        if (r < 0)
                return r;
        pthread_mutex_lock(&f->lock);
        f->epoch = epoch;
        pthread_mutex_unlock(&f->lock);
        return 0;
}

int fleet_join(const FleetConfig *c, Fleet **ret) {
        Fleet *f = calloc(1, sizeof(*f));
        if (!f)
                return -ENOMEM;
        f->c = *c;
        f->c.self = NULL;
        f->beat_ms = fleet_beat_ms(c->dead_after_seconds);
        pthread_mutex_init(&f->lock, NULL);
        int r = time_cond_init_mono(&f->wake);
        if (r < 0) {
                pthread_mutex_destroy(&f->lock);
                free(f);
                return r;
        }
        snprintf(f->self.id, sizeof(f->self.id), "%s", c->self->id);
        f->self.url = strdup(c->self->url ? c->self->url : "");
        f->self.drivers = strdup(c->self->drivers ? c->self->drivers : "");
        f->self.version = strdup(c->self->version ? c->self->version : "");
        f->self.vcpu = c->self->vcpu;
        f->self.memory_mib = c->self->memory_mib;
        if (!f->self.url || !f->self.drivers || !f->self.version) {
                fleet_free(f);
                return -ENOMEM;
        }
        int64_t epoch = 0;
        if ((r = c->ops->register_host(c->hosts, &f->self, time_now_unix(), &epoch)) < 0 ||
            (r = take_epoch(f, epoch)) < 0 || (r = db_adopt(c->db, f->self.id)) < 0 ||
            (r = db_idem_drop_pending(c->db, f->self.id)) < 0 ||
            (c->ledger && (r = ledger_set_host(c->ledger, f->self.id)) < 0)) {
                fleet_free(f);
                return r;
        }
        manager_set_host(c->manager, f->self.id);
        f->last_beat_ms = time_now_mono_ms();
        (void)fleet_refresh(f);
        *ret = f;
        return 0;
}

int fleet_set_images(Fleet *f, UserImages *images) {
        if (!f || !images)
                return 0;
        f->images = images;
        return user_images_set_epoch(images, f->self.id, fleet_epoch(f));
}

bool fleet_fenced(Fleet *f) {
        if (!f)
                return false;
        pthread_mutex_lock(&f->lock);
        bool fenced = f->cause != FENCE_NONE;
        pthread_mutex_unlock(&f->lock);
        return fenced;
}

const char *fleet_host_id(const Fleet *f) {
        return f->self.id;
}

int64_t fleet_epoch(Fleet *f) {
        pthread_mutex_lock(&f->lock);
        int64_t e = f->epoch;
        pthread_mutex_unlock(&f->lock);
        return e;
}

bool fleet_alone(Fleet *f) {
        if (!f)
                return true;
        pthread_mutex_lock(&f->lock);
        size_t others = 0;
        for (size_t i = 0; i < f->n_view; i++)
                others += f->view[i].state != HOST_DEAD && strcmp(f->view[i].id, f->self.id) != 0;
        pthread_mutex_unlock(&f->lock);
        return others == 0;
}

bool fleet_single(Fleet *f) {
        return !f || f->c.ops == store_sqlite.hosts;
}

bool fleet_runs_here(Fleet *f, const char *sandbox_id) {
        return f && f->c.manager && manager_runs(f->c.manager, sandbox_id);
}

bool fleet_draining(Fleet *f) {
        if (!f)
                return false;
        pthread_mutex_lock(&f->lock);
        bool d = f->draining;
        pthread_mutex_unlock(&f->lock);
        return d;
}

int fleet_refresh(Fleet *f) {
        HostRecord *list = NULL;
        size_t n = 0;
        int r = f->c.ops->list(f->c.hosts, &list, &n);
        if (r < 0)
                return r;
        pthread_mutex_lock(&f->lock);
        for (size_t i = 0; i < n; i++)
                if (strcmp(list[i].id, f->self.id) == 0)
                        f->draining = list[i].state == HOST_DRAINING;
        HostRecord *old = f->view;
        size_t old_n = f->n_view;
        f->view = list;
        f->n_view = n;
        pthread_mutex_unlock(&f->lock);
        view_free(old, old_n);
        return 0;
}

int fleet_host_url(Fleet *f, const char *host_id, char *buf, size_t n) {
        int r = -ENOENT;
        int64_t now = time_now_unix();
        pthread_mutex_lock(&f->lock);
        for (size_t i = 0; i < f->n_view; i++) {
                const HostRecord *h = &f->view[i];
                if (strcmp(h->id, host_id) != 0)
                        continue;
                if (h->state == HOST_DEAD || now - h->heartbeat_at > f->c.dead_after_seconds)
                        r = -EHOSTDOWN;
                else if (snprintf(buf, n, "%s", h->url) >= (int)n)
                        r = -ENAMETOOLONG;
                else
                        r = 0;
                break;
        }
        pthread_mutex_unlock(&f->lock);
        return r;
}

int fleet_view(Fleet *f, HostRecord **ret, size_t *ret_n) {
        pthread_mutex_lock(&f->lock);
        size_t n = f->n_view;
        HostRecord *copy = calloc(n ? n : 1, sizeof(*copy));
        int r = copy ? 0 : -ENOMEM;
        size_t done = 0;
        for (; r == 0 && done < n; done++)
                r = record_copy(&f->view[done], &copy[done]);
        pthread_mutex_unlock(&f->lock);
        if (r < 0) {
                view_free(copy, done ? done - 1 : 0);
                return r;
        }
        *ret = copy;
        *ret_n = n;
        return 0;
}

int64_t fleet_dead_after_seconds(const Fleet *f) {
        return f->c.dead_after_seconds;
}

/* Whether a comma-separated list names driver. */
static bool offers(const char *list, const char *driver) {
        size_t len = strlen(driver);
        for (const char *p = list; p && *p;) {
                size_t n = strcspn(p, ",");
                if (n == len && strncmp(p, driver, n) == 0)
                        return true;
                p += n + (p[n] == ',');
        }
        return false;
}

int fleet_choose(const HostRecord *view, size_t n, const FleetNeed *need, int64_t now, int64_t dead_after,
                 uint64_t draw, size_t *ret_index) {
        size_t fit[64], k = 0;
        for (size_t i = 0; i < n && k < ELEMENTSOF(fit); i++) {
                const HostRecord *h = &view[i];
                if (h->state != HOST_LIVE || now - h->heartbeat_at > dead_after)
                        continue;
                if (need->driver && !offers(h->drivers, need->driver))
                        continue;
                if (h->memory_mib - h->used.memory_mib < need->memory_mib)
                        continue;
                fit[k++] = i;
        }
        if (k == 0)
                return -ENOSPC;
        /* Two distinct draws when there are two to draw from. */
        size_t ia = draw % k, ib = k > 1 ? (ia + 1 + (draw / k) % (k - 1)) % k : ia;
        size_t a = fit[ia], b = fit[ib];
        int64_t free_a = view[a].memory_mib - view[a].used.memory_mib;
        int64_t free_b = view[b].memory_mib - view[b].used.memory_mib;
        *ret_index = free_b > free_a ? b : a;
        return 0;
}

int fleet_place(Fleet *f, const FleetNeed *need, char *ret_id, size_t id_len, char *ret_url, size_t url_len) {
        uint64_t draw;
        if (random_bytes(&draw, sizeof(draw)) < 0)
                draw = time_now_mono_ms();
        pthread_mutex_lock(&f->lock);
        size_t i;
        int r = fleet_choose(f->view, f->n_view, need, time_now_unix(), f->c.dead_after_seconds, draw, &i);
        if (r == 0 && (snprintf(ret_id, id_len, "%s", f->view[i].id) >= (int)id_len ||
                       snprintf(ret_url, url_len, "%s", f->view[i].url) >= (int)url_len))
                r = -ENAMETOOLONG;
        pthread_mutex_unlock(&f->lock);
        return r;
}

static void fence(Fleet *f, FenceCause cause) {
        pthread_mutex_lock(&f->lock);
        bool already = f->cause != FENCE_NONE;
        if (!already || cause == FENCE_TAKEN)
                f->cause = cause;
        pthread_mutex_unlock(&f->lock);
        if (already)
                return;
        const char *why = cause == FENCE_TAKEN      ? "another runtimed registered this host's id"
                          : cause == FENCE_DECLARED ? "the fleet declared this host dead"
                                                    : "no heartbeat reached the store in time";
        log_error(NULL, "host %s is fenced: %s; its sandboxes are stopped and the API answers 503 until it "
                        "registers again",
                  f->self.id, why);
        int n = manager_fence(f->c.manager);
        log_info(NULL, "host %s: %d sandbox%s stopped by the fence", f->self.id, n, n == 1 ? "" : "es");
}

/* Why a beat with epoch was refused: another registration of this id, or
 * the fleet's verdict. */
static FenceCause refused_why(Fleet *f, int64_t epoch) {
        HostRecord *list = NULL;
        size_t n = 0;
        FenceCause cause = FENCE_DECLARED;
        if (f->c.ops->list(f->c.hosts, &list, &n) < 0)
                return cause;
        for (size_t i = 0; i < n; i++) {
                if (strcmp(list[i].id, f->self.id) == 0 && list[i].epoch != epoch && list[i].state != HOST_DEAD)
                        cause = FENCE_TAKEN;
                store_host_record_clear(&list[i]);
        }
        free(list);
        return cause;
}

/* A fenced host (not for good) registers again once the store answers. */
static void rejoin(Fleet *f) {
        int64_t epoch = 0;
        int r = f->c.ops->register_host(f->c.hosts, &f->self, time_now_unix(), &epoch);
        if (r < 0)
                return;
        if ((r = take_epoch(f, epoch)) < 0) {
                log_error(NULL, "host %s: taking epoch %lld: %s", f->self.id, (long long)epoch, strerror(-r));
                return;
        }
        (void)db_idem_drop_pending(f->c.db, f->self.id);
        int lost = manager_recover_fenced(f->c.manager, "its host was cut off from the service's store and stopped it");
        if (lost < 0)
                log_error(NULL, "host %s: marking its own sandboxes lost: %s", f->self.id, strerror(-lost));
        pthread_mutex_lock(&f->lock);
        f->cause = FENCE_NONE;
        f->last_beat_ms = time_now_mono_ms();
        pthread_mutex_unlock(&f->lock);
        log_info(NULL, "host %s registered again (epoch %lld); %d sandbox%s of its own marked lost", f->self.id,
                 (long long)epoch, lost > 0 ? lost : 0, lost == 1 ? "" : "es");
}

static void beat(Fleet *f) {
        HostUse use;
        manager_use(f->c.manager, &use.vcpu, &use.memory_mib, &use.sandboxes);
        int64_t epoch = fleet_epoch(f);
        uint64_t sent = time_now_mono_ms();
        int r = f->c.ops->heartbeat(f->c.hosts, f->self.id, epoch, time_now_unix(), &use);
        if (r == 0) {
                pthread_mutex_lock(&f->lock);
                /* As of when it was sent: a beat that took long to land
                 * proves the record fresh only from then. */
                f->last_beat_ms = sent;
                pthread_mutex_unlock(&f->lock);
                return;
        }
        if (r == -ESTALE || r == -ENOENT) {
                fence(f, r == -ENOENT ? FENCE_DECLARED : refused_why(f, epoch));
                return;
        }
        log_warn(NULL, "host %s: heartbeat: %s", f->self.id, strerror(-r));
}

/* The fence's clock, on a thread of its own: a beat can hang on a dead
 * link (up to the store's timeouts), and the fence must not wait for it. A
 * beat before the others may call this host dead, it stops acting on a
 * store it can no longer prove it still belongs to. */
static void *watchdog_run(void *userdata) {
        Fleet *f = userdata;
        uint64_t limit = (uint64_t)f->c.dead_after_seconds * 1000 - (uint64_t)f->beat_ms;
        pthread_mutex_lock(&f->lock);
        while (!f->stop) {
                struct timespec deadline;
                time_mono_deadline(&deadline, WATCHDOG_MS);
                while (!f->stop && pthread_cond_timedwait(&f->wake, &f->lock, &deadline) != ETIMEDOUT)
                        ;
                if (f->stop)
                        break;
                bool stale = f->cause == FENCE_NONE && time_now_mono_ms() - f->last_beat_ms >= limit;
                pthread_mutex_unlock(&f->lock);
                if (stale)
                        fence(f, FENCE_CUT_OFF);
                pthread_mutex_lock(&f->lock);
        }
        pthread_mutex_unlock(&f->lock);
        return NULL;
}

static void format_time(int64_t t, char *buf, size_t n) {
        time_t tt = (time_t)t;
        struct tm tm;
        if (!gmtime_r(&tt, &tm) || strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0)
                snprintf(buf, n, "%lld", (long long)t);
}

/* The builds a dead host had queued or running end failed: their disks
 * were to be its own, and it will not write their end. */
static void lose_builds(Fleet *f, const char *host, const char *when) {
        char error[200];
        int64_t n = 0;
        snprintf(error, sizeof error, "its host %s stopped answering during the build (last heartbeat %s)", host, when);
        int r = user_images_fail_dead_host(f->images, host, error, &n);
        if (r < 0)
                log_warn(NULL, "failing the image builds of host %s: %s", host, strerror(-r));
        else if (n > 0)
                log_error(NULL, "host %s: %lld image build%s failed", host, (long long)n, n == 1 ? "" : "s");
}

/* The lease holder's round: hosts silent past the dead-after time are
 * declared dead, and the sandboxes of every dead host that still claim
 * processes are marked lost. */
static void sweep(Fleet *f) {
        HostRecord *list = NULL;
        size_t n = 0;
        int r = f->c.ops->list(f->c.hosts, &list, &n);
        if (r < 0) {
                log_warn(NULL, "host %s: listing the hosts: %s", f->self.id, strerror(-r));
                return;
        }
        int64_t now = time_now_unix();
        for (size_t i = 0; i < n; i++) {
                HostRecord *h = &list[i];
                if (strcmp(h->id, f->self.id) != 0 && h->state != HOST_DEAD &&
                    now - h->heartbeat_at > f->c.dead_after_seconds) {
                        r = f->c.ops->declare_dead(f->c.hosts, h->id, h->epoch, h->heartbeat_at, now);
                        if (r == 0) {
                                h->state = HOST_DEAD;
                                pthread_mutex_lock(&f->lock);
                                f->declared_total++;
                                pthread_mutex_unlock(&f->lock);
                                log_error(NULL, "host %s (epoch %lld) declared dead: no heartbeat for %lld s",
                                          h->id, (long long)h->epoch, (long long)(now - h->heartbeat_at));
                                events_emit(f->c.events, KEYS_ADMIN_OWNER, "host.dead", "host", h->id, NULL,
                                            json_pack("{s:I,s:I}", "epoch", (json_int_t)h->epoch, "lastHeartbeat",
                                                      (json_int_t)h->heartbeat_at));
                                char detail[160];
                                snprintf(detail, sizeof detail, "{\"host\":\"%s\",\"epoch\":%lld,\"lastHeartbeat\":%lld}",
                                         h->id, (long long)h->epoch, (long long)h->heartbeat_at);
                                AuditRecord rec = { .owner = KEYS_ADMIN_OWNER, .action = "host.dead", .detail = detail };
                                audit_record(f->c.audit, &rec);
                        } else if (r != -ESTALE)
                                log_warn(NULL, "declaring host %s dead: %s", h->id, strerror(-r));
                }
                if (h->state == HOST_DEAD && strcmp(h->id, f->self.id) != 0) {
                        char when[32], reason[160];
                        format_time(h->heartbeat_at, when, sizeof(when));
                        snprintf(reason, sizeof(reason), "its host %s stopped answering (last heartbeat %s)", h->id,
                                 when);
                        int lost = manager_lose_host(f->c.manager, h->id, h->heartbeat_at, reason);
                        if (lost < 0)
                                log_warn(NULL, "marking the sandboxes of host %s lost: %s", h->id, strerror(-lost));
                        else if (lost > 0) {
                                pthread_mutex_lock(&f->lock);
                                f->lost_total += (uint64_t)lost;
                                pthread_mutex_unlock(&f->lock);
                                log_error(NULL, "host %s: %d sandbox%s marked lost", h->id, lost,
                                          lost == 1 ? "" : "es");
                                (void)db_idem_drop_pending(f->c.db, h->id);
                        }
                        lose_builds(f, h->id, when);
                }
        }
        bool declared = false;
        for (size_t i = 0; i < n; i++) {
                declared |= list[i].dead_at == 0 && list[i].state == HOST_DEAD;
                store_host_record_clear(&list[i]);
        }
        free(list);
        if (declared)
                (void)fleet_refresh(f); /* the view shows what this sweep decided */
}

/* Retention, once for the fleet (the sweeper's), at most once a minute. */
static void prune_events(Fleet *f) {
        uint64_t now = time_now_mono_ms();
        if (!f->c.events || (f->last_prune_ms && now - f->last_prune_ms < 60000))
                return;
        f->last_prune_ms = now;
        int64_t n = 0;
        int r = events_prune(f->c.events, f->c.event_retention_days, &n);
        if (r < 0)
                log_warn(NULL, "dropping old events: %s", strerror(-r));
        else if (n > 0)
                log_info(NULL, "%lld event%s older than %lld days dropped", (long long)n, n == 1 ? "" : "s",
                         (long long)f->c.event_retention_days);
        /* Finished deliveries go with the events they carried. */
        if (f->c.webhooks && (r = webhooks_prune(f->c.webhooks, f->c.event_retention_days, &n)) < 0)
                log_warn(NULL, "dropping old webhook deliveries: %s", strerror(-r));
        if (f->c.audit && (r = audit_prune(f->c.audit, f->c.audit_retention_days, &n)) < 0)
                log_warn(NULL, "dropping old audit records: %s", strerror(-r));
        if (f->c.samples && (r = samples_prune(f->c.samples, f->c.sample_retention_days, &n)) < 0)
                log_warn(NULL, "dropping old sandbox metrics: %s", strerror(-r));
        if (f->c.requests && (r = request_counts_prune(f->c.requests, REQUEST_COUNTS_RETENTION_DAYS, &n)) < 0)
                log_warn(NULL, "dropping old request counts: %s", strerror(-r));
}

static void *fleet_run(void *userdata) {
        Fleet *f = userdata;
        pthread_mutex_lock(&f->lock);
        while (!f->stop) {
                struct timespec deadline;
                time_mono_deadline(&deadline, f->beat_ms);
                while (!f->stop && pthread_cond_timedwait(&f->wake, &f->lock, &deadline) != ETIMEDOUT)
                        ;
                if (f->stop)
                        break;
                FenceCause cause = f->cause;
                pthread_mutex_unlock(&f->lock);
                if (cause == FENCE_NONE) {
                        beat(f);
                        (void)fleet_refresh(f);
                }
                else if (cause != FENCE_TAKEN)
                        rejoin(f);
                if (!fleet_fenced(f)) {
                        int64_t lease_epoch;
                        int r = f->c.ops->lease(f->c.hosts, SWEEPER_LEASE, f->self.id, fleet_epoch(f),
                                                f->c.dead_after_seconds, time_now_unix(), &lease_epoch);
                        pthread_mutex_lock(&f->lock);
                        f->sweeper = r == 0;
                        pthread_mutex_unlock(&f->lock);
                        if (r == 0) {
                                sweep(f);
                                prune_events(f);
                        }
                        else if (r != -EBUSY)
                                log_warn(NULL, "host %s: the sweeper lease: %s", f->self.id, strerror(-r));
                }
                pthread_mutex_lock(&f->lock);
        }
        pthread_mutex_unlock(&f->lock);
        return NULL;
}

void fleet_metrics(Fleet *f, FILE *out) {
        if (!f)
                return;
        int64_t now = time_now_unix();
        pthread_mutex_lock(&f->lock);
        int64_t by_state[3] = { 0 }, silent = 0;
        for (size_t i = 0; i < f->n_view; i++) {
                const HostRecord *h = &f->view[i];
                if ((size_t)h->state < ELEMENTSOF(by_state))
                        by_state[h->state]++;
                if (h->state != HOST_DEAD && now - h->heartbeat_at > f->c.dead_after_seconds)
                        silent++;
        }
        fprintf(out,
                "# HELP runtime_host_epoch This host's epoch: one more at each registration.\n"
                "# TYPE runtime_host_epoch gauge\nruntime_host_epoch{host=\"%s\"} %lld\n"
                "# HELP runtime_host_fenced 1 while this host is fenced (cut off from the store).\n"
                "# TYPE runtime_host_fenced gauge\nruntime_host_fenced %d\n"
                "# HELP runtime_host_draining 1 while this host is draining.\n"
                "# TYPE runtime_host_draining gauge\nruntime_host_draining %d\n"
                "# HELP runtime_host_sweeper 1 while this host holds the sweeper lease.\n"
                "# TYPE runtime_host_sweeper gauge\nruntime_host_sweeper %d\n"
                "# HELP runtime_fleet_hosts The hosts sharing the store, by state, as this host last saw them.\n"
                "# TYPE runtime_fleet_hosts gauge\n"
                "runtime_fleet_hosts{state=\"live\"} %lld\nruntime_fleet_hosts{state=\"draining\"} %lld\n"
                "runtime_fleet_hosts{state=\"dead\"} %lld\n"
                "# HELP runtime_fleet_hosts_silent Hosts not declared dead whose heartbeat is older than the "
                "dead-after time.\n"
                "# TYPE runtime_fleet_hosts_silent gauge\nruntime_fleet_hosts_silent %lld\n"
                "# HELP runtime_fleet_hosts_declared_dead_total Hosts this host's sweeps declared dead.\n"
                "# TYPE runtime_fleet_hosts_declared_dead_total counter\n"
                "runtime_fleet_hosts_declared_dead_total %llu\n"
                "# HELP runtime_fleet_sandboxes_lost_total Sandboxes this host's sweeps marked lost.\n"
                "# TYPE runtime_fleet_sandboxes_lost_total counter\nruntime_fleet_sandboxes_lost_total %llu\n",
                f->self.id, (long long)f->epoch, f->cause != FENCE_NONE, f->draining, f->sweeper,
                (long long)by_state[HOST_LIVE], (long long)by_state[HOST_DRAINING], (long long)by_state[HOST_DEAD],
                (long long)silent, (unsigned long long)f->declared_total, (unsigned long long)f->lost_total);
        pthread_mutex_unlock(&f->lock);
}

int fleet_start(Fleet *f) {
        int r = -pthread_create(&f->thread, NULL, fleet_run, f);
        if (r < 0)
                return r;
        if ((r = -pthread_create(&f->watchdog, NULL, watchdog_run, f)) < 0) {
                pthread_mutex_lock(&f->lock);
                f->stop = true;
                pthread_cond_broadcast(&f->wake);
                pthread_mutex_unlock(&f->lock);
                pthread_join(f->thread, NULL);
                return r;
        }
        f->running = true;
        return 0;
}

void fleet_stop(Fleet *f) {
        if (!f || !f->running)
                return;
        pthread_mutex_lock(&f->lock);
        f->stop = true;
        pthread_cond_broadcast(&f->wake);
        pthread_mutex_unlock(&f->lock);
        pthread_join(f->thread, NULL);
        pthread_join(f->watchdog, NULL);
        f->running = false;
}
