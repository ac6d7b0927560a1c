#include "common/random.h"

#include <errno.h>
#include <stdint.h>
#include <sys/random.h>

int random_bytes(void *buf, size_t n) {
        uint8_t *p = buf;
        while (n > 0) {
                ssize_t r = getrandom(p, n, 0);
                if (r < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                p += r;
                n -= (size_t)r;
        }
        return 0;
}

void hex_encode(const void *buf, size_t n, char *out) {
        static const char digits[] = "0123456789abcdef";
        const uint8_t *p = buf;
        for (size_t i = 0; i < n; i++) {
                out[2 * i] = digits[p[i] >> 4];
                out[2 * i + 1] = digits[p[i] & 0xf];
        }
        out[2 * n] = '\0';
}

int random_hex(char *out, size_t nbytes) {
        uint8_t buf[64];
        if (nbytes > sizeof(buf))
                return -EINVAL;
        int r = random_bytes(buf, nbytes);
        if (r < 0)
                return r;
        hex_encode(buf, nbytes, out);
        return 0;
}
