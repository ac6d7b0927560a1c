#pragma once
/*
 * The daemon's side of egress: the pool that carries each sandbox's relay
 * connections to the proxy process (runtime-egress, src/egress/main.c,
 * which parses them without root or capabilities and holds the CA key),
 * every sandbox's live policy, the owners' secrets, the audit log of every
 * decision, and what a sandbox needs to use all of it (proxy variables, the
 * CA in its trust store, placeholders).
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/manager/sandbox_error.h"
#include "daemon/manager/channel.h"
#include "daemon/store/store_egress.h"
#include "egress/proxy.h"

typedef struct EgressService EgressService;
typedef struct SandboxEgress SandboxEgress;

typedef struct EgressServiceConfig {
        const char *state_dir; /* the CA lives here */
        const char *db_path;   /* secrets and the audit log */
        /* The store that keeps them at db_path; NULL: store_backend_for(db_path). */
        const StoreBackend *store;
        /* Test-only "name=127.0.0.1:port" mappings (see docs/egress.md). */
        const char *const *test_upstreams;
        size_t n_test_upstreams;
        const char *extra_ca_file; /* also trusted for upstreams (tests), or NULL */
        /* Operator settings (docs/egress.md): CIDRs whose addresses count as
         * public upstreams, and a CA bundle trusted upstream and in sandboxes. */
        const char *const *public_cidrs;
        size_t n_public_cidrs;
        const char *trust_ca_file;
        /* The pool serving connections (docs/egress.md): threads in all, and
         * a sandbox's share of them; 0: the defaults below. */
        unsigned workers;
        unsigned workers_per_sandbox;
        /* How long a connection waits for a worker before it is refused
         * with a 503 and an audit entry; 0: the default below. */
        unsigned wait_timeout_ms;
        /* The proxy process: the runtime-egress program, and the user it
         * becomes (NULL: runtime-egress; see docs/egress.md). */
        const char *proxy_path;
        const char *proxy_user;
        /* The key egress secrets' values are sealed with in the store
         * (egress_seal.h); copied. NULL: stored as given (tests of other
         * parts only). */
        const uint8_t *seal_key;
} EgressServiceConfig;

#define EGRESS_DEFAULT_WORKERS 256u
#define EGRESS_DEFAULT_WORKERS_PER_SANDBOX 64u
#define EGRESS_MAX_WORKERS 4096u
#define EGRESS_DEFAULT_WAIT_TIMEOUT_MS 30000u
#define EGRESS_MIN_WAIT_TIMEOUT_MS 100u
#define EGRESS_MAX_WAIT_TIMEOUT_MS 600000u

/* -EINVAL (or -EPERM for a range a sandbox may never reach) with err filled
 * for a bad test upstream, public range or CA file. */
int egress_service_new(const EgressServiceConfig *cfg, EgressService **ret, char *err, size_t err_len);
/* Waits (bounded) for connections still being served, then frees. */
void egress_service_free(EgressService *svc);
struct Events;
/* Where a refused connection is told as an `egress.refused` event of its
 * sandbox (at most one every EGRESS_REFUSED_EVENT_EVERY_S seconds per
 * sandbox; the egress log has every one). NULL (or never set): nowhere. */
#define EGRESS_REFUSED_EVENT_EVERY_S 10
void egress_service_set_events(EgressService *svc, struct Events *ev);
/* The same refusals as records of the audit trail (action egress.refused). */
struct Audit;
void egress_service_set_audit(EgressService *svc, struct Audit *a);

/* The environment every exec in a sandbox of `owner` gets: the proxy, the
 * trust store, a placeholder per secret in `scope` (an array of names; NULL:
 * every secret of the owner). A new reference. */
