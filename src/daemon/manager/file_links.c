#include "daemon/manager/file_links.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"
#include "common/random.h"
#include "common/timeutil.h"

struct FileLinks {
        const StoreLinkOps *ops;
        StoreLinks *h;
        uint8_t key[SEAL_KEY_LEN];
};

int file_links_open(const StoreBackend *b, const char *location, const uint8_t seal_key[SEAL_KEY_LEN],
                    FileLinks **ret) {
        if (!b->links)
                return -EOPNOTSUPP;
        FileLinks *fl = calloc(1, sizeof(*fl));
        if (!fl)
                return -ENOMEM;
        fl->ops = b->links;
        memcpy(fl->key, seal_key, SEAL_KEY_LEN);
        int r = fl->ops->open(location, &fl->h);
        if (r < 0) {
                explicit_bzero(fl->key, sizeof fl->key);
                free(fl);
                return r;
        }
        *ret = fl;
        return 0;
}

void file_links_close(FileLinks *fl) {
        if (!fl)
                return;
        fl->ops->close(fl->h);
        explicit_bzero(fl->key, sizeof fl->key);
        free(fl);
}

int file_links_set_epoch(FileLinks *fl, const char *host_id, int64_t epoch) {
        return fl->ops->set_writer(fl->h, host_id, epoch);
}

/* What the seal binds a secret to: its sandbox. */
static void aad_of(const char *sandbox_id, char *buf, size_t n) {
        snprintf(buf, n, "file-link:%s", sandbox_id);
}

static int seal_new(FileLinks *fl, const char *sandbox_id, char **ret) {
        uint8_t secret[FILE_LINK_SECRET_LEN];
        char hex[FILE_LINK_SECRET_HEX_LEN + 1], aad[96];
        int r = file_link_new_secret(secret);
        if (r < 0)
                return r;
        hex_encode(secret, sizeof secret, hex);
        aad_of(sandbox_id, aad, sizeof aad);
        r = seal_encrypt(fl->key, aad, hex, ret);
        explicit_bzero(secret, sizeof secret);
        explicit_bzero(hex, sizeof hex);
        return r;
}

static int hex_nibble(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        return -1;
}

static int unseal(FileLinks *fl, const char *sandbox_id, const char *sealed, uint8_t ret[FILE_LINK_SECRET_LEN]) {
        char aad[96];
        _cleanup_free_ char *hex = NULL;
        aad_of(sandbox_id, aad, sizeof aad);
        int r = seal_decrypt(fl->key, aad, sealed, &hex);
        if (r < 0)
                return r;
        int bad = strlen(hex) != FILE_LINK_SECRET_HEX_LEN;
        for (size_t i = 0; !bad && i < FILE_LINK_SECRET_LEN; i++) {
                int hi = hex_nibble(hex[2 * i]), lo = hex_nibble(hex[2 * i + 1]);
                bad = hi < 0 || lo < 0;
                ret[i] = (uint8_t)(hi << 4 | lo);
        }
        explicit_bzero(hex, strlen(hex));
        return bad ? -EBADMSG : 0;
}

int file_links_secret(FileLinks *fl, const char *sandbox_id, const char *owner,
                      uint8_t ret[FILE_LINK_SECRET_LEN]) {
        StoreLinkSecret s = { 0 };
        int r = fl->ops->secret_get(fl->h, sandbox_id, &s);
        if (r == -ENOENT) {
                _cleanup_free_ char *sealed = NULL;
                if ((r = seal_new(fl, sandbox_id, &sealed)) < 0)
                        return r;
                r = fl->ops->secret_add(fl->h, sandbox_id, owner, sealed, time_now_unix(), &s);
        }
        if (r == 0)
                r = unseal(fl, sandbox_id, s.secret, ret);
        store_link_secret_clear(&s);
        return r;
}

int file_links_lookup(FileLinks *fl, const char *sandbox_id, uint8_t ret_secret[FILE_LINK_SECRET_LEN],
                      char *ret_owner, size_t owner_len) {
        StoreLinkSecret s = { 0 };
        int r = fl->ops->secret_get(fl->h, sandbox_id, &s);
        if (r == 0 && strlen(s.owner) >= owner_len)
                r = -ENAMETOOLONG;
        if (r == 0 && (r = unseal(fl, sandbox_id, s.secret, ret_secret)) == 0)
                snprintf(ret_owner, owner_len, "%s", s.owner);
        store_link_secret_clear(&s);
        return r;
}

int file_links_revoke(FileLinks *fl, const char *sandbox_id, const char *owner) {
        _cleanup_free_ char *sealed = NULL;
        int r = seal_new(fl, sandbox_id, &sealed);
        if (r < 0)
                return r;
        return fl->ops->secret_rotate(fl->h, sandbox_id, owner, sealed, time_now_unix());
}

int file_links_use_once(FileLinks *fl, const FileLink *l) {
        return fl->ops->use_once(fl->h, l->id, l->sandbox_id, l->expires_at, time_now_unix());
}
