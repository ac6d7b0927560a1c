/* Arbitrary bytes through the parsers of the process routes: a spawn body,
 * a signal, a stdin write, an output cursor, an Idempotency-Key and the
 * routes under /processes. The first byte picks the parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/http/request.h"
#include "daemon/api/api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t which = data[0] % 6;
        size_t len = size - 1;
        char *text = malloc(len + 1);
        if (!text)
                return 0;
        memcpy(text, data + 1, len);
        text[len] = '\0';
        ApiError e = { 0 };
        json_t *body = NULL;

        if (which <= 2) {
                if (request_body_parse(text, len, true, &body, &e) == 0) {
                        if (which == 0) {
                                ExecRequest x;
                                if (request_parse_spawn(body, &x, &e) == 0)
                                        exec_request_done(&x);
                        } else if (which == 1) {
                                int sig;
                                (void)request_parse_signal(body, &sig, &e);
                        } else {
                                uint8_t *d = NULL;
                                size_t n;
                                int64_t off;
                                bool eof;
                                if (request_parse_proc_write(body, &d, &n, &off, &eof, &e) == 0)
                                        free(d);
                        }
                        json_decref(body);
                }
        } else if (which == 3) {
                uint64_t c;
                (void)request_parse_cursor(text, &c, &e);
        } else if (which == 4) {
                (void)request_idempotency_key_ok(text);
        } else {
                /* The text after a fixed sandbox prefix, with each method. */
                static const char *const methods[] = { "GET", "POST", "PUT", "DELETE" };
                char url[ROUTE_MAX_URL + 64];
                snprintf(url, sizeof(url), "/v1/sandboxes/sbx_0123456789abcdef0123/processes%s", text);
                for (size_t i = 0; i < 4; i++) {
                        Route r;
                        (void)route_parse(methods[i], url, &r);
                }
        }
        free(text);
        return 0;
}
