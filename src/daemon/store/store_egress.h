#pragma once
/*
 * The egress control's durable state behind the store (store.h): the
 * owners' egress secrets and the audit log of the proxy's decisions. A
 * backend fills the records below; the egress service (egress_service.c and
 * the files split from it) never sees how they are kept.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "daemon/store/store.h"
#include "egress/conn.h"

typedef struct StoreEgress StoreEgress;

/* A conditional write's version that any current version satisfies. */
#define STORE_EGRESS_ANY_VERSION UINT64_C(0)

/* A secret as stored, under its owner (the owner is the key the operations
 * take, not a field). Strings are the caller's to free. */
typedef struct StoreEgressSecret {
        char *name;
        char *value;       /* NULL unless asked for: only the proxy's copy carries it */
        char *hosts;       /* the normalised host patterns: a JSON array of strings */
        char *placeholder; /* made once, kept across replaces and rotations */
        char *header;      /* NULL: wherever the placeholder stands */
        char *format;      /* with a header: the header's value around {value} */
        char *rules;       /* NULL: none; else the normalised rules, a JSON array */
        int64_t created_at, updated_at;
        uint64_t version;  /* 1 when made, bumped by every write */
} StoreEgressSecret;

static inline void store_egress_secret_done(StoreEgressSecret *s) {
        if (!s)
                return;
        free(s->name);
        free(s->value);
        free(s->hosts);
        free(s->placeholder);
        free(s->header);
        free(s->format);
        free(s->rules);
        *s = (StoreEgressSecret){ 0 };
}

static inline void store_egress_secrets_free(StoreEgressSecret *s, size_t n) {
        for (size_t i = 0; s && i < n; i++)
                store_egress_secret_done(&s[i]);
        free(s);
}

/* One decision of the proxy (or a refusal of the daemon's), as the audit
 * log keeps it. */
typedef struct StoreEgressAudit {
        int64_t at;   /* when the proxy decided (or the daemon refused) */
        char kind[8]; /* "connect", "http", or "none" (no request was read) */
        /* false while the connection is open: its counts, rec.duration_ms
         * and rec.end come when it ends, into this same entry */
        bool ended;
        EgressRecord rec;
} StoreEgressAudit;

struct StoreEgressOps {
        /* Opens the egress records at location, making or migrating their
         * tables; -EPROTONOSUPPORT when a newer daemon wrote them. */
        int (*open)(const char *location, StoreEgress **ret);
        void (*close)(StoreEgress *h); /* accepts NULL */

        /* Secrets: every call is scoped by owner; another owner's secret of
         * the same name is -ENOENT. A conditional write (if_version other
         * than STORE_EGRESS_ANY_VERSION) of a version no longer current is
         * -ESTALE and changes nothing. */

        /* Makes or replaces in->name with every field of `in` but the
         * placeholder and created_at, which a replace keeps (running sandboxes
         * hold the placeholder). -EDQUOT when the owner has max_per_owner
         * other secrets (0: no limit); the count and the write are one
         * transaction. ret: the stored secret, without its value. */
        int (*secret_put)(StoreEgress *h, const char *owner, const StoreEgressSecret *in, uint64_t if_version,
                          unsigned max_per_owner, StoreEgressSecret *ret);
        /* A new value alone (updated_at = now); -ENOENT when there is no such
         * secret. ret: the stored secret, without its value. */
        int (*secret_rotate)(StoreEgress *h, const char *owner, const char *name, const char *value, int64_t now,
                             uint64_t if_version, StoreEgressSecret *ret);
        /* ret without its value; -ENOENT. */
        int (*secret_get)(StoreEgress *h, const char *owner, const char *name, StoreEgressSecret *ret);
        /* One page by name: at most `limit` (0: all) named after `after`
         * (NULL: from the first); ret_more when more follow. Values only
         * when with_values. *ret is freed with store_egress_secrets_free. */
        int (*secret_list)(StoreEgress *h, const char *owner, const char *after, unsigned limit, bool with_values,
                           StoreEgressSecret **ret, size_t *ret_n, bool *ret_more);
        /* -ENOENT when there is no such secret. */
        int (*secret_delete)(StoreEgress *h, const char *owner, const char *name, uint64_t if_version);

        /* The audit log. Entries are written by the daemon, never by a
         * client; each names its sandbox and the sandbox's owner. Listing is
         * by sandbox id alone: ids are unique across owners and the caller
         * checked the sandbox is the client's (entries from before the owner
         * was kept have none). */

        /* A new entry; ret_id (may be NULL) its id for audit_update. */
        int (*audit_append)(StoreEgress *h, const char *sandbox, const char *owner, const StoreEgressAudit *entry,
                            int64_t *ret_id);
        /* The entry `id` of `sandbox` again: allowed and the reason, and when
         * entry->ended its counts, duration and end as well (the host, port,
         * kind, address and rule stay as first written). -ENOENT. */
        int (*audit_update)(StoreEgress *h, const char *sandbox, int64_t id, const StoreEgressAudit *entry);
        /* The newest `limit` entries of the sandbox, newest first. *ret (an
         * array of at least one, even when ret_n is 0) is freed with free(). */
        int (*audit_list)(StoreEgress *h, const char *sandbox, unsigned limit, StoreEgressAudit **ret, size_t *ret_n);
        /* Keeps the sandbox's newest `keep` entries and drops the rest. */
        int (*audit_prune)(StoreEgress *h, const char *sandbox, unsigned keep);
        /* Ends every entry still open with `why` (a daemon's start: the
         * connections of its last run are gone). */
        int (*audit_end_open)(StoreEgress *h, const char *why);
};

extern const StoreEgressOps store_sqlite_egress;
/* The PostgreSQL backend's egress records (postgres_egress.c). */
extern const StoreEgressOps store_postgres_egress;
