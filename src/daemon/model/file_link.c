#include "daemon/model/file_link.h"

#include <errno.h>
#include <inttypes.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/random.h"

/* The signed text's first field: a later format signs another, so that no
 * text of one is ever a text of the other. */
#define SIGNED_TAG "runtime-file-link-v1"

static const char *const op_names[] = {
        [FILE_LINK_DOWNLOAD] = "download",
        [FILE_LINK_ARCHIVE] = "archive",
        [FILE_LINK_UPLOAD] = "upload",
};

const char *file_link_op_name(FileLinkOp op) {
        return (size_t)op < sizeof(op_names) / sizeof(op_names[0]) ? op_names[op] : "download";
}

/* The arguments of a link's query, in the order file_link_query writes
 * them; the bit of each in FileLinkParse.seen is its index. */
static const char *const args[] = { "path", "expires", "id", "once", "wake", "maxBytes", "filename", "sig" };
enum { ARG_PATH, ARG_EXPIRES, ARG_ID, ARG_ONCE, ARG_WAKE, ARG_MAX_BYTES, ARG_FILENAME, ARG_SIG, N_ARGS };

static int arg_index(const char *name) {
        for (int i = 0; i < N_ARGS; i++)
                if (strcmp(name, args[i]) == 0)
                        return i;
        return -1;
}

bool file_link_arg_known(const char *name) {
        return name && arg_index(name) >= 0;
}

static bool hex_ok(const char *s, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false;
        return s[n] == '\0';
}

bool file_link_id_ok(const char *s) {
        return s && strncmp(s, "lnk_", 4) == 0 && strlen(s) == FILE_LINK_ID_LEN && hex_ok(s + 4, 16);
}

bool file_link_filename_ok(const char *s) {
        size_t n = s ? strlen(s) : 0;
        if (n == 0 || n > FILE_LINK_FILENAME_MAX)
                return false;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '/')
                        return false;
        }
        return true;
}

int file_link_new_id(char ret[FILE_LINK_ID_LEN + 1]) {
        char hex[17];
        int r = random_hex(hex, 8);
        if (r < 0)
                return r;
        snprintf(ret, FILE_LINK_ID_LEN + 1, "lnk_%s", hex);
        return 0;
}

int file_link_new_secret(uint8_t ret[FILE_LINK_SECRET_LEN]) {
        return random_bytes(ret, FILE_LINK_SECRET_LEN);
}

static bool link_ok(const FileLink *l) {
        return l->path && l->path_len > 0 && !memchr(l->path, '\0', l->path_len) && file_link_id_ok(l->id) &&
               l->sandbox_id[0] && (size_t)l->op < sizeof(op_names) / sizeof(op_names[0]) &&
               (!l->filename || file_link_filename_ok(l->filename));
}

/* One field of the signed text: its length, a colon, its bytes. */
static int put_field(EVP_MAC_CTX *c, const void *p, size_t n) {
        char len[24];
        int k = snprintf(len, sizeof len, "%zu:", n);
        return EVP_MAC_update(c, (const unsigned char *)len, (size_t)k) == 1 &&
               EVP_MAC_update(c, p, n) == 1 ? 0 : -EIO;
}

static int put_text(EVP_MAC_CTX *c, const char *s) {
        return put_field(c, s, strlen(s));
}

static int put_number(EVP_MAC_CTX *c, uint64_t v) {
        char buf[24];
        snprintf(buf, sizeof buf, "%" PRIu64, v);
        return put_text(c, buf);
}

static int mac(const uint8_t secret[FILE_LINK_SECRET_LEN], const FileLink *l, uint8_t out[32]) {
        if (!link_ok(l) || l->expires_at < 0)
                return -EINVAL;
        EVP_MAC *m = EVP_MAC_fetch(NULL, "HMAC", NULL);
        EVP_MAC_CTX *c = m ? EVP_MAC_CTX_new(m) : NULL;
        OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_END };
        size_t len = 0;
        int r = c && EVP_MAC_init(c, secret, FILE_LINK_SECRET_LEN, params) == 1 ? 0 : -EIO;
        if (r == 0)
                r = put_text(c, SIGNED_TAG);
        if (r == 0)
                r = put_text(c, l->sandbox_id);
        if (r == 0)
                r = put_text(c, file_link_op_name(l->op));
        if (r == 0)
                r = put_field(c, l->path, l->path_len);
        if (r == 0)
                r = put_number(c, (uint64_t)l->expires_at);
        if (r == 0)
                r = put_text(c, l->id);
        if (r == 0)
                r = put_number(c, l->once);
        if (r == 0)
                r = put_number(c, l->wake);
        if (r == 0)
                r = put_number(c, l->max_bytes);
        if (r == 0)
                r = put_text(c, l->filename ? l->filename : "");
        if (r == 0 && (EVP_MAC_final(c, out, &len, 32) != 1 || len != 32))
                r = -EIO;
        EVP_MAC_CTX_free(c);
        EVP_MAC_free(m);
        return r;
}

