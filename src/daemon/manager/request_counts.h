#pragma once
/* The API answers counted per key and hour (docs/api.md, "GET
 * /v1/usage/requests"): each answer to a known key, at the host the client
 * asked, is counted in memory (a lock and a table of at most
 * REQUEST_COUNTS_PENDING_MAX keys and hours: nothing grows with the
 * traffic) and added to the store every REQUEST_COUNTS_FLUSH_SECONDS by a
 * thread of its own, and at the end. A key and hour that finds the table
 * full is not counted, and that is counted. */
#include <stdint.h>

#include "daemon/store/store_requests.h"

#define REQUEST_COUNTS_PENDING_MAX 1024
#define REQUEST_COUNTS_FLUSH_SECONDS 10
/* The longest range read back is 90 days: an hour older than this goes. */
#define REQUEST_COUNTS_RETENTION_DAYS 92

typedef struct RequestCounts RequestCounts;

/* The epoch this host registered at: the store's writes of request counts are made
 * only while the host is still registered at it and not declared dead. */
int request_counts_set_epoch(RequestCounts *r, const char *host_id, int64_t epoch);

int request_counts_open(const StoreBackend *b, const char *location, RequestCounts **ret);
/* Adds what is pending to the store, stops the thread, closes. */
void request_counts_close(RequestCounts *rc);
/* Counts one answer of `status` to key_id of owner, now. NULL rc: nothing. */
void request_counts_note(RequestCounts *rc, const char *owner, const char *key_id, unsigned status);
/* Adds what is pending to the store now (a reader sees its own calls). */
int request_counts_flush(RequestCounts *rc);
int request_counts_list(RequestCounts *rc, const char *owner, int64_t since, StoreRequestFn fn, void *userdata);
int request_counts_prune(RequestCounts *rc, int64_t days, int64_t *ret_n);
/* Answers not counted (the table full, or a write refused) since the start. */
uint64_t request_counts_lost(void);