json_t *egress_service_sandbox_env(EgressService *svc, const char *owner, const json_t *scope);
/* Puts the daemon's CA, and the operator's trusted CAs when set, into a fresh
 * sandbox's system trust store: the CA file (NODE_EXTRA_CA_CERTS) and the
 * image's bundle with them appended, both written through its
 * agent at once. The bundle is read on the host from image_dir/rootfs (the
 * sandbox's root at creation, for every driver), through the agent when the
 * host cannot read it or image_dir is NULL. */
int egress_service_install_ca(EgressService *svc, Channel *c, const char *image_dir);

/* A sandbox's policy and identity for its proxied connections. `network` is
 * a validated network object; `scope` the names of the secrets it may use
 * (NULL: all of the owner's), fixed for its life; `trial` limits egress to
 * ports 80 and 443. */
int egress_sandbox_new(EgressService *svc, const char *sandbox_id, const char *owner, const json_t *network,
                       const json_t *scope, bool trial, SandboxEgress **ret);
/* New connections from now on follow this policy. */
int egress_sandbox_set_network(SandboxEgress *se, const json_t *network);
void egress_sandbox_unref(SandboxEgress *se);
/* What the sandbox's connections carried so far, counted as each ends:
 * bytes received from their destinations and sent to them. NULL se: 0. */
void egress_sandbox_bytes(SandboxEgress *se, uint64_t *ret_in, uint64_t *ret_out);
/* A ChannelAcceptFn; userdata is a SandboxEgress (it takes a reference per
 * connection). Queues the connection for the pool, which serves it on one of
 * at most `workers` threads (plus one proxy thread each), no more than
 * `workers_per_sandbox` of them for one sandbox; past the waiting room it is
 * refused with a 503 and an audit entry. Never blocks. */
void egress_sandbox_accept(void *userdata, ChanStream *s, json_t *request);

/* A stored secret as its owner may see it: everything but its value. */
typedef struct EgressSecretInfo {
        char *name;
        char *hosts;       /* the host patterns it may go to: a JSON array of strings, as stored */
        char *placeholder; /* what the sandbox sees in its environment */
        int64_t created_at, updated_at;
        char *header;      /* the header it goes into; NULL: wherever the placeholder stands */
        char *format;      /* with a header: the header's value around {value} */
        char *rules;       /* NULL: none; else the rules' normalised JSON array, as stored */
} EgressSecretInfo;
void egress_secret_info_done(EgressSecretInfo *s);
void egress_secret_infos_free(EgressSecretInfo *s, size_t n);

/* One decision of the proxy, as the audit log keeps it (the store's record:
 * when, the kind, whether it ended, and the proxy's EgressRecord). */
typedef StoreEgressAudit EgressAuditEntry;

/* The routes' calls. Owners see only their own secrets; values are never
 * given out. `body` is the client's object {value, hosts, header, format,
 * rules}, validated here. */
int egress_secret_put(EgressService *svc, const char *owner, const char *name, const json_t *body,
                      EgressSecretInfo *ret, SandboxError *e);
int egress_secret_get(EgressService *svc, const char *owner, const char *name, EgressSecretInfo *ret,
                      SandboxError *e);
/* A rotation: a new value ({value}), with the placeholder, hosts, header and
 * rules kept. */
int egress_secret_rotate(EgressService *svc, const char *owner, const char *name, const json_t *body,
                         EgressSecretInfo *ret, SandboxError *e);
/* One page by name: at most `limit` (0: all) named after `after` (NULL:
 * from the first); ret_more when more follow. */
int egress_secret_list(EgressService *svc, const char *owner, unsigned limit, const char *after,
                       EgressSecretInfo **ret, size_t *ret_n, bool *ret_more, SandboxError *e);
int egress_secret_delete(EgressService *svc, const char *owner, const char *name, SandboxError *e);
/* The newest decisions for one sandbox (the caller checked it is the
 * owner's), at most `limit`, newest first. */
int egress_audit_list(EgressService *svc, const char *sandbox_id, unsigned limit, EgressAuditEntry **ret,
                      size_t *ret_n, SandboxError *e);
