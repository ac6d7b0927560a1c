/* Which backend a location names, and what a backend lacks. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/store/pgdb.h"
#include "daemon/store/store.h"
#include "daemon/store/store_hosts.h"
#include "daemon/store/store_links.h"
#include "daemon/store/store_volumes.h"

const StoreBackend *store_backend_for(const char *location) {
        return pgdb_is_url(location) ? &store_postgres : &store_sqlite;
}

bool store_backend_missing(const StoreBackend *b, char *buf, size_t n) {
        const struct {
                const char *name;
                bool have;
        } kinds[] = {
                { "keys", b->keys },           { "ledger", b->ledger },       { "uploads", b->uploads },
                { "sandboxes", b->sandboxes }, { "snapshots", b->snapshots }, { "egress", b->egress },
                { "hosts", b->hosts },         { "events", b->events },       { "webhooks", b->webhooks },
                { "audit", b->audit },         { "samples", b->samples },
                { "requests", b->requests },   { "otel", b->otel },           { "links", b->links },
                { "previews", b->previews },
                { "images", b->images },
                { "sessions", b->sessions },
                { "volumes", b->volumes },
        };
        size_t at = 0;
        if (n)
                buf[0] = '\0';
        for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
                if (!kinds[i].have && at < n)
                        at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? ", " : "", kinds[i].name);
        return at > 0;
}

static const char *const host_states[] = {
        [HOST_LIVE] = "live",
        [HOST_DRAINING] = "draining",
        [HOST_DEAD] = "dead",
};

const char *host_state_name(HostState s) {
        return (size_t)s < sizeof(host_states) / sizeof(host_states[0]) ? host_states[s] : "dead";
}

HostState host_state_from_name(const char *s) {
        for (size_t i = 0; i < sizeof(host_states) / sizeof(host_states[0]); i++)
                if (s && strcmp(s, host_states[i]) == 0)
                        return (HostState)i;
        return HOST_DEAD;
}

bool store_not_in(char *buf, size_t size, const char *column, char mark, int first, size_t n) {
        if (size == 0)
                return false;
        buf[0] = '\0';
        size_t len = 0;
        for (size_t i = 0; i < n; i++) {
                int w = i == 0 ? snprintf(buf, size, " AND %s NOT IN (%c%d", column, mark, first)
                               : snprintf(buf + len, size - len, ", %c%d", mark, first + (int)i);
                if (w < 0 || (size_t)w >= size - len)
                        return false;
                len += (size_t)w;
        }
        if (n > 0) {
                if (len + 1 >= size)
                        return false;
                buf[len++] = ')';
                buf[len] = '\0';
        }
        return true;
}

void store_link_secret_clear(StoreLinkSecret *s) {
        if (!s)
                return;
        free(s->owner);
        free(s->secret);
        *s = (StoreLinkSecret){ 0 };
}

static const char *const volume_states[] = {
        [STORE_VOLUME_READY] = "ready",
        [STORE_VOLUME_RESIZING] = "resizing",
};

const char *store_volume_state_name(StoreVolumeState s) {
        return (size_t)s < sizeof(volume_states) / sizeof(volume_states[0]) ? volume_states[s] : "resizing";
}

int store_volume_state_from_name(const char *s, StoreVolumeState *ret) {
        for (size_t i = 0; i < sizeof(volume_states) / sizeof(volume_states[0]); i++)
                if (s && strcmp(s, volume_states[i]) == 0) {
                        *ret = (StoreVolumeState)i;
                        return 0;
                }
        return -EINVAL;
}
