#include "daemon/manager/ledger.h"

#include <errno.h>
#include <search.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

struct Ledger {
        const StoreLedgerOps *ops;
        StoreLedger *h;
};

int ledger_open(const StoreBackend *b, const char *location, Ledger **ret) {
        if (!b || !b->ledger)
                return -EPROTONOSUPPORT;
        Ledger *l = calloc(1, sizeof(*l));
        if (!l)
                return -ENOMEM;
        l->ops = b->ledger;
        int r = l->ops->open(location, &l->h);
        if (r < 0) {
                free(l);
                return r;
        }
        *ret = l;
        return 0;
}

void ledger_close(Ledger *l) {
        if (!l)
                return;
        l->ops->close(l->h);
        free(l);
}

uint64_t ledger_cost(uint64_t per_hour, int64_t seconds) {
        if (seconds <= 0)
                return 0;
        unsigned __int128 v = (unsigned __int128)per_hour * (uint64_t)seconds / 3600u;
        return v > INT64_MAX ? INT64_MAX : (uint64_t)v;
}

uint64_t ledger_cost_ceil(uint64_t per_hour, int64_t seconds) {
        if (seconds <= 0)
                return 0;
        unsigned __int128 v = ((unsigned __int128)per_hour * (uint64_t)seconds + 3599u) / 3600u;
        return v > INT64_MAX ? INT64_MAX : (uint64_t)v;
}

/* A key's use as the API tells it, from what the store counted. */
static LedgerKeyUse key_use_of(const StoreLedgerUse *s) {
        return (LedgerKeyUse){
                .settled_micros = s->settled_micros,
                .reserved_micros = s->reserved_micros,
                .used_micros = s->settled_micros + s->reserved_micros,
                .used_seconds = s->settled_seconds + s->reserved_seconds,
                .frees_at = s->oldest_charge_end ? s->oldest_charge_end + LEDGER_WINDOW_SECONDS : 0,
        };
}

int ledger_reserve(Ledger *l, const char *key_id, const char *owner, const char *sandbox_id,
                   const LedgerBudget *budget, int64_t amount, int64_t seconds, int64_t expires_at, int64_t now,
                   LedgerRefusal *ret_refusal) {
        if (amount < 0 || seconds < 0)
                return -EINVAL;
        StoreReservation res = { .sandbox_id = sandbox_id, .key_id = key_id, .owner = owner,
                                 .amount_micros = amount, .seconds = seconds, .expires_at = expires_at };
        StoreLedgerUse used;
        int r = l->ops->reserve(l->h, &res, budget, now - LEDGER_WINDOW_SECONDS, now, &used);
        if (r != -EDQUOT)
                return r;
        /* The store refused it against one of the two limits: say which. */
        LedgerKeyUse u = key_use_of(&used);
        LedgerRefusal refusal;
        if (budget->daily_limit_micros >= 0 && u.used_micros + amount > budget->daily_limit_micros)
                refusal = (LedgerRefusal){ .limit = budget->daily_limit_micros, .used = u.used_micros,
                                           .wanted = amount, .frees_at = u.frees_at };
        else
                refusal = (LedgerRefusal){ .allowance = true, .limit = budget->allowance_seconds,
                                           .used = u.used_seconds, .wanted = seconds };
        refusal.reservations_end = used.reservations_end;
        *ret_refusal = refusal;
        return -EDQUOT;
}

int ledger_release(Ledger *l, const char *sandbox_id, int64_t now) {
        return l->ops->release(l->h, sandbox_id, now);
}

int ledger_begin(Ledger *l, const char *sandbox_id, const char *key_id, const char *owner, int64_t started_at,
                 uint64_t per_hour, int64_t lease_ends_at) {
        return l->ops->begin(l->h, sandbox_id, key_id, owner, started_at, per_hour, lease_ends_at);
}

int ledger_settle(Ledger *l, const char *sandbox_id, int64_t end, int64_t now) {
        int r = l->ops->settle(l->h, sandbox_id, end, false, now, ledger_cost, NULL);
        return r == -ENOENT ? 0 : r;
}

int ledger_settle_at_heartbeat(Ledger *l, const char *sandbox_id, int64_t cap, int64_t now, int64_t *ret_end) {
        return l->ops->settle(l->h, sandbox_id, cap, true, now, ledger_cost, ret_end);
}

int ledger_heartbeat(Ledger *l, int64_t now) {
        return l->ops->heartbeat(l->h, now);
}

