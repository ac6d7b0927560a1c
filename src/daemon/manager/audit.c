#include "daemon/manager/audit.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/random.h"
#include "common/timeutil.h"

struct Audit {
        const StoreAuditOps *ops;
        StoreAudit *h;
        char host_id[64];
};

static atomic_uint_fast64_t dropped;

int audit_open(const StoreBackend *b, const char *location, Audit **ret) {
        if (!b->audit)
                return -EPROTONOSUPPORT;
        Audit *a = calloc(1, sizeof(*a));
        if (!a)
                return -ENOMEM;
        a->ops = b->audit;
        int r = a->ops->open(location, &a->h);
        if (r < 0) {
                free(a);
                return r;
        }
        *ret = a;
        return 0;
}

void audit_close(Audit *a) {
        if (!a)
                return;
        a->ops->close(a->h);
        free(a);
}

void audit_set_host(Audit *a, const char *host_id) {
        snprintf(a->host_id, sizeof a->host_id, "%s", host_id);
}

uint64_t audit_dropped(void) {
        return atomic_load(&dropped);
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
                r = a->ops->append(a->h, rec);
        }
        if (r < 0) {
                atomic_fetch_add(&dropped, 1);
                log_warn(NULL, "audit record %s of %s not kept: %s", rec->action, rec->owner, strerror(-r));
        }
}

int audit_list(Audit *a, const AuditFilter *f, StoreAuditFn fn, void *userdata) {
        return a->ops->list(a->h, f, fn, userdata);
}

int audit_prune(Audit *a, int64_t days, int64_t *ret_n) {
        return a->ops->prune(a->h, time_now_unix() - days * 86400, ret_n);
}
