#include "daemon/manager/request_counts.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/timeutil.h"
#include "daemon/manager/audit.h"

typedef struct Pending {
        char owner[128];
        char key_id[40];
        int64_t hour;
        int64_t requests, client_errors, server_errors;
        bool used;
} Pending;

struct RequestCounts {
        const StoreRequestOps *ops;
        StoreRequests *h;
        pthread_mutex_t lock; /* table, n, stop */
        pthread_cond_t wake;
        pthread_mutex_t flush_lock; /* one flush at a time, so none is added twice */
        Pending *table;
        size_t n;
        bool stop;
        bool started;
        pthread_t thread;
};

static atomic_uint_fast64_t lost;

uint64_t request_counts_lost(void) {
        return atomic_load(&lost);
}

/* FNV-1a of the key and the hour: the table's slot to start from. */
static size_t slot_of(const char *key_id, int64_t hour) {
        uint64_t h = fnv1a64_str(FNV1A64_INIT, key_id);
        h = (h ^ (uint64_t)hour) * 1099511628211ULL;
        return (size_t)(h % REQUEST_COUNTS_PENDING_MAX);
}

void request_counts_note(RequestCounts *rc, const char *owner, const char *key_id, unsigned status) {
        if (!rc || !owner || !key_id || !*key_id)
                return;
        int64_t hour = time_now_unix() / 3600 * 3600;
        pthread_mutex_lock(&rc->lock);
        size_t at = slot_of(key_id, hour);
        Pending *p = NULL;
        for (size_t i = 0; i < REQUEST_COUNTS_PENDING_MAX; i++) {
                Pending *c = &rc->table[(at + i) % REQUEST_COUNTS_PENDING_MAX];
                if (!c->used) {
                        p = c;
                        p->used = true;
                        snprintf(p->owner, sizeof p->owner, "%s", owner);
                        snprintf(p->key_id, sizeof p->key_id, "%s", key_id);
                        p->hour = hour;
                        rc->n++;
                        break;
                }
                if (c->hour == hour && strcmp(c->key_id, key_id) == 0 && strcmp(c->owner, owner) == 0) {
                        p = c;
                        break;
                }
        }
        if (p) {
                p->requests++;
                p->client_errors += status >= 400 && status < 500;
                p->server_errors += status >= 500;
        }
        pthread_mutex_unlock(&rc->lock);
        if (!p)
                atomic_fetch_add(&lost, 1);
}

int request_counts_flush(RequestCounts *rc) {
        if (!rc)
                return 0;
        Pending *fresh = calloc(REQUEST_COUNTS_PENDING_MAX, sizeof(*fresh));
        RequestCount *out = calloc(REQUEST_COUNTS_PENDING_MAX, sizeof(*out));
        if (!fresh || !out) {
                free(fresh);
                free(out);
                return -ENOMEM;
        }
        pthread_mutex_lock(&rc->flush_lock);
        /* The table is swapped for an empty one: counting goes on meanwhile. */
        pthread_mutex_lock(&rc->lock);
        Pending *taken = rc->table;
        rc->table = fresh;
        rc->n = 0;
        pthread_mutex_unlock(&rc->lock);
        size_t n = 0;
        int64_t answers = 0;
        for (size_t i = 0; i < REQUEST_COUNTS_PENDING_MAX; i++)
                if (taken[i].used) {
                        out[n++] = (RequestCount){ .owner = taken[i].owner, .key_id = taken[i].key_id,
                                                   .hour = taken[i].hour, .requests = taken[i].requests,
                                                   .client_errors = taken[i].client_errors,
                                                   .server_errors = taken[i].server_errors };
                        answers += taken[i].requests;
                }
        int r = rc->ops->add(rc->h, out, n);
        pthread_mutex_unlock(&rc->flush_lock);
        if (r < 0) {
                atomic_fetch_add(&lost, (uint64_t)answers);
                log_warn(NULL, "%lld API answer%s not counted: %s", (long long)answers, answers == 1 ? "" : "s",
                         strerror(-r));
        }
        free(taken);
        free(out);
        return r;
}

static void *flusher(void *userdata) {
        RequestCounts *rc = userdata;
        /* Background work: a call being served comes first. */
        (void)setpriority(PRIO_PROCESS, (id_t)gettid(), AUDIT_WRITER_NICE);
        pthread_mutex_lock(&rc->lock);
        while (!rc->stop) {
                struct timespec deadline;
                time_mono_deadline(&deadline, REQUEST_COUNTS_FLUSH_SECONDS * 1000);
                while (!rc->stop && pthread_cond_timedwait(&rc->wake, &rc->lock, &deadline) != ETIMEDOUT)
                        ;
                if (rc->stop)
                        break;
                bool any = rc->n > 0;
                pthread_mutex_unlock(&rc->lock);
                if (any)
                        (void)request_counts_flush(rc);
                pthread_mutex_lock(&rc->lock);
        }
        pthread_mutex_unlock(&rc->lock);
        return NULL;
}

int request_counts_open(const StoreBackend *b, const char *location, RequestCounts **ret) {
        if (!b->requests)
                return -EPROTONOSUPPORT;
        RequestCounts *rc = calloc(1, sizeof(*rc));
        if (!rc)
                return -ENOMEM;
        rc->ops = b->requests;
        rc->table = calloc(REQUEST_COUNTS_PENDING_MAX, sizeof(*rc->table));
        pthread_mutex_init(&rc->lock, NULL);
        pthread_mutex_init(&rc->flush_lock, NULL);
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&rc->wake, &ca);
        pthread_condattr_destroy(&ca);
        int r = rc->table ? rc->ops->open(location, &rc->h) : -ENOMEM;
        if (r == 0) {
                r = -pthread_create(&rc->thread, NULL, flusher, rc);
                rc->started = r == 0;
        }
        if (r < 0) {
                request_counts_close(rc);
                return r;
        }
        *ret = rc;
        return 0;
}

void request_counts_close(RequestCounts *rc) {
        if (!rc)
                return;
        if (rc->started) {
                pthread_mutex_lock(&rc->lock);
                rc->stop = true;
                pthread_cond_signal(&rc->wake);
                pthread_mutex_unlock(&rc->lock);
                pthread_join(rc->thread, NULL);
        }
        if (rc->h) {
                (void)request_counts_flush(rc);
                rc->ops->close(rc->h);
        }
        pthread_cond_destroy(&rc->wake);
        pthread_mutex_destroy(&rc->flush_lock);
        pthread_mutex_destroy(&rc->lock);
        free(rc->table);
        free(rc);
}

int request_counts_list(RequestCounts *rc, const char *owner, int64_t since, StoreRequestFn fn, void *userdata) {
        return rc->ops->list(rc->h, owner, since, fn, userdata);
}

int request_counts_prune(RequestCounts *rc, int64_t days, int64_t *ret_n) {
        return rc->ops->prune(rc->h, time_now_unix() - days * 86400, ret_n);
}

int request_counts_set_epoch(RequestCounts *r, const char *host_id, int64_t epoch) {
        return r->ops->set_writer(r->h, host_id, epoch);
}
