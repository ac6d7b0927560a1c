/* Arbitrary bytes through the terminal's and the tunnel's parsers: WebSocket
 * frames from a client (wslay under our bounds, on no socket), the text
 * messages they carry, the route's query, a spawn's pty object, a handshake
 * key and a tunnel's frames. The first byte picks the parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/api/api_terminal.h"
#include "daemon/api/api_tunnel.h"
#include "daemon/http/request.h"
#include "daemon/http/websocket.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static size_t messages;

static void on_message(void *userdata, bool text, const uint8_t *msg, size_t len) {
        messages++;
        if (len > TERMINAL_MAX_MESSAGE)
                abort(); /* the bound is the point */
        unsigned cols, rows;
        if (text && terminal_parse_control(msg, len, &cols, &rows) == TERMINAL_CONTROL_RESIZE &&
            (cols < 1 || cols > REQ_MAX_PTY_SIDE || rows < 1 || rows > REQ_MAX_PTY_SIDE))
                abort();
}

/* Splits text at '\n' into up to n fields (NULL when absent or "-"). */
static void split(char *text, char **f, size_t n) {
        for (size_t i = 0; i < n; i++) {
                f[i] = text;
                if (text) {
                        char *nl = strchr(text, '\n');
                        if (nl)
                                *nl = '\0';
                        text = nl ? nl + 1 : NULL;
                }
                if (f[i] && strcmp(f[i], "-") == 0)
                        f[i] = NULL;
        }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t which = data[0] % 5;
        data++;
        size--;
        if (which == 4) {
                TunnelFrame f;
                if (tunnel_parse_frame(data, size, &f) == 0 &&
                    (f.stream == 0 || f.len != size - 5 || (f.kind == TUNNEL_OPEN && (f.port < 1 || f.port > 65535))))
                        abort();
                return 0;
        }
        if (which == 0) {
                WsConn *c = ws_conn_new(-1, TERMINAL_MAX_MESSAGE, on_message, NULL);
                if (!c)
                        return 0;
                /* In pieces, as a socket hands them out. */
                size_t at = 0;
                while (at < size) {
                        size_t n = (size - at) > 7 ? 1 + data[at] % 7 : size - at;
                        if (ws_conn_feed(c, data + at, n) < 0 || ws_conn_read(c) < 0)
                                break;
                        (void)ws_conn_write(c);
                        at += n;
                }
                (void)ws_conn_send(c, false, data, size > 100 ? 100 : size);
                (void)ws_conn_write(c);
                ws_conn_free(c);
                return 0;
        }
        char *text = malloc(size + 1);
        if (!text)
                return 0;
        memcpy(text, data, size);
        text[size] = '\0';
        if (which == 1) {
                unsigned cols, rows;
                (void)terminal_parse_control(data, size, &cols, &rows);
                char accept[29];
                (void)ws_accept_value(text, accept);
        } else if (which == 2) {
                char *f[7];
                split(text, f, 7);
                TerminalQuery q;
                ApiError e = { 0 };
                if (terminal_parse_query(f[0], f[1], f[2], f[2] ? strlen(f[2]) : 0, f[3], f[3] ? strlen(f[3]) : 0,
                                         f[4], f[5], &q, &e) == 0)
                        terminal_query_done(&q);
        } else {
                ApiError e = { 0 };
                json_t *body = NULL;
                if (request_body_parse(text, size, true, &body, &e) == 0) {
                        ExecRequest x;
                        if (request_parse_spawn(body, &x, &e) == 0)
                                exec_request_done(&x);
                        json_decref(body);
                }
        }
        free(text);
        return 0;
}
