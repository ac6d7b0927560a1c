#pragma once
/*
 * What the daemon and its egress proxy process (runtime-egress) say to each
 * other. The proxy parses what sandboxes send and holds the CA key; it runs
 * without root, without capabilities and without the key database, so the
 * daemon hands it, per connection, only what that connection needs:
 *
 *   control socket (SOCK_SEQPACKET, one per proxy process): at start the
 *   proxy sends {"ca": PEM}; then the daemon sends, per connection, one
 *   byte with two descriptors (SCM_RIGHTS): `data`, the sandbox's bytes
 *   both ways, and `meta`.
 *
 *   meta (SOCK_STREAM): the daemon writes one message, the connection's
 *   settings {"sandbox", "network", "trial", "secrets": [...]}; the proxy
 *   answers a decision record ("type": "decision") as soon as it decides,
 *   before a byte goes upstream or a refusal to the sandbox (and another
 *   when a later step refuses what was allowed), and one end record ("type":
 *   "end", with the byte counts, the duration and why it ended) when the
 *   connection ends. The daemon writes the audit entry on the decision and
 *   completes the same entry with the end.
 *
 * A message is a 4-byte big-endian length and that much JSON. Each side
 * treats the other's messages as hostile: lengths, depths and fields are
 * bounded.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "egress/proxy.h"
#include "egress/secret.h"

#define EGRESS_WIRE_MAX_SETTINGS (8u * 1024u * 1024u)
#define EGRESS_WIRE_MAX_RECORD (16u * 1024u)
#define EGRESS_WIRE_MAX_HELLO 65536u

/* One message on a stream socket. -ETIMEDOUT after timeout_ms in all (< 0:
 * no limit), -EPIPE on a closed peer, -EBADMSG for a length over max or
 * JSON that does not parse (or nests deeper than 32). */
int egress_wire_write(int fd, const json_t *msg, int timeout_ms);
int egress_wire_read(int fd, size_t max, int timeout_ms, json_t **ret);

/* The two descriptors of a connection over the control socket. */
int egress_wire_send_conn(int ctl, int data, int meta);
/* 0 with both set, -EPIPE when the peer closed, -EBADMSG for a message
 * without exactly two descriptors (any received are closed). */
int egress_wire_recv_conn(int ctl, int *ret_data, int *ret_meta);

typedef enum EgressWireKind {
        EGRESS_WIRE_DECISION,
        EGRESS_WIRE_END,
} EgressWireKind;

/* At most this many records per connection: a decision, a later refusal
 * of what was allowed, the end, and room to spare. A proxy that sends more
 * is lying, and its connection is ended. */
#define EGRESS_WIRE_MAX_RECORDS 8

/* The audit record both ways. `decided_us` (decisions only; 0 otherwise) is
 * the proxy's CLOCK_MONOTONIC in microseconds at the decision, which the
 * daemon only measures with. From JSON, every field is checked and bounded;
 * -EBADMSG otherwise. */
json_t *egress_wire_record_json(const EgressRecord *rec, EgressWireKind kind, uint64_t decided_us);
int egress_wire_record_parse(const json_t *j, EgressRecord *ret, EgressWireKind *ret_kind, uint64_t *ret_decided_us);

/* A secret as the daemon stores it: {"name", "value", "hosts" (JSON array
 * as text), "placeholder", "header", "format", "rules" (JSON as text)}. A
 * secret that does not parse is left out, as it never reaches a request. */
int egress_wire_secrets_parse(const json_t *arr, EgressSecret **ret, size_t *ret_n);
void egress_wire_secrets_free(EgressSecret *s, size_t n);
/* json_decref for a connection's settings, the secret values zeroed first
 * (when nothing else holds them). */
void egress_wire_settings_free(json_t *settings);
