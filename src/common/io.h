#pragma once
/* Whole-buffer I/O over one descriptor, for every component (the agent
 * links this too: libc only). */
#include <stdbool.h>
#include <stddef.h>

/* Writes all n bytes, again after a short write or EINTR. 0, or a negative
 * errno (-EIO when the kernel takes nothing). */
int io_write_all(int fd, const void *buf, size_t n);
/* io_write_all for a descriptor that may be a socket: there a peer that went
 * away is -EPIPE rather than a SIGPIPE (MSG_NOSIGNAL); on anything else it
 * writes as io_write_all does. */
int io_send_all(int fd, const void *buf, size_t n);
/* Copies the regular file in to out (both open, out for writing and empty).
 * Where their filesystem can share blocks (FICLONE: XFS with reflink, btrfs)
 * out becomes a clone of in, sharing every extent; where it refuses, out is
 * truncated to in's size and written from in's data extents only, so that
 * its holes stay holes. Does not sync. 0 or a negative errno (-ENOSPC from a
 * full filesystem either way). */
int io_copy_sparse(int in, int out);
/* Whether files in the directory dir can share blocks (FICLONE of one
 * unnamed file into another there): 0, or the negative errno of the refusal
 * (-EOPNOTSUPP on a filesystem without reflink). Leaves nothing behind. */
int io_clone_probe(const char *dir);
/* Reads from fd until end of file or until cap bytes are in buf, again after
 * a short read or EINTR; *ret_len says how many. 0 or a negative errno. A
 * caller that must tell "exactly cap" from "more than cap" passes cap + 1. */
int io_read_full(int fd, void *buf, size_t cap, size_t *ret_len);
/* Reads a small text file (a stamp, /proc/cmdline) into buf as one string:
 * at most len - 1 bytes, trailing newlines and spaces dropped. 0 or a
 * negative errno. */
int io_read_text(const char *path, char *buf, size_t len);
/* Writes text as the whole of the file name under dfd, made with mode
 * (never following a symbolic link; O_EXCL with excl, else truncated), and
 * syncs it: a small record (a key, a snapshot's description) that must be
 * on disk before what depends on it is. 0 or a negative errno. */
int io_write_text_at(int dfd, const char *name, const char *text, bool excl, unsigned mode);
/* Writes value, in one write, into the existing control file dir/name (a
 * cgroupfs knob): never created (a missing file means the kernel lacks the
 * knob, and a plain file would hide that), never through a symbolic link.
 * 0, -ENOENT for a NULL dir, -EIO for a short write, or a negative errno. */
int io_write_knob(const char *dir, const char *name, const char *value);
