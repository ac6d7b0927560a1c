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

#define FSOPS_MAX_LIST_ENTRIES 10000
/* Deeper trees are refused by a recursive remove rather than risking the
 * agent's stack or its descriptor table. */
#define FSOPS_MAX_REMOVE_DEPTH 256

/* Protocol error code ("not_found", ...) for a negative errno. */
const char *fsops_error_code(int err);

int fsops_mkdir_p(const char *path, mode_t mode);
int fsops_stat(const char *path, json_t **ret_entry);
/* A walk visits at most this many entries whatever it returns: a glob that
 * matches nothing in a huge tree must still end, and the agent serves its
 * other streams only between operations. */
#define FSOPS_MAX_LIST_VISITS 200000
/* Segments of a glob pattern ("a/ ** /b" is three). */
#define FSOPS_MAX_GLOB_SEGMENTS 32

typedef struct FsListOptions {
        const char *path;
        unsigned depth;   /* levels below path; 0 with a glob: as deep as it reaches */
        const char *glob; /* relative to path, segments matched by fnmatch, "**" any run of them; NULL for all */
        bool hidden;      /* names starting with '.' too */
        unsigned limit;   /* at most this many entries (<= FSOPS_MAX_LIST_ENTRIES) */
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
