#pragma once
/*
 * What the files of the egress service share: egress_service.c (the service,
 * its proxy process, what a sandbox gets), egress_secrets.c (the owners'
 * secrets) and egress_relay.c (each sandbox's connections, the pool that
 * serves them and their audit log).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

#include <jansson.h>

#include "daemon/egress/egress_service.h"
#include "daemon/store/store_egress.h"
#include "egress/cidr.h"
#include "egress/proxy.h"

#define MAX_TEST_UPSTREAMS 32
#define MAX_SECRETS_PER_OWNER 100

typedef struct Conn Conn;

struct EgressService {
        /* The secrets and the audit log, in the store's egress records. */
        const StoreEgressOps *store;
        StoreEgress *records;
        bool sealed;             /* values are sealed with seal_key in the store */
        uint8_t seal_key[32];
        atomic_uint audit_inserts; /* entries written since the last prune */
        struct Events *events;     /* refusals told as events; NULL: none */
        struct Audit *audit;       /* and as records of the audit trail; NULL: none */
        pthread_mutex_t lock; /* the counters and the pool below */
        pthread_cond_t idle;
        unsigned active;      /* connections served, waiting or being refused */
        /* The pool: at most max_workers threads serve connections, each with
         * at most one helper thread of the proxy's (one direction of a
         * tunnel), and a sandbox holds at most `share` of them at once. The
         * rest wait in `queue`, bounded per sandbox and in all; past that
         * they go to the one refuser thread, which answers 503 and writes the
         * audit entry. */
        pthread_cond_t work, refusal;
        Conn *queue, *queue_tail;
        unsigned n_waiting;
        unsigned max_workers, share;
        unsigned wait_ms; /* the longest a connection waits for a worker */
        unsigned workers, idle_workers, wakeups;
        Conn *refusals, *refusals_tail;
        unsigned n_refusals;
        bool refuser;
        bool stopping;
        EgressTestHost test_hosts[MAX_TEST_UPSTREAMS];
        size_t n_test_hosts;
        EgressCidr public_cidrs[EGRESS_MAX_PUBLIC_CIDRS];
        size_t n_public_cidrs;
        char *sandbox_ca_pem; /* the daemon's CA, then the operator's trusted CAs */
        /* The proxy process (runtime-egress): started at start and again
         * when a connection finds it gone. */
        pthread_mutex_t proxy_lock;
        char **proxy_argv;
        pid_t proxy_pid;
        int proxy_ctl; /* -1: none running */
        char *ca_pem;  /* what the proxy's CA looks like, from its hello */
};

struct SandboxEgress {
        EgressService *svc;
        atomic_int refs;
        char id[32];
        char owner[128];
        bool trial;
        json_t *scope;   /* the names of the secrets it may use; NULL: all; fixed for its life */
        pthread_mutex_t lock;
        json_t *network; /* under lock */
        /* Under svc->lock: connections being served, waiting for a worker,
         * and refused without an audit entry of their own (the refusal list
         * was full) since the last one that was logged. */
        unsigned serving, waiting;
        unsigned unlogged;
        /* Refusals not yet told as an event (egress_relay.c's tell_refusal). */
        atomic_uint refusals_untold;
        /* What its connections carried, added as each ends (the metrics'
         * network figures). */
        _Atomic uint64_t bytes_in, bytes_out;
};

/* egress_secrets.c: whether a sandbox whose create named `scope` (NULL:
 * every secret) gets the secret `name`. */
bool egress_secret_in_scope(const json_t *scope, const char *name);
/* egress_secrets.c: the owner's secrets within scope, values included, for
 * one connection: what the proxy process gets, and nothing more. */
int egress_secrets_for_proxy(EgressService *svc, const char *owner, const json_t *scope, json_t **ret);
/* egress_service.c: hands a connection's descriptors to the proxy,
 * starting it again when it is gone. */
int egress_service_proxy_send(EgressService *svc, int data, int meta);
