#pragma once
/*
 * File watches (docs/protocol.md, "watch"): one inotify instance per watch,
 * on a path and, when recursive, on every directory below it as it comes
 * and goes. The kernel's events become NDJSON lines the stream sends as
 * DATA, read only while the host gives credit; a reader that falls behind
 * makes the kernel's queue overflow, which is sent as a line of its own,
 * never dropped in silence.
 *
 * Lines: {"e":"create"|"write"|"remove"|"rename"|"chmod","p":PATH,"d":BOOL}
 * for a change, {"e":"overflow"} for the kernel's lost events, and
 * {"e":"limit","watches":N} when a directory could not be watched (the
 * watch's bound of descriptors, or the kernel's).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* inotify descriptors one watch may hold (one per directory of a recursive
 * watch): the default and the most a request may ask. */
#define WATCH_DEFAULT_DESCRIPTORS 8192u
#define WATCH_MAX_DESCRIPTORS 65536u
/* The longest line a change makes: a path of REQUEST_MAX_PATH bytes, each
 * escaped as \uXXXX at worst, and the members around it. */
#define WATCH_MAX_LINE (6u * (4096u + 256u) + 64u)

typedef struct AgentWatch AgentWatch;

typedef enum WatchEnd {
        WATCH_RUNNING,
        WATCH_ROOT_REMOVED, /* the watched path was deleted */
        WATCH_ROOT_MOVED,   /* or moved away: its events would name the wrong paths */
} WatchEnd;

/* Watches path (and, recursive, the directories below it, at most
 * max_descriptors) with the rights of the calling thread's effective user,
 * which later additions (new directories) take again: uid -1 is root.
 * 0 and *ret; -ENOENT, -EACCES, -ENOTDIR (a symlink's target is not
 * followed), -EMFILE or -ENOSPC (the kernel's bounds), -ENOMEM. */
int agent_watch_open(const char *path, bool recursive, unsigned max_descriptors, int64_t uid, int64_t gid,
                     AgentWatch **ret);
/* The inotify descriptor, to poll for POLLIN. */
int agent_watch_fd(const AgentWatch *w);
/* Reads what the kernel has (without blocking) and writes whole lines into
 * buf, at most cap bytes (cap >= WATCH_MAX_LINE): the bytes written, 0 for
 * none. Events read but not yet written wait for the next call. *ret_end
 * says when the watch has ended. -errno on a read error. */
ssize_t agent_watch_read(AgentWatch *w, char *buf, size_t cap, WatchEnd *ret_end);
/* Whether events read from the kernel wait for the next call. */
bool agent_watch_pending(const AgentWatch *w);
void agent_watch_free(AgentWatch *w);
