#pragma once
/*
 * File operations of the agent (docs/protocol.md: read, write, list, stat,
 * mkdir, remove, rename). Paths arrive validated by agent_request_parse (absolute,
 * bounded, no NUL). Every walk is relative to directory fds and never follows
 * a symlink where the operation is about the link itself.
 * Functions return 0 or a negative errno; fsops_error_code names it.
 */
#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "agent/user.h"

#define FSOPS_MAX_LIST_ENTRIES 10000
/* Deeper trees are refused by a recursive remove rather than risking the
 * agent's stack or its descriptor table. */
#define FSOPS_MAX_REMOVE_DEPTH 256

/* Protocol error code ("not_found", ...) for a negative errno. */
const char *fsops_error_code(int err);

int fsops_mkdir_p(const char *path, mode_t mode);

/* File names are arbitrary bytes but JSON text is UTF-8: a JSON string of
 * s with each byte that is not part of a valid sequence as U+FFFD. */
json_t *fsops_json_string_lossy(const char *s, size_t n);

/* The names an entry's "owner" and "group" show: the sandbox's own users
 * and groups, read per request (root inside may change them). Either table
 * may be NULL: every id then shows as its number. */
typedef struct FsNames {
        UserNames *users;
        UserNames *groups;
} FsNames;
/* Reads both files; a missing or unreadable one gives numbers. -ENOMEM. */
int fsops_names_load(const char *passwd, const char *group, FsNames *ret);
void fsops_names_done(FsNames *n);

/* An entry: path, name, type (file, dir, symlink, other), size, mode,
 * mtime, owner and group; a symlink's also target and targetType, the type
 * of what it leads to (file, dir, other), null when it leads nowhere (no
 * such file, a loop, a directory on the way the user may not search). The
 * link is followed as the agent sees the filesystem, which is the sandbox's
 * own root. names may be NULL. */
int fsops_stat(const char *path, const FsNames *names, json_t **ret_entry);
/* A walk visits at most this many entries whatever it returns: a glob that
 * matches nothing in a huge tree must still end, and the agent serves its
 * other streams only between operations. */
#define FSOPS_MAX_LIST_VISITS 200000
/* Segments of a glob pattern ("a/ ** /b" is three). */
#define FSOPS_MAX_GLOB_SEGMENTS 32
/* A listing is in order of name (bytewise), each directory followed by what
 * is in it, so a directory's names are read before any of them is listed.
 * Of one directory at most FSOPS_MAX_DIR_NAMES are kept, the smallest (with
 * no glob only as many as may still be listed; with one only names that
 * match or lead to directories to go into), and a walk keeps at most
 * FSOPS_MAX_HELD_NAMES across the directories it is in at once: at most
 * about 18 MiB with names of NAME_MAX bytes. A directory with more is
 * listed up to its last kept name, then the listing stops, truncated:
 * what it holds is always the start of the whole ordered listing. */
#define FSOPS_MAX_DIR_NAMES 16384
#define FSOPS_MAX_HELD_NAMES 65536
/* Names read (readdir, no stat) in one listing. A directory still being
 * read at this bound cannot be put in order: the listing stops before it,
 * truncated. */
#define FSOPS_MAX_LIST_NAMES 1000000

typedef struct FsListOptions {
        const char *path;
        unsigned depth;   /* levels below path; 0 with a glob: as deep as it reaches */
        const char *glob; /* relative to path, segments matched by fnmatch, "**" any run of them; NULL for all */
        bool hidden;      /* names starting with '.' too */
        unsigned limit;   /* at most this many entries (<= FSOPS_MAX_LIST_ENTRIES) */
        const FsNames *names; /* owners' and groups' names; NULL: numbers */
} FsListOptions;

/* Entries of a directory (and below, to a depth), those the glob matches
 * when there is one; *ret_truncated when the limit or the visit bound cut it. */
int fsops_list(const FsListOptions *o, json_t **ret_entries, bool *ret_truncated);
/* Whether a relative path matches a glob of segments; -EINVAL for a pattern
 * with too many segments. Exposed for the unit tests. */
int fsops_glob_match(const char *pattern, const char *relpath);
int fsops_mkdir(const char *path, bool parents);
/* *ret_count: the entries removed (a directory and all it held), 0 when
 * nothing was there: a missing path is not an error. */
int fsops_remove(const char *path, bool recursive, uint64_t *ret_count);
/* Without overwrite an existing target is -EEXIST. */
int fsops_rename(const char *from, const char *to, bool overwrite);

/* Opens a regular file for reading (non-blocking I/O is not needed for one). */
int fsops_open_read(const char *path, int *ret_fd, struct stat *ret_st);

/* An atomic write in progress: a temporary file next to the target. */
typedef struct FsWrite FsWrite;
int fsops_write_begin(const char *path, unsigned mode, bool mkdirs, FsWrite **ret);
int fsops_write_data(FsWrite *w, const void *buf, size_t n);
/* fsync, chmod, rename into place; frees w whatever the outcome. */
int fsops_write_commit(FsWrite *w, uint64_t *ret_size);
/* Removes the temporary file and frees w. NULL is fine. */
void fsops_write_abort(FsWrite *w);
