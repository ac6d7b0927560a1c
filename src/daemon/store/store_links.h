#pragma once
/*
 * The file links' state as a backend keeps it (store.h): each sandbox's
 * link secret, sealed (the daemon seals and opens it; the store sees text),
 * with the sandbox's owner, kept after the sandbox is deleted so that a link
 * to a deleted sandbox is told from a forged one; and the one-time links
 * used, each until its link expires. Claiming a use is atomic for every
 * host that shares the store: of two claims at once exactly one wins.
 */
#include <stdint.h>

#include "daemon/store/store.h"

typedef struct StoreLinkSecret {
        char *owner;
        char *secret; /* sealed */
        int64_t rotated_at;
} StoreLinkSecret;

void store_link_secret_clear(StoreLinkSecret *s);

typedef struct StoreLinks StoreLinks;

struct StoreLinkOps {
        int (*open)(const char *location, StoreLinks **ret);
        void (*close)(StoreLinks *h);
        /* The host whose writes these are, at its epoch (a fleet): writes
         * are made only while it is still registered at it and not declared
         * dead, else -EOWNERDEAD. A backend with one host ignores it. */
        int (*set_writer)(StoreLinks *h, const char *host_id, int64_t epoch);
        /* The sandbox's secret; -ENOENT when it has none. */
        int (*secret_get)(StoreLinks *h, const char *sandbox_id, StoreLinkSecret *ret);
        /* Keeps `sealed` as the sandbox's secret unless it has one already
         * (two hosts making its first link at once keep one); *ret is the
         * secret kept, either way. */
        int (*secret_add)(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed, int64_t now,
                          StoreLinkSecret *ret);
        /* Replaces the sandbox's secret (or makes it): every link signed
         * with the one before fails from now on. */
        int (*secret_rotate)(StoreLinks *h, const char *sandbox_id, const char *owner, const char *sealed,
                             int64_t now);
        /* Records the one use of a one-time link: 0 the first time,
         * -EALREADY after. The uses of links expired by `now` go on the way. */
        int (*use_once)(StoreLinks *h, const char *link_id, const char *sandbox_id, int64_t expires_at, int64_t now);
};

extern const StoreLinkOps store_sqlite_links;
extern const StoreLinkOps store_postgres_links;
