#include "common/jsonutil.h"

#include <stdint.h>

#include "common/timeutil.h"

bool json_depth_ok(const void *buf, size_t len, unsigned max) {
        const uint8_t *p = buf;
        unsigned depth = 0;
        bool in_string = false, escaped = false;
        for (size_t i = 0; i < len; i++) {
                uint8_t ch = p[i];
                if (in_string) {
                        if (escaped)
                                escaped = false;
                        else if (ch == '\\')
                                escaped = true;
                        else if (ch == '"')
                                in_string = false;
                        continue;
                }
                if (ch == '"')
                        in_string = true;
                else if (ch == '[' || ch == '{') {
                        if (++depth > max)
                                return false;
                } else if ((ch == ']' || ch == '}') && depth > 0)
                        depth--;
        }
        return true;
}

json_t *json_time_or_null(int64_t t) {
        char buf[RFC3339_LEN];
        if (!t || time_format_rfc3339(t, buf) < 0)
                return json_null();
        return json_string(buf);
}

json_t *json_time_ms_or_null(int64_t t, int msec) {
        char buf[RFC3339_MS_LEN];
        if (!t || time_format_rfc3339_ms(t, msec, buf) < 0)
                return json_null();
        return json_string(buf);
}
