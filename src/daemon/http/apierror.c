#include "daemon/http/apierror.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int api_error(ApiError *e, int status, const char *code, const char *hint, const char *fmt, ...) {
        va_list ap;
        e->status = status;
        e->code = code;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof(e->message), fmt, ap);
        va_end(ap);
        snprintf(e->hint, sizeof(e->hint), "%s", hint ? hint : "");
        return -EINVAL;
}

json_t *api_error_json(const ApiError *e, const char *request_id) {
        /* Messages may quote client input: json_string refuses invalid UTF-8,
         * so fall back to a generic text rather than lose the error. */
        json_t *msg = json_string(e->message);
        if (!msg)
                msg = json_string("invalid request");
        json_t *hint = e->hint[0] ? json_string(e->hint) : json_null();
        if (!hint)
                hint = json_null();
        return json_pack("{s:{s:s,s:i,s:o,s:o,s:s}}", "error", "code", e->code ? e->code : "internal",
                         "status", e->status, "message", msg, "hint", hint, "requestId",
                         request_id ? request_id : "");
}
