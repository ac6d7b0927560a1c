#pragma once
/* What a create asks for, validated: request.c fills it from a client's
 * JSON, the manager (sandbox_create) takes it. Plain data, shared by both
 * sides so that neither includes the other. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define SANDBOX_MAX_LEASE_SECONDS 86400
/* A sandbox's env, whole (a create's, or after an :update merged into it):
 * it travels in every exec's OPEN frame, bounded by PROTO_MAX_JSON (64
 * KiB), with room kept for the command itself. */
#define SANDBOX_MAX_ENV 128u
#define SANDBOX_MAX_ENV_TOTAL (48u * 1024u)

/* Who a request asks to run as: DEFAULT when it names no user, and the
 * sandbox's own setting (its "user", "sandbox" unless set) decides. */
typedef enum ReqUser {
        REQ_AS_DEFAULT = 0,
        REQ_AS_SANDBOX,
        REQ_AS_ROOT,
} ReqUser;

typedef struct CreateRequest {
        int64_t timeout_seconds;
        bool delete_on_lease_end;
        bool pause_on_lease_end;
        int64_t idle_pause_seconds; /* 0: never; the manager raises it to its minimum */
        bool auto_wake;             /* a request to a paused sandbox wakes it */
        bool pausable;              /* false: :pause and idle pause are refused */
        bool run_as_root;           /* user "root": requests naming no user run as root */
        unsigned vcpu;
        unsigned memory_mib;
        unsigned disk_mib;
        json_t *network; /* normalized {"internet","allow","deny"} */
        json_t *env;     /* object string->string */
        json_t *labels;  /* object string->string */
        json_t *secrets; /* names of the egress secrets it may use; NULL: every one */
        char *image;
        char *driver; /* NULL: the daemon's default */
        char *name;   /* NULL: none */
        int64_t max_cost_micros; /* -1: none */
        int64_t max_total_cost_micros; /* -1: none; caps the sandbox across extends */
        const char *restore_dir; /* borrowed: a snapshot's files its disk starts from; NULL: a fresh disk */
} CreateRequest;
