#pragma once
/* What a create asks for, validated: request.c fills it from a client's
 * JSON, the manager (sandbox_create) takes it. Plain data, shared by both
 * sides so that neither includes the other. */
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "daemon/model/sandbox_spec.h"

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
        SandboxSpec spec; /* spec.driver NULL: the daemon's default */
        bool run_as_root; /* user "root": requests naming no user run as root */
        json_t *labels;   /* object string->string */
        char *name;       /* NULL: none */
        const char *restore_dir; /* borrowed: a snapshot's files its disk starts from; NULL: a fresh disk */
        /* The caller gives a warm pool sandbox's kernel its owner's env at
         * once (interpreter_prestart); without it, a pool sandbox whose
         * kernel was started there is not taken. */
        bool pool_kernel_ok;
} CreateRequest;
void create_request_done(CreateRequest *r);
