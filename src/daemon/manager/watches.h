#pragma once
/*
 * File watches (docs/api.md, "File watches"): a watch is one agent stream
 * (agent_req_watch) whose changes a thread of its own takes in as they come,
 * filtered, into a bounded queue that readers read by cursor. The cursor
 * counts entries since the watch began; a reader behind the queue's oldest
 * entry is told how many it lost, and the agent's own losses (the kernel's
 * queue, the descriptors' bound) are entries of the queue: nothing is
 * dropped without a notice. A watch ends when stopped, at its timeout, when
 * its path goes, or with its sandbox's channel. Kept in memory on the host
 * that runs the sandbox. Library code: logs nothing.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon/manager/sandbox.h"

/* Watches one sandbox may have, running or ended and not yet stopped. */
#define WATCHES_MAX_PER_SANDBOX 16u
/* An ended watch stays readable this long (its last changes and its end),
 * then goes: a deleted sandbox's watches do not stay in memory. */
#define WATCHES_KEEP_ENDED_MS (10 * 60 * 1000)
/* Entries (changes and notices) a watch keeps for its readers. */
#define WATCHES_MAX_QUEUED 10000u
/* Entries one read answers at most. */
#define WATCHES_MAX_READ 1000u
/* A watch's id: [A-Za-z0-9][A-Za-z0-9_.-]{0,62}, made ("w_" + 16 hex) or the client's. */
#define WATCH_ID_MAX 63
/* Globs in include and exclude, each, and a glob's length. */
#define WATCHES_MAX_GLOBS 64u
#define WATCHES_MAX_GLOB 256u
/* The timeout a watch has unless asked (an hour), and the longest (a day). */
#define WATCHES_DEFAULT_TIMEOUT_MS 3600000LL
#define WATCHES_MAX_TIMEOUT_MS 86400000LL

/* The kinds of change, as bits of WatchSpec.kinds. */
enum {
        WATCH_KIND_CREATE = 1u << 0,
        WATCH_KIND_WRITE = 1u << 1,
        WATCH_KIND_REMOVE = 1u << 2,
        WATCH_KIND_RENAME = 1u << 3,
        WATCH_KIND_CHMOD = 1u << 4,
        WATCH_KIND_ALL = 0x1fu,
};
/* The bit of a kind's name ("create"...), 0 for none. */
unsigned watch_kind_bit(const char *name);

typedef struct WatchSpec {
        char id[WATCH_ID_MAX + 1]; /* "": made */
        char *path;                /* absolute */
        bool recursive;
        unsigned max_watches; /* inotify descriptors; 0: the agent's default */
        unsigned kinds;       /* WATCH_KIND_* bits */
        int64_t timeout_ms;   /* 0: until stopped */
        int64_t batch_ms;     /* a followed read sends the changes of this long together */
        json_t *include, *exclude; /* arrays of globs, or NULL */
} WatchSpec;
void watch_spec_done(WatchSpec *s);

typedef struct WatchTable WatchTable;
typedef struct Watch Watch;

WatchTable *watch_table_new(void);
/* Stops every watch and frees them. NULL is fine. */
void watch_table_free(WatchTable *t);

bool watch_id_ok(const char *s);

/* Starts a watch on sb (the caller's reference is kept by the watch on
 * success, left to the caller on failure) with the agent request areq.
 * 0 and *ret (a reference: watch_unref); -EEXIST for an id in use on the
 * sandbox; -EUSERS past WATCHES_MAX_PER_SANDBOX; -EPROTO when the agent
 * refused (*ret_result its RESULT, a new reference, for the caller to map);
 * else a negative value with e filled. */
int watch_start(WatchTable *t, Sandbox *sb, json_t *areq, const WatchSpec *spec, Watch **ret, json_t **ret_result,
                SandboxError *e);
/* A watch of the owner's sandbox, with a reference; NULL when none. */
Watch *watch_find(WatchTable *t, const char *owner, const char *sandbox_id, const char *id);
void watch_unref(Watch *w);
int64_t watch_batch_ms(const Watch *w);
/* Stops the watch (its agent stream cancelled) and forgets it. */
void watch_stop(WatchTable *t, Watch *w);
/* The API's object of a watch: {id, path, recursive, cursor, running, endReason, ...}. */
json_t *watch_json(Watch *w);
/* The watches of the owner's sandbox as a JSON array. */
json_t *watch_list(WatchTable *t, const char *owner, const char *sandbox_id);

/* What a read from cursor gives: events, notices (overflow, limit, lost),
 * the next cursor, and whether the watch has ended with every entry read
 * (reason then names why). Waits up to wait_ms for something. */
typedef struct WatchRead {
        json_t *events;  /* array */
        json_t *notices; /* array */
        uint64_t next;
        bool ended;
        char reason[32];
} WatchRead;
int watch_read(Watch *w, uint64_t cursor, int wait_ms, WatchRead *ret);
void watch_read_done(WatchRead *r);
