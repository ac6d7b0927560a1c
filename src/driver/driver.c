#include "driver/driver.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* In `auto` order of preference: the strongest boundary first. */
static const Driver *const drivers[] = {
        &driver_microvm,
        &driver_gvisor,
        &driver_namespace,
        NULL,
};

const Driver *const *driver_all(void) {
        return drivers;
}

const Driver *driver_by_name(const char *name) {
        if (!name)
                return NULL;
        for (const Driver *const *d = drivers; *d; d++)
                if (strcmp((*d)->name, name) == 0)
                        return *d;
        return NULL;
}

const Driver *driver_pick_auto(char *why, size_t why_len) {
        size_t off = 0;
        if (why && why_len)
                why[0] = '\0';
        for (const Driver *const *d = drivers; *d; d++) {
                char reason[256] = "";
                int r = (*d)->probe(reason, sizeof reason);
                if (why && off < why_len) {
                        int n = snprintf(why + off, why_len - off, "%s%s: %s%s", off ? "; " : "", (*d)->name,
                                         r == 0 ? "" : r > 0 ? "on request only, " : "not usable, ",
                                         reason[0] ? reason : r < 0 ? strerror(-r) : "");
                        if (n > 0)
                                off += (size_t)n;
                }
                if (r == 0)
                        return *d;
        }
        return NULL;
}

void driver_error(DriverError *err, const char *fmt, ...) {
        if (!err || err->reason[0])
                return;
        va_list ap;
        va_start(ap, fmt);
        (void)vsnprintf(err->reason, sizeof err->reason, fmt, ap);
        va_end(ap);
}
