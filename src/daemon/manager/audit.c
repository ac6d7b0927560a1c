#include "daemon/manager/audit.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/log.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"

struct Audit {
        const StoreAuditOps *ops;
        StoreAudit *h;
        char host_id[64];
        pthread_mutex_t lock; /* queue, n, writing, stop */
        pthread_cond_t wake;  /* the writer: records queued, or stop */
        pthread_cond_t idle;  /* readers: the queue written */
        struct Queued *head, *tail;
        size_t n;
        bool writing;
        bool stop;
        bool started;
        pthread_t thread;
};

/* A record as queued: its strings copied after it. */
typedef struct Queued {
        struct Queued *next;
        AuditRecord rec;
        char text[];
} Queued;

static atomic_uint_fast64_t dropped;

static void *writer(void *userdata);

int audit_open(const StoreBackend *b, const char *location, Audit **ret) {
        if (!b->audit)
                return -EPROTONOSUPPORT;
        Audit *a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->ops = b->audit;
        pthread_mutex_init(&a->lock, NULL);
        pthread_cond_init(&a->wake, NULL);
        pthread_cond_init(&a->idle, NULL);
        int r = a->ops->open(location, &a->h);
        if (r == 0) {
                r = -pthread_create(&a->thread, NULL, writer, a);
                a->started = r == 0;
        }
        if (r < 0) {
                audit_close(a);
                return r;
        }
        *ret = a;
        return 0;
}

void audit_close(Audit *a) {
        if (!a)
                return;
        if (a->started) {
                /* What is queued is written first. */
                pthread_mutex_lock(&a->lock);
                a->stop = true;
                pthread_cond_signal(&a->wake);
                pthread_mutex_unlock(&a->lock);
                pthread_join(a->thread, NULL);
        }
        if (a->h)
                a->ops->close(a->h);
        for (Queued *q = a->head, *next; q; q = next) {
                next = q->next;
                free(q);
        }
        pthread_cond_destroy(&a->idle);
        pthread_cond_destroy(&a->wake);
        pthread_mutex_destroy(&a->lock);
        free(a);
}

void audit_set_host(Audit *a, const char *host_id) {
        snprintf(a->host_id, sizeof a->host_id, "%s", host_id);
}

uint64_t audit_dropped(void) {
        return atomic_load(&dropped);
}

/* Records written in one write of the store at most. */
#define AUDIT_BATCH_MAX 256

/* Writes the n records of recs in one write; when that fails, one by one,
 * so that one the store refuses costs only itself. */
static void write_batch(Audit *a, const AuditRecord *recs, size_t n) {
        if (n > 1 && a->ops->append(a->h, recs, n) == 0)
                return;
        for (size_t i = 0; i < n; i++) {
                int r = a->ops->append(a->h, &recs[i], 1);
                if (r < 0) {
                        atomic_fetch_add(&dropped, 1);
                        log_warn(NULL, "audit record %s of %s not kept: %s", recs[i].action, recs[i].owner,
                                 strerror(-r));
                }
        }
}

static void *writer(void *userdata) {
        Audit *a = userdata;
        /* Background work: a call being served comes first. */
        (void)setpriority(PRIO_PROCESS, (id_t)gettid(), AUDIT_WRITER_NICE);
        AuditRecord *recs = malloc(AUDIT_BATCH_MAX * sizeof(*recs));
        pthread_mutex_lock(&a->lock);
        for (;;) {
                while (!a->head && !a->stop)
                        pthread_cond_wait(&a->wake, &a->lock);
                if (!a->head)
                        break;
                Queued *batch = a->head;
                a->head = a->tail = NULL;
                a->n = 0;
                a->writing = true;
                pthread_mutex_unlock(&a->lock);
                while (batch) {
                        Queued *first = batch;
                        size_t n = 0;
                        for (Queued *q = first; q && n < AUDIT_BATCH_MAX; q = q->next) {
                                if (recs)
                                        recs[n] = q->rec;
                                n++;
                                batch = q->next;
                        }
                        if (recs)
                                write_batch(a, recs, n);
                        else
                                for (Queued *q = first; q != batch; q = q->next)
                                        write_batch(a, &q->rec, 1);
                        for (Queued *q = first, *next; q != batch; q = next) {
                                next = q->next;
                                free(q);
                        }
                }
                pthread_mutex_lock(&a->lock);
                a->writing = false;
                if (!a->head)
                        pthread_cond_broadcast(&a->idle);
        }
        pthread_mutex_unlock(&a->lock);
        free(recs);
        return NULL;
}