int file_link_sign(const uint8_t secret[FILE_LINK_SECRET_LEN], const FileLink *l,
                   char ret[FILE_LINK_SIG_HEX_LEN + 1]) {
        uint8_t out[32];
        int r = mac(secret, l, out);
        if (r < 0)
                return r;
        hex_encode(out, sizeof out, ret);
        return 0;
}

bool file_link_verify(const uint8_t secret[FILE_LINK_SECRET_LEN], const FileLink *l, const char *sig) {
        char want[FILE_LINK_SIG_HEX_LEN + 1];
        if (!sig || strlen(sig) != FILE_LINK_SIG_HEX_LEN || file_link_sign(secret, l, want) < 0)
                return false;
        return CRYPTO_memcmp(want, sig, FILE_LINK_SIG_HEX_LEN) == 0;
}

static void put_encoded(FILE *f, const char *s, size_t n) {
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)s[i];
                if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
                    c == '_' || c == '.' || c == '~' || c == '/')
                        fputc(c, f);
                else
                        fprintf(f, "%%%02X", c);
        }
}

int file_link_query(const FileLink *l, const char *sig, char **ret) {
        if (!link_ok(l) || !sig)
                return -EINVAL;
        char *buf = NULL;
        size_t size = 0;
        FILE *f = open_memstream(&buf, &size);
        if (!f)
                return -ENOMEM;
        fputs("path=", f);
        put_encoded(f, l->path, l->path_len);
        fprintf(f, "&expires=%" PRId64 "&id=%s", l->expires_at, l->id);
        if (l->once)
                fputs("&once=1", f);
        if (!l->wake)
                fputs("&wake=0", f);
        if (l->max_bytes)
                fprintf(f, "&maxBytes=%" PRIu64, l->max_bytes);
        if (l->filename) {
                fputs("&filename=", f);
                put_encoded(f, l->filename, strlen(l->filename));
        }
        fprintf(f, "&sig=%s", sig);
        if (fclose(f) != 0) {
                free(buf);
                return -ENOMEM;
        }
        *ret = buf;
        return 0;
}

/* A decimal integer of 1..19 digits, no sign, no leading zero. */
static int parse_u64(const char *v, size_t len, uint64_t *ret) {
        if (len == 0 || len > 19 || (v[0] == '0' && len > 1))
                return -EINVAL;
        uint64_t n = 0;
        for (size_t i = 0; i < len; i++) {
                if (v[i] < '0' || v[i] > '9')
                        return -EINVAL;
                n = n * 10 + (uint64_t)(v[i] - '0');
        }
        *ret = n;
        return 0;
}

static int parse_flag(const char *v, size_t len, bool *ret) {
        if (len != 1 || (v[0] != '0' && v[0] != '1'))
                return -EINVAL;
        *ret = v[0] == '1';
        return 0;
}

void file_link_parse_init(FileLinkParse *p) {
        *p = (FileLinkParse){ .link = { .wake = true } };
}

int file_link_parse_arg(FileLinkParse *p, const char *name, const char *value, size_t len) {
        int i = name ? arg_index(name) : -1;
        if (i < 0 || (p->seen & (1u << i)) || !value || (i != ARG_PATH && memchr(value, '\0', len)))
                return -EINVAL;
        p->seen |= 1u << i;
        FileLink *l = &p->link;
        uint64_t n = 0;
        switch (i) {
        case ARG_PATH:
                if (len == 0 || memchr(value, '\0', len))
                        return -EINVAL;
                l->path = value;
                l->path_len = len;
                return 0;
        case ARG_EXPIRES:
                if (parse_u64(value, len, &n) < 0 || n > INT64_MAX)
                        return -EINVAL;
                l->expires_at = (int64_t)n;
                return 0;
        case ARG_ID:
                if (len != FILE_LINK_ID_LEN || !file_link_id_ok(value))
                        return -EINVAL;
                memcpy(l->id, value, FILE_LINK_ID_LEN + 1);
                return 0;
        case ARG_ONCE:
                return parse_flag(value, len, &l->once);
        case ARG_WAKE:
                return parse_flag(value, len, &l->wake);
        case ARG_MAX_BYTES:
                if (parse_u64(value, len, &n) < 0 || n == 0)
                        return -EINVAL;
                l->max_bytes = n;
                return 0;
        case ARG_FILENAME:
                if (!file_link_filename_ok(value))
                        return -EINVAL;
                l->filename = value;
                return 0;
        default:
                if (len != FILE_LINK_SIG_HEX_LEN || !hex_ok(value, len))
                        return -EINVAL;
                p->sig = value;
                return 0;
        }
}

int file_link_parse_done(const FileLinkParse *p) {
        unsigned need = (1u << ARG_PATH) | (1u << ARG_EXPIRES) | (1u << ARG_ID) | (1u << ARG_SIG);
        return (p->seen & need) == need ? 0 : -EINVAL;
}
