#include "egress/secret.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SUBSTITUTED (64u * 1024u)

bool egress_secret_value_valid(const char *value, size_t len) {
        if (!value || len == 0 || len > EGRESS_SECRET_MAX_VALUE)
                return false;
        for (size_t i = 0; i < len; i++)
                if (value[i] == '\r' || value[i] == '\n' || value[i] == '\0')
                        return false;
        return true;
}

bool egress_secret_applies(const EgressSecret *s, const char *host, uint16_t port) {
        return s && s->hosts && egress_policy_check(s->hosts, host, port) == EGRESS_ALLOW;
}

bool egress_any_secret_applies(const EgressSecret *secrets, size_t n, const char *host, uint16_t port) {
        for (size_t i = 0; i < n; i++)
                if (egress_secret_applies(&secrets[i], host, port))
                        return true;
        return false;
}

int egress_substitute(const char *in, size_t len, const EgressSecret *secrets, size_t n, const char *host,
                      uint16_t port, char **ret, size_t *ret_len) {
        size_t cap = len + 1, out_len = 0;
        char *out = malloc(cap);
        if (!out)
                return -ENOMEM;
        int count = 0;
        size_t i = 0;
        while (i < len) {
                const EgressSecret *hit = NULL;
                /* Placeholders all start with the same prefix: cheap to skip. */
                if (in[i] == EGRESS_PLACEHOLDER_PREFIX[0])
                        for (size_t k = 0; k < n; k++) {
                                size_t pl = strlen(secrets[k].placeholder);
                                if (pl && pl <= len - i && memcmp(in + i, secrets[k].placeholder, pl) == 0 &&
                                    egress_secret_applies(&secrets[k], host, port)) {
                                        hit = &secrets[k];
                                        break;
                                }
                        }
                const char *piece = hit ? hit->value : in + i;
                size_t piece_len = hit ? strlen(hit->value) : 1;
                if (out_len + piece_len + 1 > cap) {
                        size_t ncap = cap * 2 + piece_len;
                        if (ncap > MAX_SUBSTITUTED + 1) {
                                free(out);
                                return -E2BIG;
                        }
                        char *np = realloc(out, ncap);
                        if (!np) {
                                free(out);
                                return -ENOMEM;
                        }
                        out = np;
                        cap = ncap;
                }
                memcpy(out + out_len, piece, piece_len);
                out_len += piece_len;
                i += hit ? strlen(hit->placeholder) : 1;
                count += hit ? 1 : 0;
        }
        out[out_len] = '\0';
        *ret = out;
        *ret_len = out_len;
        return count;
}
