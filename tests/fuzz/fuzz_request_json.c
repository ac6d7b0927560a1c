/* Arbitrary bytes through the daemon's request parsers and validators: the
 * JSON bodies of create, exec, the file operations and the lifecycle's
 * transitions, paths, query values,
 * base64 and routes. The first byte picks the parser. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonutil.h"
#include "daemon/http/request.h"
#include "daemon/api/api.h"
#include "daemon/manager/images.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        uint8_t which = data[0] % 12;
        const char *text = (const char *)data + 1;
        size_t len = size - 1;
        ApiError e = { 0 };
        json_t *body = NULL;
        const ReqLimits lim = { 8, 16384, 65536 };

        if (which <= 6) {
                if (request_body_parse(text, len, true, &body, &e) < 0)
                        return 0;
                switch (which) {
                case 0: {
                        CreateRequest c;
                        if (request_parse_create(body, &lim, &c, &e) == 0)
                                create_request_done(&c);
                        break;
                }
                case 1: {
                        ExecRequest x;
                        if (request_parse_exec(body, &x, &e) == 0)
                                exec_request_done(&x);
                        break;
                }
                case 2: {
                        char *p = NULL;
                        bool f;
                        if (request_parse_mkdir(body, &p, &f, &e) == 0)
                                free(p);
                        if (request_parse_remove(body, &p, &f, &e) == 0)
                                free(p);
                        break;
                }
                case 3: {
                        char *a = NULL, *b = NULL;
                        bool ow;
                        if (request_parse_rename(body, &a, &b, &ow, &e) == 0) {
                                free(a);
                                free(b);
                        }
                        UpdateRequest u;
                        if (request_parse_update(body, &u, &e) == 0)
                                update_request_done(&u);
                        break;
                }
                case 4: {
                        int64_t s;
                        (void)request_parse_extend(body, &s, &e);
                        (void)request_parse_wake(body, &s, &e);
                        (void)request_parse_no_fields(body, &e);
                        break;
                }
                case 5: {
                        json_t *n = NULL;
                        if (request_parse_network(body, "network", &n, &e) == 0)
                                json_decref(n);
                        break;
                }
                default: {
                        /* Every parser on the same body. */
                        CreateRequest c;
                        ExecRequest x;
                        if (request_parse_create(body, &lim, &c, &e) == 0)
                                create_request_done(&c);
                        if (request_parse_exec(body, &x, &e) == 0)
                                exec_request_done(&x);
                        break;
                }
                }
                json_decref(body);
                return 0;
        }
        /* The rest want a C string. */
        char *s = malloc(len + 1);
        if (!s)
                return 0;
        memcpy(s, text, len);
        s[len] = '\0';
        switch (which) {
        case 7: {
                char *p = NULL;
                if (request_resolve_path(text, len, "path", &p, &e) == 0)
                        free(p);
                break;
        }
        case 8: {
                unsigned v;
                const char *state;
                int64_t ms;
                (void)request_parse_mode(s, &v, &e);
                (void)request_parse_depth(s, &v, &e);
                /* The state name and the bound of ?waitFor=, each as the whole text. */
                (void)request_parse_wait_for(s, NULL, &state, &ms, &e);
                (void)request_parse_wait_for("paused", s, &state, &ms, &e);
                break;
        }
        case 9: {
                uint8_t *out = NULL;
                size_t n;
                if (base64_decode(text, len, 1 << 20, &out, &n) == 0)
                        free(out);
                break;
        }
        case 10: {
                Route r;
                static const char *const methods[] = { "GET", "POST", "PUT", "DELETE" };
                for (size_t i = 0; i < 4; i++)
                        (void)route_parse(methods[i], s, &r);
                break;
        }
        default:
                (void)json_depth_ok(text, len, REQ_MAX_DEPTH);
                (void)image_name_ok(s);
                (void)request_env_name_ok(text, len);
                break;
        }
        free(s);
        return 0;
}
