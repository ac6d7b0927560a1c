#include "agent/user.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/io.h"
#include "common/macro.h"

bool user_name_valid(const char *name) {
        size_t n = strlen(name);
        if (n == 0 || n > USER_NAME_MAX || !((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_'))
                return false;
        for (size_t i = 1; i < n; i++) {
                char c = name[i];
                if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
                        return false;
        }
        return true;
}

/* A decimal id of a passwd field: digits only, at most USER_ID_MAX. */
static int parse_id(const char *s, size_t len, unsigned *ret) {
        if (len == 0 || len > 5)
                return -ERANGE;
        unsigned v = 0;
        for (size_t i = 0; i < len; i++) {
                if (s[i] < '0' || s[i] > '9')
                        return -ERANGE;
                v = v * 10 + (unsigned)(s[i] - '0');
        }
        if (v > USER_ID_MAX)
                return -ERANGE;
        *ret = v;
        return 0;
}

int user_parse_passwd(const char *buf, size_t len, const char *name, AgentUser *ret) {
        size_t name_len = strlen(name);
        const char *p = buf, *end = buf + len;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *line_end = nl ? nl : end;
                /* name:password:uid:gid:gecos:home:shell */
                const char *f[7];
                size_t fl[7], n = 0;
                const char *q = p;
                while (n < 7) {
                        const char *c = memchr(q, ':', (size_t)(line_end - q));
                        const char *fe = c && n < 6 ? c : line_end;
                        f[n] = q;
                        fl[n] = (size_t)(fe - q);
                        n++;
                        if (fe == line_end)
                                break;
                        q = fe + 1;
                }
                if (n >= 6 && fl[0] == name_len && memcmp(f[0], name, name_len) == 0) {
                        AgentUser u = { 0 };
                        unsigned uid, gid;
                        if (parse_id(f[2], fl[2], &uid) < 0 || parse_id(f[3], fl[3], &gid) < 0)
                                return -ERANGE;
                        if (fl[5] == 0 || fl[5] >= sizeof(u.home) || f[5][0] != '/' || memchr(f[5], '\0', fl[5]))
                                return -ERANGE;
                        memcpy(u.name, name, name_len);
                        memcpy(u.home, f[5], fl[5]);
                        u.uid = uid;
                        u.gid = gid;
                        *ret = u;
                        return 0;
                }
                p = nl ? nl + 1 : end;
        }
        return -ENOENT;
}

int user_read_db(const char *path, char **ret, size_t *ret_len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return errno == ENOENT ? -ENOENT : -errno;
        struct stat st;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -ENOENT;
        size_t cap = st.st_size > 0 && (uint64_t)st.st_size < USER_PASSWD_MAX ? (size_t)st.st_size : USER_PASSWD_MAX;
        _cleanup_free_ char *buf = malloc(cap);
        if (!buf)
                return -ENOMEM;
        size_t len = 0;
        int r = io_read_full(fd, buf, cap, &len);
        if (r < 0)
                return r;
        *ret = TAKE_PTR(buf);
        *ret_len = len;
        return 0;
}

int user_lookup(const char *path, const char *name, AgentUser *ret) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0;
        int r = user_read_db(path, &buf, &len);
        if (r < 0)
                return r;
        return user_parse_passwd(buf, len, name, ret);
}

int user_enter(uid_t uid, gid_t gid) {
        /* Groups and gid while still root: neither is allowed after. */
        if (setgroups(1, &gid) < 0 || setresgid((gid_t)-1, gid, (gid_t)-1) < 0)
                goto fail;
        if (setresuid((uid_t)-1, uid, (uid_t)-1) < 0)
                goto fail;
        return 0;
fail: {
        int k = -errno;
        user_leave();
        return k;
}
}

void user_leave(void) {
        /* The effective uid first: root's capabilities come back with it,
         * and only they allow the rest. */
        (void)!setresuid((uid_t)-1, 0, (uid_t)-1);
        (void)!setresgid((gid_t)-1, 0, (gid_t)-1);
        (void)!setgroups(0, NULL);
}
