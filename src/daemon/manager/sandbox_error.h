#pragma once
/* Why a call of the manager (sandboxes, egress state) failed. The manager
 * knows nothing of HTTP: the handlers map a kind onto a status and a code of
 * the API (api_sandbox_error). */
typedef enum SandboxErrorKind {
        SANDBOX_ERR_INTERNAL,    /* details in the log */
        SANDBOX_ERR_INVALID,     /* the request cannot be served as asked */
        SANDBOX_ERR_NOT_FOUND,   /* no such sandbox of this owner */
        SANDBOX_ERR_CONFLICT,    /* not in a state that allows it */
        SANDBOX_ERR_NOT_PAUSED,  /* a wake of a sandbox that is not paused (409 not_paused) */
        SANDBOX_ERR_OVER_BUDGET, /* the lease would pass the sandbox's own cap */
        SANDBOX_ERR_SPENDING,    /* the key's or the trial's allowance is spent */
        SANDBOX_ERR_TOO_LARGE,   /* an input passes a bound */
        SANDBOX_ERR_TOO_MANY,    /* a count passes a bound (sandboxes, streams) */
        SANDBOX_ERR_UNAVAILABLE, /* this host cannot do it now */
        SANDBOX_ERR_NOT_IMPLEMENTED, /* a feature this daemon does not have */
} SandboxErrorKind;

typedef struct SandboxError {
        SandboxErrorKind kind;
        char message[512];
        char hint[256]; /* what the caller can do; may be empty */
} SandboxError;

/* Fills e and returns -EINVAL. hint may be NULL. */
int sandbox_error(SandboxError *e, SandboxErrorKind kind, const char *hint, const char *fmt, ...)
        __attribute__((format(printf, 4, 5)));
