#pragma once
/* What a create asks for, validated: request.c fills it from a client's
 * JSON, the manager (sandbox_create) takes it. Plain data, shared by both
 * sides so that neither includes the other. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#define SANDBOX_MAX_LEASE_SECONDS 86400

typedef struct CreateRequest {
        int64_t timeout_seconds;
        bool delete_on_lease_end;
        bool pause_on_lease_end;
        int64_t idle_pause_seconds; /* 0: never; the manager raises it to its minimum */
        bool auto_wake;             /* a request to a paused sandbox wakes it */
        bool pausable;              /* false: :pause and idle pause are refused */
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
