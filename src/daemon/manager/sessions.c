#include "daemon/manager/sessions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "common/random.h"
#include "daemon/model/auth.h"

struct Sessions {
        const StoreSessionOps *ops;
        StoreSessions *h;
};

int sessions_open(const StoreBackend *b, const char *location, Sessions **ret) {
        if (!b->sessions)
                return -EOPNOTSUPP;
        Sessions *s = calloc(1, sizeof(*s));
        if (!s)
                return -ENOMEM;
        s->ops = b->sessions;
        int r = s->ops->open(location, &s->h);
        if (r < 0) {
                free(s);
                return r;
        }
        *ret = s;
        return 0;
}

void sessions_close(Sessions *s) {
        if (!s)
                return;
        s->ops->close(s->h);
        free(s);
}

int sessions_set_epoch(Sessions *s, const char *host_id, int64_t epoch) {
        return s->ops->set_writer(s->h, host_id, epoch);
}

static bool lower_hex(const char *p, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
                        return false;
        return true;
}

bool session_token_format_ok(const char *token) {
        size_t pl = strlen(SESSION_TOKEN_PREFIX);
        return token && strlen(token) == SESSION_TOKEN_LEN && strncmp(token, SESSION_TOKEN_PREFIX, pl) == 0 &&
               lower_hex(token + pl, SESSION_TOKEN_LEN - pl);
}

bool session_origin_ok(const char *origin, size_t len) {
        const char *p = origin, *end = origin + len;
        if (len == 0 || len > SESSION_ORIGIN_MAX || memchr(origin, '\0', len))
                return false;
        if (len > 8 && strncmp(p, "https://", 8) == 0)
                p += 8;
        else if (len > 7 && strncmp(p, "http://", 7) == 0)
                p += 7;
        else
                return false;
        const char *host = p;
        if (*p == '[') {
                while (p < end && *p != ']')
                        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f') || *p == ':' || *p == '.' ||
                              *p == '['))
                                return false;
                        else
                                p++;
                if (p == end)
                        return false;
                p++;
        } else {
                while (p < end && ((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
                        p++;
                if (p == host || *host == '.' || *host == '-')
                        return false;
        }
        if (p < end && *p == ':') {
                const char *digits = ++p;
                while (p < end && *p >= '0' && *p <= '9')
                        p++;
                if (p == digits || p - digits > 5 || atoi(digits) < 1 || atoi(digits) > 65535)
                        return false;
        }
        return p == end;
}

bool session_origin_listed(const char *origins, const char *origin) {
        size_t n = strlen(origin);
        for (const char *p = origins; p && *p;) {
                const char *nl = strchr(p, '\n');
                size_t len = nl ? (size_t)(nl - p) : strlen(p);
                if (len == n && memcmp(p, origin, n) == 0)
                        return true;
                p = nl ? nl + 1 : NULL;
        }
        return false;
}

bool session_active(const StoreSession *row, int64_t now) {
        return row->revoked_at == 0 && now < row->expires_at;
}

int sessions_create(Sessions *s, const char *sandbox_id, const char *owner, const char *key_hash, const char *name,
                    int64_t ttl, const char *origins, int64_t now, char ret_token[SESSION_TOKEN_LEN + 1],
                    StoreSession *ret) {
        int64_t active = 0;
        int r = s->ops->count_active(s->h, sandbox_id, now, &active);
        if (r < 0)
                return r;
        if (active >= SESSIONS_MAX_ACTIVE)
                return -EUSERS;
        StoreSession row = { .created_at = now, .expires_at = now + ttl };
        char token[SESSION_TOKEN_LEN + 1];
        size_t pl = strlen(SESSION_TOKEN_PREFIX);
        memcpy(token, SESSION_TOKEN_PREFIX, pl);
        memcpy(row.id, "ses_", 4);
        if ((r = random_hex(token + pl, (SESSION_TOKEN_LEN - pl) / 2)) < 0 || (r = random_hex(row.id + 4, 10)) < 0)
                return r;
        if (auth_hash_key(token, row.token_hash) < 0)
                return -EIO;
        snprintf(row.sandbox_id, sizeof row.sandbox_id, "%s", sandbox_id);
        snprintf(row.owner, sizeof row.owner, "%s", owner);
        snprintf(row.key_hash, sizeof row.key_hash, "%s", key_hash);
        snprintf(row.name, sizeof row.name, "%s", name ? name : "");
        snprintf(row.origins, sizeof row.origins, "%s", origins ? origins : "");
        if ((r = s->ops->insert(s->h, &row)) < 0) {
                explicit_bzero(token, sizeof token);
                return r;
        }
        memcpy(ret_token, token, sizeof token);
        explicit_bzero(token, sizeof token);
        *ret = row;
        return 0;
}

int sessions_by_token(Sessions *s, const char *token, int64_t now, StoreSession *ret) {
        char hash[AUTH_HASH_HEX_LEN + 1];
        if (!session_token_format_ok(token) || auth_hash_key(token, hash) < 0)
                return -ENOENT;
        StoreSession row;
        int r = s->ops->by_token(s->h, hash, &row);
        if (r < 0)
                return r;
        /* The lookup was by the hash; compared again in constant time, as keys are. */
        if (!auth_hash_equal(row.token_hash, hash))
                return -ENOENT;
        if (row.revoked_at)
                return -EKEYREVOKED;
        if (now >= row.expires_at)
                return -EKEYEXPIRED;
        *ret = row;
        return 0;
}

int sessions_list(Sessions *s, const char *sandbox_id, const char *owner, int64_t now, StoreSession **ret,
                  size_t *ret_n) {
        return s->ops->list(s->h, sandbox_id, owner, now - SESSIONS_LISTED_AFTER_END, SESSIONS_MAX_LISTED, ret,
                            ret_n);
}

int sessions_revoke(Sessions *s, const char *id, const char *sandbox_id, const char *owner, int64_t now,
                    StoreSession *ret) {
        return s->ops->revoke(s->h, id, sandbox_id, owner, now, ret);
}