int ledger_set_host(Ledger *l, const char *host_id) {
        return l->ops->set_host(l->h, host_id);
}

int ledger_set_epoch(Ledger *l, int64_t epoch) {
        return l->ops->set_epoch(l->h, epoch);
}

int ledger_settle_orphans(Ledger *l, int64_t now) {
        return l->ops->settle_orphans(l->h, now);
}

int ledger_key_budget(Ledger *l, const char *key_id, int64_t trial_allowance_seconds, LedgerBudget *ret) {
        StoreLedgerKey k;
        int r = l->ops->key_budget(l->h, key_id, &k);
        if (r < 0)
                return r;
        ret->daily_limit_micros = k.daily_limit_micros;
        ret->allowance_seconds = k.trial ? trial_allowance_seconds : -1;
        return 0;
}

int ledger_key_use(Ledger *l, const char *key_id, int64_t now, LedgerKeyUse *ret) {
        StoreLedgerUse used;
        int r = l->ops->key_use(l->h, key_id, now - LEDGER_WINDOW_SECONDS, &used);
        if (r < 0)
                return r;
        *ret = key_use_of(&used);
        return 0;
}

/* Micros of an interval between two of its instants, exact on totals. */
static int64_t span_micros(int64_t price, int64_t prior, int64_t started, int64_t a, int64_t b) {
        if (b <= a)
                return 0;
        return (int64_t)(ledger_cost((uint64_t)price, prior + (b - started)) -
                         ledger_cost((uint64_t)price, prior + (a - started)));
}

void ledger_usage_done(LedgerUsage *u) {
        if (!u)
                return;
        for (size_t i = 0; i < u->n_sandboxes; i++) {
                free(u->sandboxes[i].sandbox_id);
                free(u->sandboxes[i].key_id);
        }
        for (size_t i = 0; i < u->n_keys; i++) {
                free(u->keys[i].key_id);
                free(u->keys[i].name);
        }
        free(u->sandboxes);
        free(u->keys);
        *u = (LedgerUsage){ 0 };
}

/* An entry's place in its list, found by id: a window may hold thousands of
 * sandboxes and many intervals of each, so no scan of the list per row. */
typedef struct UsageSlot {
        const char *id; /* the entry's own copy */
        size_t at;
} UsageSlot;

static int slot_cmp(const void *a, const void *b) {
        return strcmp(((const UsageSlot *)a)->id, ((const UsageSlot *)b)->id);
}

/* A usage as it is summed up, with the lists' capacities and indexes. */
typedef struct UsageSum {
        LedgerUsage u;
        size_t cap_sandboxes, cap_keys;
        void *sandbox_index, *key_index; /* tsearch trees of UsageSlot */
} UsageSum;

static void usage_sum_done(UsageSum *s) {
        tdestroy(s->sandbox_index, free);
        tdestroy(s->key_index, free);
        ledger_usage_done(&s->u);
}

/* The index of id's entry in a list, or -ENOENT. */
static ssize_t slot_find(void *const *index, const char *id) {
        UsageSlot probe = { .id = id };
        UsageSlot *const *found = tfind(&probe, index, slot_cmp);
        return found ? (ssize_t)(*found)->at : -ENOENT;
}

static int slot_add(void **index, const char *id, size_t at) {
        UsageSlot *slot = malloc(sizeof(*slot));
        if (!slot)
                return -ENOMEM;
        *slot = (UsageSlot){ .id = id, .at = at };
        if (!tsearch(slot, index, slot_cmp)) {
                free(slot);
                return -ENOMEM;
        }
        return 0;
}

/* Room for one more of `size` bytes in *list of *cap. */
static int grow(void **list, size_t *cap, size_t n, size_t size) {
        if (n < *cap)
                return 0;
        size_t want = *cap ? *cap * 2 : 16;
        void *p = reallocarray(*list, want, size);
        if (!p)
                return -ENOMEM;
        *list = p;
        *cap = want;
        return 0;
}

static int add_key_share(UsageSum *s, const char *key_id, const char *name, int64_t seconds, int64_t micros) {
        ssize_t at = slot_find(&s->key_index, key_id);
        if (at < 0) {
                int r = grow((void **)&s->u.keys, &s->cap_keys, s->u.n_keys, sizeof(*s->u.keys));
                if (r < 0)
                        return r;
                LedgerUsageKey *k = &s->u.keys[s->u.n_keys];
                *k = (LedgerUsageKey){ .key_id = strdup(key_id), .name = strdup(name) };
                if (!k->key_id || !k->name || slot_add(&s->key_index, k->key_id, s->u.n_keys) < 0) {
                        free(k->key_id);
                        free(k->name);
                        return -ENOMEM;
                }
                at = (ssize_t)s->u.n_keys++;
        }
        s->u.keys[at].seconds += seconds;
        s->u.keys[at].micros += micros;
        return 0;
}

