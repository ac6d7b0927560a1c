#pragma once
/*
 * A small tar reader and writer for the agent's archive ops (docs/api.md,
 * "Archives"): ustar with the pax ('x') and GNU long-name ('L', 'K') headers
 * that Python's tarfile and GNU tar write. Not a general tar: the reader
 * takes regular files, directories, symbolic links and hard links, and
 * refuses everything else; it never writes outside the directory it is
 * given (no absolute names, no "..", no write through a link, links that
 * lead out refused), and it is bounded in bytes, entries and header sizes.
 * Why not libarchive: docs/api.md says (a static agent would carry its
 * whole set of formats and the libraries they need).
 *
 * The reader is fed bytes as they come, so it runs in a bounded buffer
 * whatever the archive's size; tests/fuzz/fuzz_tar.c drives it.
 * Functions return 0 or a negative errno: -EBADMSG for a malformed archive,
 * -EPERM for a member refused, -EFBIG past a bound; tar_extract_error says
 * which and why.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TarLimits {
        uint64_t max_bytes;   /* of file contents in all */
        uint64_t max_entries; /* members, links and directories included */
} TarLimits;

typedef struct TarExtract TarExtract;

/* Extracts into the directory root_fd (not taken); existing files are
 * replaced, existing directories merged. */
int tar_extract_new(int root_fd, const TarLimits *lim, TarExtract **ret);
int tar_extract_feed(TarExtract *x, const uint8_t *buf, size_t n);
/* The end: the archive must have ended (two zero blocks, or at least one
 * and nothing after); then its symbolic links are made, each checked to
 * stay inside. */
int tar_extract_finish(TarExtract *x);
const char *tar_extract_error(const TarExtract *x);
uint64_t tar_extract_entries(const TarExtract *x);
uint64_t tar_extract_bytes(const TarExtract *x);
void tar_extract_free(TarExtract *x);

/* Writes the tree under dir_fd as a tar to write_fn: "./" first, then each
 * entry as "./relative/path" (directories, regular files, symbolic links,
 * and hard links for a file seen before); sockets, FIFOs and devices are
 * left out. exclude holds relative paths whose entries (and all below) are
 * left out. */
typedef int (*TarWriteFn)(void *userdata, const void *buf, size_t n);
int tar_create(int dir_fd, const char *const *exclude, size_t n_exclude, TarWriteFn write_fn, void *userdata);

/* One member written to write_fn, for archives made in memory: a regular
 * file ('0') of mode with its len bytes, or a directory ('5', no data); no
 * owner, time 0; a name past 100 bytes in a pax header. tar_write_end
 * ends the archive. */
int tar_write_entry(TarWriteFn write_fn, void *userdata, const char *name, char type, unsigned mode, const void *data,
                    size_t len);
int tar_write_end(TarWriteFn write_fn, void *userdata);
