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
/* Entries of `path` down to `depth` levels, at most FSOPS_MAX_LIST_ENTRIES. */
int fsops_list(const char *path, unsigned depth, json_t **ret_entries, bool *ret_truncated);
int fsops_mkdir(const char *path, bool parents);
int fsops_remove(const char *path, bool recursive);
int fsops_rename(const char *from, const char *to);

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