static int add_sandbox_share(UsageSum *s, const char *sandbox_id, const char *key_id, bool open, int64_t seconds,
                             int64_t micros) {
        ssize_t at = slot_find(&s->sandbox_index, sandbox_id);
        if (at < 0) {
                if (s->u.n_sandboxes >= LEDGER_USAGE_MAX_SANDBOXES) {
                        s->u.truncated = true;
                        return 0;
                }
                int r = grow((void **)&s->u.sandboxes, &s->cap_sandboxes, s->u.n_sandboxes, sizeof(*s->u.sandboxes));
                if (r < 0)
                        return r;
                LedgerUsageSandbox *sb = &s->u.sandboxes[s->u.n_sandboxes];
                *sb = (LedgerUsageSandbox){ .sandbox_id = strdup(sandbox_id), .key_id = strdup(key_id) };
                if (!sb->sandbox_id || !sb->key_id ||
                    slot_add(&s->sandbox_index, sb->sandbox_id, s->u.n_sandboxes) < 0) {
                        free(sb->sandbox_id);
                        free(sb->key_id);
                        return -ENOMEM;
                }
                at = (ssize_t)s->u.n_sandboxes++;
        }
        LedgerUsageSandbox *sb = &s->u.sandboxes[at];
        if (strcmp(sb->key_id, key_id) != 0) {
                char *k = strdup(key_id);
                if (!k)
                        return -ENOMEM;
                free(sb->key_id);
                sb->key_id = k;
        }
        sb->seconds += seconds;
        sb->micros += micros;
        sb->running = open;
        return 0;
}

/* What a usage listing sums each charge of the owner into. */
typedef struct UsageWalk {
        UsageSum *sum;
        int64_t since, until, now;
} UsageWalk;

static int usage_add(const StoreLedgerInterval *iv, void *userdata) {
        UsageWalk *w = userdata;
        int64_t ended = iv->ended_at;
        if (iv->open) {
                ended = w->now;
                if (iv->reservation_expires_at && ended > iv->reservation_expires_at)
                        ended = iv->reservation_expires_at;
        }
        int64_t a = iv->started_at > w->since ? iv->started_at : w->since;
        int64_t b = ended < w->until ? ended : w->until;
        if (b < a)
                b = a;
        int64_t secs = b - a, micros = span_micros(iv->price_per_hour, iv->prior_seconds, iv->started_at, a, b);
        w->sum->u.total_seconds += secs;
        w->sum->u.total_micros += micros;
        int r = add_key_share(w->sum, iv->key_id, iv->key_name, secs, micros);
        if (r == 0)
                r = add_sandbox_share(w->sum, iv->sandbox_id, iv->key_id, iv->open, secs, micros);
        return r;
}

int ledger_usage(Ledger *l, const char *owner, int64_t since, int64_t until, int64_t now, LedgerUsage *ret) {
        _cleanup_(usage_sum_done) UsageSum s = { 0 };
        UsageWalk w = { .sum = &s, .since = since, .until = until, .now = now };
        int r = l->ops->owner_intervals(l->h, owner, since, until, usage_add, &w);
        if (r < 0)
                return r;
        *ret = s.u;
        s.u = (LedgerUsage){ 0 };
        return 0;
}

/* A series' total as it is summed up. */
typedef struct TotalWalk {
        int64_t now, cap;
        int64_t seconds, micros;
} TotalWalk;

static int total_add(const StoreLedgerInterval *iv, void *userdata) {
        TotalWalk *w = userdata;
        if (!iv->open) {
                w->seconds += iv->seconds;
                w->micros += iv->micros;
                return 0;
        }
        int64_t end = w->now;
        if (w->cap > 0 && end > w->cap)
                end = w->cap;
        if (end < iv->started_at)
                end = iv->started_at;
        w->seconds += end - iv->started_at;
        w->micros += span_micros(iv->price_per_hour, iv->prior_seconds, iv->started_at, iv->started_at, end);
        return 0;
}

