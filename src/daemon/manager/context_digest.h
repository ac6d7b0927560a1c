#pragma once
/*
 * The digest of what a COPY or ADD takes from a build's context
 * (docs/images.md, "Per-step layers"), read by the daemon from the
 * context's archive as the client uploaded it: no sandbox, nothing of the
 * archive written anywhere.
 *
 * The archive is the client's and so hostile: a gzipped (or plain) tar,
 * bounded in entries and in the bytes its entries declare; names that are
 * absolute, hold "..", "." or empty components, or pass PATH_MAX are
 * refused, and so are members other than regular files, directories,
 * symbolic and hard links.
 *
 * A source is a path of the context as dockerfile_context_path cleans it
 * ("" is the whole context), each component a shell glob (`*`, `?`,
 * `[...]`; a leading dot matched only by a dot), as the copy's shell
 * matches it; an entry is taken when a source matches it or a directory
 * above it. A symbolic link a source goes through, or names when it leads
 * to a directory, is followed as the copy follows it (context_digest.c);
 * what it reaches is taken under the copy's name for it. The digest is
 * the SHA-256 of the taken entries in sorted order (by name, then by
 * their place in the archive), each as its name, type, mode, link target
 * and content, every field length-prefixed.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef struct ContextDigestLimits {
        uint64_t max_bytes;   /* the contents the entries declare, in all */
        uint64_t max_entries; /* members, directories and links included */
} ContextDigestLimits;

/* The archive's next bytes: their length with *ret_buf (valid until the
 * next call), 0 at its end, or a negative errno. */
typedef ssize_t (*ContextReadFn)(void *userdata, const void **ret_buf);

/* Whether source matches path (a cleaned path of the context) or a
 * directory above it. */
bool context_source_matches(const char *source, const char *path);

/* 0 with ret_hex; -EBADMSG (malformed), -EPERM (an entry refused), -EFBIG
 * (past a bound), -ENOMEM, or the reader's error; why says which. */
int context_digest(ContextReadFn read_fn, void *userdata, const char *const *sources, size_t n_sources,
                   const ContextDigestLimits *lim, char ret_hex[65], char *why, size_t why_len);
