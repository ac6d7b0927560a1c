/*
 * libFuzzer target for the digest of a COPY's sources read from a build
 * context's archive (src/daemon/manager/context_digest.c): the archive is
 * whatever a client uploads. The first byte sets the size of the pieces the
 * archive is fed in and which sources are matched; the rest is the archive
 * (gzipped or plain). Whatever the input, the reader must not crash, must
 * end within its small bounds here, and must answer with a digest or a
 * reason.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "daemon/manager/context_digest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct Feed {
        const uint8_t *p;
        size_t len, at, piece;
} Feed;

static ssize_t feed(void *userdata, const void **ret_buf) {
        Feed *f = userdata;
        size_t n = f->len - f->at < f->piece ? f->len - f->at : f->piece;
        *ret_buf = f->p + f->at;
        f->at += n;
        return (ssize_t)n;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size < 1)
                return 0;
        static const char *const sets[][3] = {
                { "", NULL, NULL }, { "a", "*.txt", NULL }, { "d/?", ".*", "x[" }, { "[a-c]*/b", "d", "l/*/e" },
        };
        const char *const *src = sets[data[0] & 3];
        size_t n = src[2] ? 3 : src[1] ? 2 : 1;
        Feed f = { .p = data + 1, .len = size - 1, .piece = 1 + (data[0] >> 2) * 37u };
        const ContextDigestLimits lim = { .max_bytes = 1u << 20, .max_entries = 64 };
        char hex[65], why[256];
        int r = context_digest(feed, &f, src, n, &lim, hex, why, sizeof why);
        if (r == 0 && strlen(hex) != 64)
                abort();
        if (r < 0 && !why[0])
                abort();
        return 0;
}
