#pragma once
/*
 * runtimed's capabilities: it runs as root for its drivers, and keeps only
 * what it and the drivers it offers use (docs/drivers.md#capabilities).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A set of capabilities, bit n for capability n (linux/capability.h). */
typedef uint64_t CapSet;

/* What runtimed needs itself (the egress proxy's start, image builds, its
 * state), plus what each of the named drivers needs, plus
 * NET_BIND_SERVICE when it listens on a port under 1024. A driver the table
 * does not know keeps every capability a known driver uses. */
CapSet caps_needed(const char *const *drivers, size_t n_drivers, bool privileged_port);
/* What no driver and not runtimed itself ever uses. */
CapSet caps_never_needed(void);

/* Removes every capability outside `keep` from the bounding set (so that
 * nothing runtimed executes can gain it back) and from the permitted,
 * effective and inheritable sets. Capability sets are per thread: -EBUSY
 * when the process has more than one thread, before anything changed. */
int caps_keep_only(CapSet keep);

/* The names of the capabilities in `set`, comma-separated, for the log. */
void caps_format(CapSet set, char *out, size_t out_len);
