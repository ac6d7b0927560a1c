#pragma once
/* The contract of a backend's webhooks (store_webhooks.h) and audit trail
 * (store_audit.h), shared by the SQLite and PostgreSQL tests: the per-owner
 * limit, owner scoping, versions, removal with the deliveries, claims that
 * two hosts never share, finishing by the claim's holder only, listing by
 * state and cursor, pruning; the audit trail's filters and cursor. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "daemon/store/store_audit.h"
#include "daemon/store/store_webhooks.h"

typedef struct HooksSeen {
        char ids[16][DELIVERY_ID_LEN + 1];
        char states[16][16];
        char claimed_by[16][16];
        int64_t seqs[16], versions[16];
        int attempts[16];
        int n;
} HooksSeen;

static inline int hooks_test_seen_hook(void *userdata, const WebhookRecord *w) {
        HooksSeen *s = userdata;
        if (s->n >= 16)
                return -E2BIG;
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", w->id);
        s->versions[s->n++] = w->version;
        return 0;
}

static inline int hooks_test_seen_delivery(void *userdata, const DeliveryRecord *d) {
        HooksSeen *s = userdata;
        if (s->n >= 16)
                return -E2BIG;
        snprintf(s->ids[s->n], sizeof s->ids[0], "%s", d->id);
        snprintf(s->states[s->n], sizeof s->states[0], "%s", d->state);
        snprintf(s->claimed_by[s->n], sizeof s->claimed_by[0], "%s", d->claimed_by ? d->claimed_by : "");
        s->attempts[s->n] = d->attempts;
        s->seqs[s->n++] = d->seq;
        return 0;
}

static inline WebhookRecord hooks_test_hook(const char *id, const char *owner) {
        WebhookRecord w = { .owner = owner, .url = "https://hooks.example.com/x", .events = "[]", .enabled = true,
                            .secret = "sealed:v1:abc", .created_at = 100, .updated_at = 100 };
        snprintf(w.id, sizeof w.id, "%s", id);
        return w;
}

static inline void hooks_test_enqueue(const StoreWebhookOps *ops, StoreWebhooks *h, const char *id, const char *hook,
                                      int64_t next_at) {
        DeliveryRecord d = { .webhook_id = hook, .owner = "alice", .event_id = "evt_1", .event_type = "sandbox.stopped",
                             .body = "{}", .state = "pending", .next_at = next_at, .created_at = 100,
                             .updated_at = 100 };
        snprintf(d.id, sizeof d.id, "%s", id);
        assert_int_equal(ops->enqueue(h, &d, 1), 0);
}

static inline void hooks_test_enqueue_of(const StoreWebhookOps *ops, StoreWebhooks *h, const char *id,
                                         const char *hook, const char *owner, int64_t next_at) {
        DeliveryRecord d = { .webhook_id = hook, .owner = owner, .event_id = "evt_2", .event_type = "sandbox.stopped",
                             .body = "{}", .state = "pending", .next_at = next_at, .created_at = next_at,
                             .updated_at = next_at };
        snprintf(d.id, sizeof d.id, "%s", id);
        assert_int_equal(ops->enqueue(h, &d, 1), 0);
}

/* A claim takes one owner's deliveries, the owner of the oldest due one
 * among those it does not pass over. */
