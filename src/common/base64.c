#include "common/base64.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>

static int b64_value(unsigned char c) {
        if (c >= 'A' && c <= 'Z')
                return c - 'A';
        if (c >= 'a' && c <= 'z')
                return c - 'a' + 26;
        if (c >= '0' && c <= '9')
                return c - '0' + 52;
        if (c == '+')
                return 62;
        if (c == '/')
                return 63;
        return -1;
}

int base64_decode(const char *in, size_t len, size_t max, uint8_t **ret, size_t *ret_len) {
        if (len % 4 != 0)
                return -EINVAL;
        size_t out_len = len / 4 * 3;
        if (len > 0 && in[len - 1] == '=')
                out_len--;
        if (len > 1 && in[len - 2] == '=')
                out_len--;
        if (out_len > max)
                return -E2BIG;
        uint8_t *out = malloc(out_len ? out_len : 1);
        if (!out)
                return -ENOMEM;
        size_t o = 0;
        for (size_t i = 0; i < len; i += 4) {
                int v[4];
                bool last = i + 4 == len;
                for (int k = 0; k < 4; k++) {
                        unsigned char c = (unsigned char)in[i + k];
                        if (c == '=' && last && k >= 2 && (k == 3 || in[i + 3] == '='))
                                v[k] = -2;
                        else
                                v[k] = b64_value(c);
                        if (v[k] == -1) {
                                free(out);
                                return -EINVAL;
                        }
                }
                uint32_t w = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) |
                             ((uint32_t)(v[2] < 0 ? 0 : v[2]) << 6) | (uint32_t)(v[3] < 0 ? 0 : v[3]);
                out[o++] = (uint8_t)(w >> 16);
                if (v[2] >= 0)
                        out[o++] = (uint8_t)(w >> 8);
                if (v[3] >= 0)
                        out[o++] = (uint8_t)w;
        }
        *ret = out;
        *ret_len = o;
        return 0;
}
