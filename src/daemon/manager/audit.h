#pragma once
/* The audit trail (docs/api.md, "Audit"): what each key did, one record per
 * call that changes something (and per terminal or tunnel opened, and per
 * refusal of one), with who, what, where and the outcome; and the fleet's
 * own acts (a host declared dead). Recorded once the answer is sent, by a
 * writer thread of its own (the next call on the connection does not wait
 * for the store); a listing waits for what this host queued before it.
 * Recording never fails the call: a record the store refuses, or that finds
 * the writer's queue full (AUDIT_QUEUE_MAX), is logged and counted. Secrets
 * never enter it: a call's body is not kept, only what its handler names (a
 * command line, bounded) and the path it names. */
#include <stdint.h>

#include "daemon/store/store_audit.h"

#define AUDIT_LIST_DEFAULT 50
#define AUDIT_RETENTION_DAYS_DEFAULT 90
#define AUDIT_LIST_MAX 100
/* The longest text kept of one detail (a command line): the rest is cut and
 * the cut said. */
#define AUDIT_DETAIL_MAX 1024
/* Records waiting for the writer at most. */
#define AUDIT_QUEUE_MAX 10000
/* The nice value of the daemon's background writers (this one, the request
 * counts', the OpenTelemetry pushes): behind the threads that serve calls. */
#define AUDIT_WRITER_NICE 10

typedef struct Audit Audit;

/* The epoch this host registered at: the store's writes of audit entries are made
 * only while the host is still registered at it and not declared dead. */
int audit_set_epoch(Audit *a, const char *host_id, int64_t epoch);

int audit_open(const StoreBackend *b, const char *location, Audit **ret);
void audit_close(Audit *a);
/* The host the records are made on. */
void audit_set_host(Audit *a, const char *host_id);

/* Records rec; its id, host and time are set here (rec's at when not 0).
 * NULL a: nothing. */
void audit_record(Audit *a, AuditRecord *rec);
int audit_list(Audit *a, const AuditFilter *f, StoreAuditFn fn, void *userdata);
/* Drops what is older than days; how many went. */
int audit_prune(Audit *a, int64_t days, int64_t *ret_n);
/* Records not kept (the store refused them, or the queue was full) since
 * the start. */
uint64_t audit_dropped(void);