/* Appends s (NULL: none) to the text area at *at; the copy's address. */
static const char *copy_in(char **at, const char *s) {
        if (!s)
                return NULL;
        size_t len = strlen(s) + 1;
        memcpy(*at, s, len);
        const char *copy = *at;
        *at += len;
        return copy;
}

void audit_record(Audit *a, AuditRecord *rec) {
        if (!a)
                return;
        char hex[21];
        int r = random_hex(hex, 10);
        if (r == 0) {
                snprintf(rec->id, sizeof rec->id, "aud_%s", hex);
                rec->host_id = a->host_id;
                if (!rec->at)
                        rec->at = time_now_unix();
        }
        const char *fields[] = { rec->owner, rec->action,  rec->key_id,     rec->method, rec->path,
                                 rec->sandbox_id, rec->detail, rec->client, rec->request_id, rec->host_id };
        size_t bytes = 0;
        for (size_t i = 0; i < ELEMENTSOF(fields); i++)
                bytes += fields[i] ? strlen(fields[i]) + 1 : 0;
        Queued *q = r == 0 ? malloc(sizeof(*q) + bytes) : NULL;
        if (q) {
                char *at = q->text;
                q->next = NULL;
                q->rec = *rec;
                q->rec.owner = copy_in(&at, rec->owner);
                q->rec.action = copy_in(&at, rec->action);
                q->rec.key_id = copy_in(&at, rec->key_id);
                q->rec.method = copy_in(&at, rec->method);
                q->rec.path = copy_in(&at, rec->path);
                q->rec.sandbox_id = copy_in(&at, rec->sandbox_id);
                q->rec.detail = copy_in(&at, rec->detail);
                q->rec.client = copy_in(&at, rec->client);
                q->rec.request_id = copy_in(&at, rec->request_id);
                q->rec.host_id = copy_in(&at, rec->host_id);
        }
        pthread_mutex_lock(&a->lock);
        bool queued = q && a->n < AUDIT_QUEUE_MAX && !a->stop;
        if (queued) {
                if (a->tail)
                        a->tail->next = q;
                else
                        a->head = q;
                a->tail = q;
                a->n++;
                pthread_cond_signal(&a->wake);
        }
        pthread_mutex_unlock(&a->lock);
        if (!queued) {
                free(q);
                atomic_fetch_add(&dropped, 1);
                log_warn(NULL, "audit record %s of %s not kept: %s", rec->action, rec->owner,
                         r < 0 ? strerror(-r) : q ? "the writer's queue is full" : "out of memory");
        }
}

/* Until what was queued before is in the store: a reader sees its own calls. */
static void audit_settle(Audit *a) {
        pthread_mutex_lock(&a->lock);
        while ((a->head || a->writing) && a->started && !a->stop)
                pthread_cond_wait(&a->idle, &a->lock);
        pthread_mutex_unlock(&a->lock);
}

int audit_list(Audit *a, const AuditFilter *f, StoreAuditFn fn, void *userdata) {
        audit_settle(a);
        return a->ops->list(a->h, f, fn, userdata);
}

int audit_prune(Audit *a, int64_t days, int64_t *ret_n) {
        return a->ops->prune(a->h, time_now_unix() - days * 86400, ret_n);
}

int audit_set_epoch(Audit *a, const char *host_id, int64_t epoch) {
        return a->ops->set_writer(a->h, host_id, epoch);
}
