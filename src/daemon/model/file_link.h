#pragma once
/*
 * Signed file links (docs/api.md, "File links"): a URL that downloads or
 * uploads one path of one sandbox without an API key. Everything a link may
 * do is in its query and signed with HMAC-SHA256 under the sandbox's link
 * secret: the sandbox, the operation (download, archive or upload: the
 * method), the path, the expiry, the link's id (a random nonce, and the
 * record of a one-time link's use), whether it is one-time, whether it wakes
 * a paused sandbox, an upload's bound and a download's file name. Each field
 * goes into the signed text with its length before it, so that no two links
 * sign the same text. A new secret (revoke) ends every link made before it.
 * Pure: logs nothing, keeps nothing.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define FILE_LINK_SECRET_LEN 32
#define FILE_LINK_SECRET_HEX_LEN 64
#define FILE_LINK_ID_LEN 20 /* "lnk_" + 16 hex: 64 random bits */
#define FILE_LINK_SIG_HEX_LEN 64
/* A link lives from 1 s to 7 days; an hour unless asked. */
#define FILE_LINK_TTL_MIN 1
#define FILE_LINK_TTL_MAX (7 * 86400)
#define FILE_LINK_TTL_DEFAULT 3600
#define FILE_LINK_FILENAME_MAX 255

typedef enum FileLinkOp {
        FILE_LINK_DOWNLOAD, /* GET .../files/content */
        FILE_LINK_ARCHIVE,  /* GET .../files/archive: a folder as .tar.gz */
        FILE_LINK_UPLOAD,   /* PUT .../files/content */
} FileLinkOp;

typedef struct FileLink {
        char sandbox_id[32];
        FileLinkOp op;
        const char *path; /* borrowed; path_len bytes, any byte but NUL */
        size_t path_len;
        int64_t expires_at; /* unix seconds */
        char id[FILE_LINK_ID_LEN + 1];
        bool once;
        bool wake;
        uint64_t max_bytes;   /* an upload's bound; 0: the daemon's */
        const char *filename; /* a download's name for the browser; NULL: none */
} FileLink;

const char *file_link_op_name(FileLinkOp op);
/* The query argument names a link carries, each at most once. */
bool file_link_arg_known(const char *name);
bool file_link_id_ok(const char *s);
/* A name a Content-Disposition header can carry as it is: 1..255 bytes of
 * printable ASCII, no quote, backslash or slash. */
bool file_link_filename_ok(const char *s);
int file_link_new_id(char ret[FILE_LINK_ID_LEN + 1]);
int file_link_new_secret(uint8_t ret[FILE_LINK_SECRET_LEN]);

/* The signature of l, 64 lowercase hex digits. 0, -EINVAL (a field out of
 * shape) or -EIO. */
int file_link_sign(const uint8_t secret[FILE_LINK_SECRET_LEN], const FileLink *l,
                   char ret[FILE_LINK_SIG_HEX_LEN + 1]);
/* Whether sig is l's signature under secret; compared in constant time. */
bool file_link_verify(const uint8_t secret[FILE_LINK_SECRET_LEN], const FileLink *l, const char *sig);

/* The query of a signed link (malloc'ed, without the '?'), its values
 * percent-encoded. 0, -EINVAL or -ENOMEM. */
int file_link_query(const FileLink *l, const char *sig, char **ret);

/* A link read back from its query arguments, one at a time (name and value
 * as the server decoded them). sig points into the value given. */
typedef struct FileLinkParse {
        FileLink link;
        const char *sig;
        unsigned seen; /* a bit per argument */
} FileLinkParse;

/* An empty parse: a link wakes a paused sandbox unless it says wake=0. */
void file_link_parse_init(FileLinkParse *p);
/* -EINVAL for an argument a link does not carry, one seen twice, or a value
 * out of shape. */
int file_link_parse_arg(FileLinkParse *p, const char *name, const char *value, size_t len);
/* After the last argument: -EINVAL unless path, expires, id and sig came. */
int file_link_parse_done(const FileLinkParse *p);
