#pragma once
/* Paths and trees on the host's filesystem, for every component (libc
 * only). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* "a/b" into buf; -ENAMETOOLONG when it does not fit in len. */
int path_join(char *buf, size_t len, const char *a, const char *b);

/* Makes path's missing parents (0755) and path itself (0700), as `mkdir -p`
 * with a private last directory; an existing one is left as it is. */
int path_mkdir_private(const char *path);
/* Removes name under the directory dfd (AT_FDCWD: a path), a file or a whole
 * tree, without following a symbolic link and without crossing into another
 * filesystem (a mount inside is left, and the answer is -EBUSY). Nesting
 * deeper than 256 levels is -ELOOP. A name that does not exist is 0. It goes
 * on past a failure and returns the first. */
int path_remove_tree_at(int dfd, const char *name);

/* The same walk with its choices spelled out, for the files API (which stops
 * at the first failure and reports what it removed). */
typedef struct PathRemove {
        unsigned max_depth;       /* levels of directories below name */
        int mount_error;          /* what a mount inside answers (negative errno) */
        int depth_error;          /* what nesting past max_depth answers (negative errno) */
        bool stop_at_first_error; /* else go on past a failure and return the first */
        uint64_t removed;         /* out: files and directories removed */
} PathRemove;
/* Removes name under dfd as path_remove_tree_at does, with o's choices; a
 * name that does not exist is 0. -EINVAL for options that are not set. */
int path_remove_tree(int dfd, const char *name, PathRemove *o);
/* The directory of the running program's own executable (/proc/self/exe)
 * into buf: where its companion programs are looked for. -ENAMETOOLONG when
 * it does not fit, another negative errno when it cannot be read. */
int path_self_dir(char *buf, size_t len);
/* What tells one version of a file from another without reading it: its
 * device, inode, size and modification time, as "dev:ino:size:sec.nsec" into
 * buf (PATH_IDENTITY_MAX fits any). A saved machine records the identities of
 * the programs and images it depends on. A negative errno when path cannot
 * be stat'ed; -ENOBUFS when it does not fit in len. */
#define PATH_IDENTITY_MAX 96
int path_identity(const char *path, char *buf, size_t len);
