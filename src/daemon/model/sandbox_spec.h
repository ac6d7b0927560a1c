#pragma once
/*
 * The sandbox's model, owned by the manager: what a sandbox is made of and
 * the lifecycle facts it carries (SandboxSpec), its states, its lease-end
 * policy. The request parser fills a spec from a client's JSON, handlers
 * render it, and the store keeps it through the one codec below: the spec
 * is decoded once, where a row is read, and is C fields from there on.
 * Plain data: this header includes nothing of the daemon.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A create that names no timeoutSeconds gets this lease. */
#define SANDBOX_DEFAULT_TIMEOUT_SECONDS 300
#define SANDBOX_MAX_LEASE_SECONDS 86400

/* What the daemon does when a lease ends. */
typedef enum LeaseEnd {
        LEASE_END_STOP = 0,
        LEASE_END_PAUSE,
        LEASE_END_DELETE,
} LeaseEnd;
const char *lease_end_name(LeaseEnd e);
/* -EINVAL for a name that is none of "stop", "pause", "delete". */
int lease_end_from_name(const char *s, LeaseEnd *ret);

/* The driver a sandbox runs on (docs/drivers.md). NONE only in a create
 * that names none: the daemon's default is taken. */
typedef enum SandboxDriver {
        SANDBOX_DRIVER_NONE = 0,
        SANDBOX_DRIVER_NAMESPACE,
        SANDBOX_DRIVER_GVISOR,
        SANDBOX_DRIVER_MICROVM,
        _SANDBOX_DRIVER_MAX,
} SandboxDriver;
/* The driver's name as the API and the drivers' table say it; NULL for NONE. */
const char *sandbox_driver_name(SandboxDriver d);
/* -EINVAL for a name that is no driver's. */
int sandbox_driver_from_name(const char *s, SandboxDriver *ret);

/* A sandbox's state, as the API names it. */
typedef enum SandboxState {
        SANDBOX_STARTING = 0,
        SANDBOX_RUNNING,
        SANDBOX_PAUSING,
        SANDBOX_PAUSED,
        SANDBOX_RESUMING,
        SANDBOX_STOPPING,
        SANDBOX_STOPPED,
        SANDBOX_FAILED,
        SANDBOX_LOST,    /* its host stopped answering (or cut itself off): nothing of it runs */
        SANDBOX_DELETED, /* kept as history; never listed */
        _SANDBOX_STATE_MAX,
} SandboxState;
const char *sandbox_state_name(SandboxState s);
/* -EINVAL for a name that is no state. */
int sandbox_state_from_name(const char *s, SandboxState *ret);

/* A volume the sandbox has bound at a path (docs/volumes.md). */
#define SANDBOX_MAX_VOLUMES 4
#define SANDBOX_VOLUME_ID_MAX 32
#define SANDBOX_VOLUME_PATH_MAX 256
typedef struct SandboxVolume {
        char volume_id[SANDBOX_VOLUME_ID_MAX]; /* vol_ and 20 hex digits */
        char path[SANDBOX_VOLUME_PATH_MAX];    /* checked by sandbox_volume_path_check */
        bool read_only;
} SandboxVolume;

/* NULL when path may hold a volume: absolute, normalized (no "..", ".",
 * "//" or trailing "/"), printable, below SANDBOX_VOLUME_PATH_MAX, and not
 * the root or over /proc, /sys, /dev or /.runtime, which the sandbox's own
 * workings need. Else why not, in a client's words. */
const char *sandbox_volume_path_check(const char *path);

typedef struct SandboxSpec {
        char *image;
        SandboxDriver driver;
        unsigned vcpu;
        unsigned memory_mib;
        unsigned disk_mib;
        int64_t timeout_seconds; /* each lease's length */
        LeaseEnd on_lease_end;
        int64_t max_cost_micros;       /* -1: none */
        int64_t max_total_cost_micros; /* -1: none; caps the sandbox across extends */
        int64_t idle_pause_seconds;    /* 0: never */
        bool auto_wake;                /* a request to a paused sandbox wakes it */
        bool pausable;                 /* false: :pause and idle pause are refused */
        bool trial;                    /* made by a trial key: narrower egress */
        json_t *network;               /* normalized {"internet","allow","deny"}; owned */
        json_t *env;                   /* object string->string; owned */
        json_t *secrets;               /* names of the egress secrets it may use; NULL: every one; owned */
        /* The lifecycle, kept with the spec: */
        int64_t paused_at;          /* unix seconds; 0: not paused */
        int64_t lease_left_seconds; /* the lease a paused sandbox carries on with at wake */
        int64_t paused_seconds;     /* paused time so far, billed at the disk rate */
        /* What a restarted daemon proves to the sandbox's supervisor that it
         * is the same sandbox's (32 hex digits); "" when it has none. */
        char supervisor_nonce[33];
        /* Its volumes, fixed at create. */
        SandboxVolume volumes[SANDBOX_MAX_VOLUMES];
        size_t n_volumes;
} SandboxSpec;

/* A spec with the defaults a create starts from (no JSON members). */
void sandbox_spec_init(SandboxSpec *s);
void sandbox_spec_done(SandboxSpec *s);
/* Its volumes as the API shows them: [{volumeId, path, readOnly}]; NULL
 * when out of memory. */
json_t *sandbox_spec_volumes_json(const SandboxSpec *s);
/* A deep copy; -ENOMEM. */
int sandbox_spec_copy(const SandboxSpec *s, SandboxSpec *ret);

/*
 * The stored form. The version says how the text is to be read and is kept
 * next to it (a column of the row): version 1 is the JSON object the daemon
 * has always written, so rows written before the version existed read as 1.
 * A newer version is refused, never guessed at.
 */
#define SANDBOX_SPEC_VERSION 1
/* The text of version SANDBOX_SPEC_VERSION, malloc'ed; NULL when out of memory. */
char *sandbox_spec_encode(const SandboxSpec *s);
/* -EPROTONOSUPPORT for a version newer than this daemon reads, -EBADMSG for
 * text that is no spec (why, in err), -ENOMEM. */
int sandbox_spec_decode(const char *text, int64_t version, SandboxSpec *ret, char *err, size_t err_len);

/* A sandbox as the store keeps it. Times are unix seconds; 0 stands for
 * none in the optional ones. */
typedef struct SandboxRow {
        char id[32];
        char *owner;
        char *key_id;
        char *name;   /* may be NULL */
        char *labels; /* a JSON object's text */
        SandboxSpec spec;
        SandboxState state;
        char *failure_reason; /* may be NULL */
        int64_t created_at, started_at, stopped_at, lease_ends_at, run_seconds, deleted_at;
        /* The millisecond (0..999) within created_at's and started_at's
         * second, which the list's order and the API's times carry; 0 in
         * rows written before they were kept. */
        int created_msec, started_msec;
        bool run_as_root; /* requests that name no user run as root, not the sandbox user */
        char host_id[64]; /* the host whose drivers run it ("" in rows of before hosts) */
        int64_t version;  /* the store's: each write bumps it; a write of a stale one is refused */
} SandboxRow;

void sandbox_row_done(SandboxRow *r);