int ledger_sandbox_total(Ledger *l, const char *sandbox_id, int64_t now, int64_t cap, int64_t *ret_seconds,
                         int64_t *ret_micros) {
        TotalWalk w = { .now = now, .cap = cap };
        int r = l->ops->sandbox_intervals(l->h, sandbox_id, total_add, &w);
        if (r < 0)
                return r;
        *ret_seconds = w.seconds;
        *ret_micros = w.micros;
        return 0;
}

/* Places of an export compared: by end, then series, then start. */
static int place_cmp(const LedgerExportPlace *a, const LedgerExportPlace *b) {
        if (a->ended_at != b->ended_at)
                return a->ended_at < b->ended_at ? -1 : 1;
        int c = strcmp(a->series, b->series);
        if (c)
                return c;
        return a->started_at < b->started_at ? -1 : a->started_at > b->started_at;
}

/* The page as it is found: the `limit` first rows after the cursor, kept
 * in order as the charges come in another one (their start's), and
 * whether any came past them. */
typedef struct ExportWalk {
        int64_t since, until, final_through;
        const LedgerExportPlace *after;
        LedgerExportRow *rows;
        size_t n, limit;
        bool more;
} ExportWalk;

/* Keeps one row if it belongs on the page. */
static void export_keep(ExportWalk *w, const LedgerExportRow *row) {
        if (w->after && place_cmp(&row->at, w->after) <= 0)
                return;
        /* Where it goes among the rows kept (binary search), if anywhere. */
        size_t lo = 0, hi = w->n;
        while (lo < hi) {
                size_t mid = (lo + hi) / 2;
                if (place_cmp(&w->rows[mid].at, &row->at) < 0)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        if (lo == w->limit) {
                w->more = true;
                return;
        }
        if (w->n == w->limit)
                w->more = true; /* the last one kept goes */
        else
                w->n++;
        memmove(&w->rows[lo + 1], &w->rows[lo], (w->n - 1 - lo) * sizeof(*w->rows));
        w->rows[lo] = *row;
}

/* A settled charge, as rows: one per UTC day it ran in (a charge across
 * midnight is cut there), each with its seconds and its part of the
 * charge's micros, exact on the charge's total. */
static int export_add(const StoreLedgerInterval *iv, void *userdata) {
        ExportWalk *w = userdata;
        if (iv->open) {
                if (iv->ended_at < w->final_through)
                        w->final_through = iv->ended_at;
                return 0;
        }
        if (iv->ended_at < w->since || iv->ended_at >= w->until)
                return 0;
        LedgerExportRow row = { .at = { .ended_at = iv->ended_at }, .price_per_hour = iv->price_per_hour };
        snprintf(row.at.series, sizeof row.at.series, "%s", iv->sandbox_id);
        snprintf(row.key_id, sizeof row.key_id, "%s", iv->key_id);
        snprintf(row.key_name, sizeof row.key_name, "%s", iv->key_name ? iv->key_name : "");
        int64_t a = iv->started_at, before = 0;
        do {
                int64_t midnight = (a / 86400 + 1) * 86400;
                int64_t b = midnight < iv->ended_at ? midnight : iv->ended_at;
                row.at.started_at = a;
                row.ended_at = b;
                if (b == iv->ended_at) {
                        /* The last piece takes what is left of the total. */
                        row.seconds = iv->seconds - (a - iv->started_at);
                        row.micros = iv->micros - before;
                } else {
                        row.seconds = b - a;
                        row.micros = span_micros(iv->price_per_hour, iv->prior_seconds, iv->started_at, a, b);
                }
                if (row.seconds < 0)
                        row.seconds = 0;
                if (row.micros < 0)
                        row.micros = 0;
                before += row.micros;
                export_keep(w, &row);
                a = b;
        } while (a < iv->ended_at);
        return 0;
}

int ledger_export(Ledger *l, const char *owner, int64_t since, int64_t until, const LedgerExportPlace *after,
                  size_t limit, int64_t now, LedgerExportRow *rows, size_t *ret_n, bool *ret_more,
                  int64_t *ret_final_through) {
        if (limit < 1 || limit > LEDGER_EXPORT_MAX_ROWS || since >= until)
                return -EINVAL;
        ExportWalk w = { .since = since, .until = until, .final_through = now < until ? now : until, .after = after,
                         .rows = rows, .limit = limit };
        int r = l->ops->owner_intervals(l->h, owner, since, until, export_add, &w);
        if (r < 0)
                return r;
        *ret_n = w.n;
        *ret_more = w.more;
        *ret_final_through = w.final_through;
        return 0;
}
