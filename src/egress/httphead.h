#pragma once
/*
 * The request a sandbox sends to its egress proxy: `CONNECT host:port` or a
 * plain-HTTP request in absolute form (`GET http://host/path HTTP/1.1`).
 * Parsing is done by http-parser (Debian's libhttp-parser); this module turns
 * its callbacks into one decision-ready head, and for plain HTTP tracks where
 * the one message ends, so that a second, pipelined request can never ride a
 * connection that was decided for another host.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define EGRESS_MAX_HEAD (16u * 1024u)
#define EGRESS_MAX_HEADERS 100u

typedef struct EgressHead {
        bool is_connect;
        char method[24];
        char host[256]; /* as written, without IPv6 brackets */
        uint16_t port;
        /* Plain HTTP only: the head to send upstream, in origin form, with
         * Host set to the URI's authority, hop-by-hop and Proxy-* headers
         * removed, and "Connection: close" (kept alive inside a tunnel). */
        char *forward;
        size_t forward_len;
} EgressHead;

typedef struct EgressParser EgressParser;

typedef enum EgressParse {
        EGRESS_PARSE_MORE = 0, /* every byte used; feed more */
        EGRESS_PARSE_HEAD = 1, /* the head is complete at *ret_used */
        EGRESS_PARSE_DONE = 2, /* the message is complete at *ret_used (plain HTTP) */
} EgressParse;

EgressParser *egress_parser_new(void);
/* For requests inside an intercepted tunnel to host:port: origin form
 * ("GET /path"), Host set to that authority, connections kept alive. */
EgressParser *egress_parser_new_tunnel(const char *host, uint16_t port);
void egress_parser_free(EgressParser *p);
/* Feeds bytes from the sandbox. Returns an EgressParse and the number of
 * bytes of buf it used in *ret_used, or -EINVAL (malformed; err says what),
 * -E2BIG (a head over EGRESS_MAX_HEAD or too many headers). After HEAD,
 * keep feeding the body of a plain-HTTP request to learn where it ends;
 * CONNECT has no body: everything after its head is tunnel data. */
int egress_parser_feed(EgressParser *p, const uint8_t *buf, size_t len, size_t *ret_used, char *err,
                       size_t err_len);
/* Valid once HEAD was returned. */
const EgressHead *egress_parser_head(const EgressParser *p);
