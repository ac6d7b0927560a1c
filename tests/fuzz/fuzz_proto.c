/*
 * libFuzzer target for the channel: arbitrary bytes go through a ProtoReader
 * in uneven pieces; every frame's header must re-encode to the same bytes, and
 * every OPEN payload goes through the agent's request validation. The input is
 * also tried as a request on its own, which reaches the JSON checks faster.
 *
 * The fuzz rule links the daemon's sources; the agent's request parser is
 * pure code and is compiled in here.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "agent/request.c"
#include "agent/user.c"
#include "proto/proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_request(const uint8_t *p, size_t n) {
        AgentRequest *r = NULL;
        const char *msg = NULL;
        unsigned cols, rows;
        if (agent_request_parse_resize(p, n, &cols, &rows) == 0 &&
            (cols < 1 || cols > REQUEST_MAX_PTY_SIDE || rows < 1 || rows > REQUEST_MAX_PTY_SIDE))
                abort();
        if (agent_request_parse(p, n, &r, &msg) == 0) {
                if (!r)
                        abort();
                /* Whatever was accepted honours the limits. */
                if (r->path && !agent_request_path_valid(r->path, strlen(r->path)))
                        abort();
                if (r->to && !agent_request_path_valid(r->to, strlen(r->to)))
                        abort();
                if (r->op == REQ_EXEC &&
                    (r->argc == 0 || r->argc > REQUEST_MAX_ARGV || r->envc > REQUEST_MAX_ENV ||
                     !r->argv[0] || r->argv[r->argc] || !r->cwd))
                        abort();
                if (r->op == REQ_LIST && (r->depth < 1 || r->depth > REQUEST_MAX_LIST_DEPTH))
                        abort();
                if (r->user && !user_name_valid(r->user))
                        abort();
                agent_request_free(r);
        } else if (!msg || r) {
                abort();
        }
}

/* The same bytes as a sandbox's /etc/passwd, which root inside may write. */
static void check_passwd(const uint8_t *p, size_t n) {
        AgentUser u;
        if (user_parse_passwd((const char *)p, n, "sandbox", &u) == 0 &&
            (u.uid > USER_ID_MAX || u.gid > USER_ID_MAX || u.home[0] != '/' || strlen(u.home) >= sizeof(u.home)))
                abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        check_request(data, size);
        check_passwd(data, size);

        ProtoReader *r = proto_reader_new();
        if (!r)
                return 0;
        size_t off = 0;
        unsigned step = size ? (unsigned)data[0] % 64u + 1u : 1u;
        while (off < size) {
                size_t chunk = size - off < step ? size - off : step;
                if (proto_reader_feed(r, data + off, chunk) < 0)
                        break;
                off += chunk;
                step = step * 7u % 97u + 1u;
                ProtoHeader h;
                const uint8_t *p;
                int k;
                while ((k = proto_reader_next(r, &h, &p)) == 1) {
                        uint8_t enc[PROTO_HEADER_SIZE];
                        if (proto_header_encode(&h, enc) < 0)
                                abort(); /* decoded means valid */
                        ProtoHeader back;
                        if (proto_header_decode(enc, &back) < 0 || back.length != h.length ||
                            back.stream != h.stream || back.type != h.type || back.flags != h.flags)
                                abort();
                        if (h.type == PROTO_OPEN)
                                check_request(p, h.length);
                }
                if (k < 0)
                        break;
        }
        proto_reader_free(r);
        return 0;
}