static inline void hooks_test_claims_by_owner(const StoreWebhookOps *ops, StoreWebhooks *h, const char *alice_hook,
                                              const char *bob_hook) {
        HooksSeen s = { 0 };
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000021", alice_hook, "alice", 2000);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000022", bob_hook, "bob", 2001);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000023", alice_hook, "alice", 2002);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000024", alice_hook, "alice", 2003);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000025", bob_hook, "bob", 2004);
        /* The oldest is Alice's: all three of hers, none of Bob's. */
        assert_int_equal(ops->claim(h, "h1", 3000, 3060, 10, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 3);
        for (int i = 0; i < s.n; i++)
                assert_true(strcmp(s.ids[i], "whd_00000000000000000021") == 0 ||
                            strcmp(s.ids[i], "whd_00000000000000000023") == 0 ||
                            strcmp(s.ids[i], "whd_00000000000000000024") == 0);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h1", 3000, 3060, 10, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 2);
        assert_true(strcmp(s.ids[0], "whd_00000000000000000022") == 0 || strcmp(s.ids[0], "whd_00000000000000000025") == 0);
        /* Passing Alice over: Bob's, although hers are older (the claims
         * above still live). */
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000026", alice_hook, "alice", 3001);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000027", alice_hook, "alice", 3002);
        hooks_test_enqueue_of(ops, h, "whd_00000000000000000028", bob_hook, "bob", 3003);
        const char *alice[] = { "alice" }, *both[] = { "bob", "alice" };
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h1", 3010, 3070, 10, both, 2, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 0);
        assert_int_equal(ops->claim(h, "h1", 3010, 3070, 10, alice, 1, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.ids[0], "whd_00000000000000000028");
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h1", 3010, 3070, 10, alice, 1, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 0);
        /* A batch of one: the owner's oldest. */
        assert_int_equal(ops->claim(h, "h2", 3010, 3070, 1, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.ids[0], "whd_00000000000000000026");
        /* More owners to pass over than a claim takes. */
        const char *many[DELIVERY_CLAIM_SKIP_MAX + 1];
        for (int i = 0; i <= DELIVERY_CLAIM_SKIP_MAX; i++)
                many[i] = "someone";
        assert_int_equal(ops->claim(h, "h1", 3010, 3070, 10, many, DELIVERY_CLAIM_SKIP_MAX + 1, NULL, NULL), -E2BIG);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h1", 3010, 3070, 10, many, DELIVERY_CLAIM_SKIP_MAX, hooks_test_seen_delivery, &s),
                         0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.ids[0], "whd_00000000000000000027");
}

