#pragma once
/*
 * The file links' secrets and one-time uses (docs/api.md, "File links";
 * model/file_link.h signs and reads the links themselves). Each sandbox's
 * secret is made at its first link, 32 random bytes kept sealed in the store
 * with the egress secrets' key (the sandbox's id as associated data, so that
 * a secret moved to another sandbox's row does not open), shared by every
 * host of a fleet, and replaced by a revoke. Library code: returns, logs
 * nothing.
 */
#include <stddef.h>
#include <stdint.h>

#include "daemon/egress/egress_seal.h"
#include "daemon/model/file_link.h"
#include "daemon/store/store_links.h"

typedef struct FileLinks FileLinks;

int file_links_open(const StoreBackend *b, const char *location, const uint8_t seal_key[SEAL_KEY_LEN],
                    FileLinks **ret);
void file_links_close(FileLinks *fl);
/* The epoch this host registered at: its writes are made only while it is
 * still registered at it and not declared dead. */
int file_links_set_epoch(FileLinks *fl, const char *host_id, int64_t epoch);
/* The sandbox's secret, made now if it has none yet. */
int file_links_secret(FileLinks *fl, const char *sandbox_id, const char *owner,
                      uint8_t ret[FILE_LINK_SECRET_LEN]);
/* The sandbox's secret and its owner (owner_len bytes of room) for a link
 * to check: -ENOENT when it never had a link, -EBADMSG when the sealed
 * value does not open. */
int file_links_lookup(FileLinks *fl, const char *sandbox_id, uint8_t ret_secret[FILE_LINK_SECRET_LEN],
                      char *ret_owner, size_t owner_len);
/* A new secret for the sandbox: every link made before ends. */
int file_links_revoke(FileLinks *fl, const char *sandbox_id, const char *owner);
/* The one use of a one-time link: 0, or -EALREADY when it was used. */
int file_links_use_once(FileLinks *fl, const FileLink *l);
