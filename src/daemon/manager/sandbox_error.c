#include "daemon/manager/sandbox_error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

int sandbox_error(SandboxError *e, SandboxErrorKind kind, const char *hint, const char *fmt, ...) {
        va_list ap;
        e->kind = kind;
        va_start(ap, fmt);
        vsnprintf(e->message, sizeof(e->message), fmt, ap);
        va_end(ap);
        snprintf(e->hint, sizeof(e->hint), "%s", hint ? hint : "");
        return -EINVAL;
}