static inline void hooks_test_contract(const StoreWebhookOps *ops, StoreWebhooks *h) {
        HooksSeen s = { 0 };
        WebhookRecord a = hooks_test_hook("wh_00000000000000000001", "alice");
        WebhookRecord b = hooks_test_hook("wh_00000000000000000002", "alice");
        WebhookRecord c = hooks_test_hook("wh_00000000000000000003", "alice");
        WebhookRecord bob = hooks_test_hook("wh_00000000000000000004", "bob");
        assert_int_equal(ops->put(h, &a, 2), 0);
        assert_int_equal(ops->put(h, &a, 2), -EEXIST);
        assert_int_equal(ops->put(h, &b, 2), 0);
        assert_int_equal(ops->put(h, &c, 2), -EDQUOT);
        assert_int_equal(ops->put(h, &bob, 2), 0);
        /* Owner scoping. */
        assert_int_equal(ops->get(h, a.id, "bob", hooks_test_seen_hook, &s), -ENOENT);
        assert_int_equal(ops->get(h, a.id, "alice", hooks_test_seen_hook, &s), 0);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.versions[0], 1);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->list(h, "alice", hooks_test_seen_hook, &s), 0);
        assert_int_equal(s.n, 2);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->list(h, NULL, hooks_test_seen_hook, &s), 0);
        assert_int_equal(s.n, 3);
        /* Versions: a write of a stale version changes nothing. */
        a.version = 1;
        a.enabled = false;
        assert_int_equal(ops->update(h, &a), 0);
        assert_int_equal(ops->update(h, &a), -ESTALE);
        WebhookRecord ghost = hooks_test_hook("wh_00000000000000000009", "alice");
        ghost.version = 1;
        assert_int_equal(ops->update(h, &ghost), -ENOENT);
        WebhookRecord stolen = a;
        stolen.owner = "bob";
        stolen.version = 2;
        assert_int_equal(ops->update(h, &stolen), -ENOENT);

        /* Deliveries: only due and unclaimed ones are claimed, by one host. */
        hooks_test_enqueue(ops, h, "whd_00000000000000000001", a.id, 100);
        hooks_test_enqueue(ops, h, "whd_00000000000000000002", a.id, 100);
        hooks_test_enqueue(ops, h, "whd_00000000000000000003", a.id, 500);
        /* A batch with a taken id adds none of it. */
        DeliveryRecord batch[2] = {
                { .id = "whd_00000000000000000007", .webhook_id = a.id, .owner = "alice", .event_id = "e",
                  .event_type = "t", .body = "{}", .state = "pending", .next_at = 100 },
                { .id = "whd_00000000000000000001", .webhook_id = a.id, .owner = "alice", .event_id = "e",
                  .event_type = "t", .body = "{}", .state = "pending", .next_at = 100 },
        };
        assert_int_equal(ops->enqueue(h, batch, 2), -EEXIST);
        assert_int_equal(ops->get_delivery(h, "whd_00000000000000000007", NULL, NULL, NULL), -ENOENT);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h1", 200, 260, 1, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.ids[0], "whd_00000000000000000001");
        assert_string_equal(s.claimed_by[0], "h1");
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h2", 200, 260, 10, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1); /* the second due one; the first is h1's, the third not due */
        assert_string_equal(s.ids[0], "whd_00000000000000000002");
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim(h, "h2", 200, 260, 10, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 0);
        /* A claim of a host that died ends: the delivery is due again. */
        assert_int_equal(ops->claim(h, "h3", 261, 320, 1, NULL, 0, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.ids[0], "whd_00000000000000000001");
        /* Only the claim's holder records an attempt. */
        DeliveryRecord done = { .state = "delivered", .attempts = 1, .response_status = 204, .claimed_by = "h1",
                                .updated_at = 262 };
        snprintf(done.id, sizeof done.id, "whd_00000000000000000001");
        assert_int_equal(ops->finish(h, &done), -ESTALE);
        done.claimed_by = "h3";
        assert_int_equal(ops->finish(h, &done), 0);
        assert_int_equal(ops->finish(h, &done), -ESTALE); /* released */
        /* claim_one: busy while another claim lives, any state otherwise. */
        assert_int_equal(ops->claim_one(h, "whd_00000000000000000002", NULL, "h1", 210, 270, hooks_test_seen_delivery,
                                        &s),
                         -EBUSY);
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->claim_one(h, "whd_00000000000000000001", "alice", "h1", 300, 360,
                                        hooks_test_seen_delivery, &s),
                         0);
        assert_int_equal(s.n, 1);
        assert_string_equal(s.states[0], "delivered");
        assert_int_equal(ops->claim_one(h, "whd_00000000000000000001", "bob", "h1", 300, 360, NULL, NULL), -ENOENT);
        assert_int_equal(ops->claim_one(h, "whd_00000000000000000009", NULL, "h1", 300, 360, NULL, NULL), -ENOENT);
        /* Listing: newest first, by state, by cursor. */
        s = (HooksSeen){ 0 };
        DeliveryFilter f = { .webhook_id = a.id, .limit = 10 };
        assert_int_equal(ops->deliveries(h, &f, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 3);
        assert_string_equal(s.ids[0], "whd_00000000000000000003");
        f.before = s.seqs[0];
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->deliveries(h, &f, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 2);
        f = (DeliveryFilter){ .webhook_id = a.id, .state = "delivered", .limit = 10 };
        s = (HooksSeen){ 0 };
        assert_int_equal(ops->deliveries(h, &f, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 1);
        assert_int_equal(s.attempts[0], 1);
        /* Pruning takes what is finished and old only. */
        int64_t n = -1;
        assert_int_equal(ops->prune(h, 1000, &n), 0);
        assert_int_equal(n, 1);
        /* Removal takes the webhook and its deliveries, of its owner only. */
        assert_int_equal(ops->remove(h, a.id, "bob"), -ENOENT);
        assert_int_equal(ops->remove(h, a.id, "alice"), 0);
        assert_int_equal(ops->remove(h, a.id, "alice"), -ENOENT);
        s = (HooksSeen){ 0 };
        f = (DeliveryFilter){ .webhook_id = a.id, .limit = 10 };
        assert_int_equal(ops->deliveries(h, &f, hooks_test_seen_delivery, &s), 0);
        assert_int_equal(s.n, 0);
        assert_int_equal(ops->get_delivery(h, "whd_00000000000000000002", NULL, hooks_test_seen_delivery, &s),
                         -ENOENT);
        hooks_test_claims_by_owner(ops, h, b.id, bob.id);
}

/* ---- races between handles (each its own connection, as another
 * process's would be) ---- */

#define HOOKS_RACERS 6
#define HOOKS_RACE_DELIVERIES 60
#define HOOKS_RACE_LIMIT 4

typedef struct HooksRace {
        const StoreWebhookOps *ops;
        StoreWebhooks *h;
        pthread_barrier_t *start;
        int index;
        int put_result;
        int claimed[HOOKS_RACE_DELIVERIES];
        int n, failed;
} HooksRace;

static inline int hooks_race_collect(void *userdata, const DeliveryRecord *d) {
        HooksRace *a = userdata;
        int i = atoi(d->id + 4); /* "whd_" and its number */
        if (a->n >= HOOKS_RACE_DELIVERIES || i < 0 || i >= HOOKS_RACE_DELIVERIES)
                return -E2BIG;
        a->claimed[a->n++] = i;
        return 0;
}

static inline void *hooks_race_one(void *userdata) {
        HooksRace *a = userdata;
        char host[16], id[WEBHOOK_ID_LEN + 1];
        snprintf(host, sizeof host, "host-%d", a->index);
        snprintf(id, sizeof id, "wh_%020d", 100 + a->index);
        WebhookRecord w = hooks_test_hook(id, "carol");
        pthread_barrier_wait(a->start);
        a->put_result = a->ops->put(a->h, &w, HOOKS_RACE_LIMIT);
        for (;;) {
                int before = a->n;
                if (a->ops->claim(a->h, host, 1000, 1060, 3, NULL, 0, hooks_race_collect, a) < 0) {
                        a->failed++;
                        break;
                }
                if (a->n == before)
                        break;
        }
        return NULL;
}

/* Several handles at once: the owner's limit holds exactly, and every due
 * delivery is claimed by exactly one of them. */
static inline void hooks_test_races(const StoreWebhookOps *ops, const char *location) {
        StoreWebhooks *setup = NULL;
        assert_int_equal(ops->open(location, &setup), 0);
        for (int i = 0; i < HOOKS_RACE_DELIVERIES; i++) {
                DeliveryRecord d = { .webhook_id = "wh_race", .owner = "carol", .event_id = "evt_race",
                                     .event_type = "sandbox.created", .body = "{}", .state = "pending",
                                     .next_at = i, .created_at = 1, .updated_at = 1 };
                snprintf(d.id, sizeof d.id, "whd_%020d", i);
                assert_int_equal(ops->enqueue(setup, &d, 1), 0);
        }
        HooksRace races[HOOKS_RACERS] = { 0 };
        pthread_t t[HOOKS_RACERS];
        pthread_barrier_t start;
        assert_int_equal(pthread_barrier_init(&start, NULL, HOOKS_RACERS), 0);
        for (int i = 0; i < HOOKS_RACERS; i++) {
                races[i] = (HooksRace){ .ops = ops, .start = &start, .index = i };
                assert_int_equal(ops->open(location, &races[i].h), 0);
        }
        for (int i = 0; i < HOOKS_RACERS; i++)
                assert_int_equal(pthread_create(&t[i], NULL, hooks_race_one, &races[i]), 0);
        for (int i = 0; i < HOOKS_RACERS; i++)
                pthread_join(t[i], NULL);
        pthread_barrier_destroy(&start);
        int seen[HOOKS_RACE_DELIVERIES] = { 0 }, puts = 0;
        for (int i = 0; i < HOOKS_RACERS; i++) {
                assert_int_equal(races[i].failed, 0);
                assert_true(races[i].put_result == 0 || races[i].put_result == -EDQUOT);
                puts += races[i].put_result == 0;
                for (int j = 0; j < races[i].n; j++)
                        seen[races[i].claimed[j]]++;
                ops->close(races[i].h);
        }
        assert_int_equal(puts, HOOKS_RACE_LIMIT);
        for (int i = 0; i < HOOKS_RACE_DELIVERIES; i++)
                assert_int_equal(seen[i], 1);
        HooksSeen s = { 0 };
        assert_int_equal(ops->list(setup, "carol", hooks_test_seen_hook, &s), 0);
        assert_int_equal(s.n, HOOKS_RACE_LIMIT);
        ops->close(setup);
}

typedef struct AuditSeen {
        char actions[16][32];
        int64_t seqs[16];
        int n;
} AuditSeen;

static inline int audit_test_collect(void *userdata, const AuditRecord *a) {
        AuditSeen *s = userdata;
        if (s->n >= 16)
                return -E2BIG;
        snprintf(s->actions[s->n], sizeof s->actions[0], "%s", a->action);
        s->seqs[s->n++] = a->seq;
        return 0;
}

static inline void audit_test_contract(const StoreAuditOps *ops, StoreAudit *h) {
        /* Several in one write: all or none. */
        AuditRecord two[2] = { { .owner = "carol", .action = "key.create", .host_id = "h1", .at = 50 },
                               { .owner = "carol", .action = "key.revoke", .host_id = "h1", .at = 51 } };
        snprintf(two[0].id, sizeof two[0].id, "aud_%020d", 10);
        snprintf(two[1].id, sizeof two[1].id, "aud_%020d", 10); /* the same id twice */
        assert_int_equal(ops->append(h, two, 2), -EEXIST);
        snprintf(two[1].id, sizeof two[1].id, "aud_%020d", 11);
        assert_int_equal(ops->append(h, two, 2), 0);
        AuditSeen c = { 0 };
        AuditFilter cf = { .owner = "carol", .limit = 10 };
        assert_int_equal(ops->list(h, &cf, audit_test_collect, &c), 0);
        assert_int_equal(c.n, 2);
        static const char *const actions[] = { "sandbox.create", "sandbox.exec", "key.create", "sandbox.stop" };
        for (int i = 0; i < 4; i++) {
                AuditRecord a = { .owner = i == 2 ? "bob" : "alice", .action = actions[i], .key_id = "key_1",
                                  .method = "POST", .path = "/v1/x", .detail = "{\"command\":\"true\"}", .status = 200,
                                  .sandbox_id = i % 2 ? "sbx_odd" : "sbx_even",
                                  .client = "127.0.0.1", .request_id = "req_1", .host_id = "h1", .at = 100 + i };
                snprintf(a.id, sizeof a.id, "aud_%020d", i);
                assert_int_equal(ops->append(h, &a, 1), 0);
                assert_int_equal(ops->append(h, &a, 1), -EEXIST);
        }
        AuditSeen s = { 0 };
        AuditFilter f = { .owner = "alice", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
        assert_string_equal(s.actions[0], "sandbox.stop");
        s = (AuditSeen){ 0 };
        f = (AuditFilter){ .action = "sandbox.", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 3);
        s = (AuditSeen){ 0 };
        f = (AuditFilter){ .action = "sandbox.exec", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 1);
        s = (AuditSeen){ 0 };
        /* One sandbox's: alice's exec and stop, newest first. */
        s = (AuditSeen){ 0 };
        f = (AuditFilter){ .owner = "alice", .sandbox_id = "sbx_odd", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        assert_string_equal(s.actions[0], "sandbox.stop");
        assert_string_equal(s.actions[1], "sandbox.exec");
        s = (AuditSeen){ 0 };
        f = (AuditFilter){ .sandbox_id = "sbx_%", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 0);
        s = (AuditSeen){ 0 };
        f = (AuditFilter){ .action = "%", .limit = 10 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 0); /* no character of a filter is a pattern */
        f = (AuditFilter){ .limit = 2 };
        s = (AuditSeen){ 0 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        f.before = s.seqs[1];
        s = (AuditSeen){ 0 };
        assert_int_equal(ops->list(h, &f, audit_test_collect, &s), 0);
        assert_int_equal(s.n, 2);
        assert_string_equal(s.actions[1], "sandbox.create");
        int64_t n = -1;
        assert_int_equal(ops->prune(h, 102, &n), 0);
        assert_int_equal(n, 4); /* alice's and bob's first two, and carol's */
}
