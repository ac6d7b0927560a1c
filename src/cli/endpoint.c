#include "cli/endpoint.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/macro.h"

static bool has_control_or_space(const char *s) {
        for (; *s; s++) {
                unsigned char c = (unsigned char)*s;
                if (c <= 0x20 || c == 0x7f)
                        return true;
        }
        return false;
}

int endpoint_parse(const char *url, Endpoint *ret, char *err, size_t errlen) {
        _cleanup_free_ char *display = NULL, *base = NULL, *sock = NULL;
        const char *rest, *auth_end;
        size_t n;

        if (!url || !*url) {
                snprintf(err, errlen, "the daemon URL is empty");
                return -EINVAL;
        }
        n = strlen(url);
        if (n > CLI_URL_MAX) {
                snprintf(err, errlen, "the daemon URL is longer than %d bytes", CLI_URL_MAX);
                return -EINVAL;
        }
        if (strncmp(url, "unix:", 5) == 0) {
                const char *path = url + 5;
                struct sockaddr_un sa;

                /* "unix:///run/x.sock" is a common spelling of the same thing. */
                if (strncmp(path, "//", 2) == 0)
                        path += 2;
                if (!*path) {
                        snprintf(err, errlen, "'%s' names no socket; use unix:/path/to/socket", url);
                        return -EINVAL;
                }
                if (strlen(path) >= sizeof(sa.sun_path)) {
                        snprintf(err, errlen, "the socket path is longer than %zu bytes",
                                 sizeof(sa.sun_path) - 1);
                        return -EINVAL;
                }
                for (const char *p = path; *p; p++)
                        if ((unsigned char)*p < 0x20 || *p == 0x7f) {
                                snprintf(err, errlen, "the socket path has a control character");
                                return -EINVAL;
                        }
                sock = strdup(path);
                base = strdup("http://localhost");
                if (asprintf(&display, "unix:%s", path) < 0)
                        display = NULL;
                if (!sock || !base || !display)
                        return -ENOMEM;
                ret->display = TAKE_PTR(display);
                ret->base = TAKE_PTR(base);
                ret->unix_socket = TAKE_PTR(sock);
                return 0;
        }
        if (strncasecmp(url, "http://", 7) == 0)
                rest = url + 7;
        else if (strncasecmp(url, "https://", 8) == 0)
                rest = url + 8;
        else {
                snprintf(err, errlen, "'%.128s' is not an http://, https:// or unix: URL", url);
                return -EINVAL;
        }
        if (has_control_or_space(url)) {
                snprintf(err, errlen, "the daemon URL has a space or control character");
                return -EINVAL;
        }
        if (strpbrk(url, "?#")) {
                snprintf(err, errlen, "the daemon URL must not have a query or fragment");
                return -EINVAL;
        }
        auth_end = rest + strcspn(rest, "/");
        if (memchr(rest, '@', (size_t)(auth_end - rest))) {
                /* Do not echo it: it may hold a secret. */
                snprintf(err, errlen,
                         "the daemon URL must not carry credentials; pass the key with --key or "
                         "RUNTIME_API_KEY");
                return -EINVAL;
        }
        if (auth_end == rest) {
                snprintf(err, errlen, "'%.128s' names no host", url);
                return -EINVAL;
        }
        base = strdup(url);
        if (!base)
                return -ENOMEM;
        n = strlen(base);
        while (n > (size_t)(auth_end - url) && base[n - 1] == '/')
                base[--n] = '\0';
        display = strdup(base);
        if (!display)
                return -ENOMEM;
        ret->display = TAKE_PTR(display);
        ret->base = TAKE_PTR(base);
        ret->unix_socket = NULL;
        return 0;
}

void endpoint_done(Endpoint *e) {
        if (!e)
                return;
        free(e->display);
        free(e->base);
        free(e->unix_socket);
        *e = (Endpoint){0};
}

const char *endpoint_choose(const char *flag_url) {
        const char *env;

        if (flag_url)
                return flag_url;
        env = getenv("RUNTIME_BASE_URL");
        if (env && *env)
                return env;
        return CLI_DEFAULT_URL;
}

char *state_dir_default(void) {
        const char *env = getenv("RUNTIME_STATE_DIR"), *home;
        char *r = NULL;

        if (env && *env)
                return strdup(env);
        if (geteuid() == 0)
                return strdup("/var/lib/runtime");
        env = getenv("XDG_STATE_HOME");
        /* The XDG spec says a relative value is invalid and to be ignored. */
        if (env && env[0] == '/') {
                if (asprintf(&r, "%s/runtime", env) < 0)
                        return NULL;
                return r;
        }
        home = getenv("HOME");
        if (!home || home[0] != '/') {
                struct passwd *pw = getpwuid(geteuid());
                home = pw ? pw->pw_dir : NULL;
        }
        if (!home)
                return NULL;
        if (asprintf(&r, "%s/.local/state/runtime", home) < 0)
                return NULL;
        return r;
}

int key_check(const char *key) {
        size_t n = key ? strlen(key) : 0;

        if (n == 0 || n > CLI_KEY_MAX)
                return -EINVAL;
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)key[i];
                if (c <= 0x20 || c >= 0x7f)
                        return -EINVAL;
        }
        return 0;
}

/* Reads at most CLI_KEY_MAX + 2 bytes; trailing whitespace (the newline an
 * editor adds) is not part of the key. */
static int read_key_file(const char *path, char **ret) {
        _cleanup_close_ int fd = -1;
        char buf[CLI_KEY_MAX + 3];
        struct stat st;
        size_t n = 0;
        ssize_t k;

        /* O_NONBLOCK and the type check: a fifo planted there must not hang us. */
        fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        while (n < sizeof(buf) - 1) {
                k = read(fd, buf + n, sizeof(buf) - 1 - n);
                if (k < 0) {
                        if (errno == EINTR)
                                continue;
                        return -errno;
                }
                if (k == 0)
                        break;
                n += (size_t)k;
        }
        buf[n] = '\0';
        while (n > 0 && isspace((unsigned char)buf[n - 1]))
                buf[--n] = '\0';
        if (n == 0)
                return -ENODATA;
        *ret = strdup(buf);
        explicit_bzero(buf, sizeof(buf));
        return *ret ? 0 : -ENOMEM;
}

int key_discover(const char *flag_key, KeyInfo *ret, char *err, size_t errlen) {
        _cleanup_free_ char *dir = NULL;
        const char *env;
        int r;

        *ret = (KeyInfo){0};
        if (flag_key) {
                if (key_check(flag_key) < 0) {
                        snprintf(err, errlen,
                                 "--key: not a valid key (1 to %d printable characters, no spaces)",
                                 CLI_KEY_MAX);
                        return -EINVAL;
                }
                ret->key = strdup(flag_key);
                ret->source = KEY_SOURCE_FLAG;
                return ret->key ? 0 : -ENOMEM;
        }
        env = getenv("RUNTIME_API_KEY");
        if (env && *env) {
                if (key_check(env) < 0) {
                        snprintf(err, errlen,
                                 "RUNTIME_API_KEY is not a valid key (1 to %d printable characters, "
                                 "no spaces)",
                                 CLI_KEY_MAX);
                        return -EINVAL;
                }
                ret->key = strdup(env);
                ret->source = KEY_SOURCE_ENV;
                return ret->key ? 0 : -ENOMEM;
        }
        dir = state_dir_default();
        if (!dir) {
                ret->file_errno = ENOENT;
                return 0;
        }
        if (asprintf(&ret->file, "%s/admin.key", dir) < 0) {
                ret->file = NULL;
                return -ENOMEM;
        }
        r = read_key_file(ret->file, &ret->key);
        if (r == -ENOMEM)
                return r;
        if (r < 0) {
                ret->file_errno = -r;
                return 0;
        }
        if (key_check(ret->key) < 0) {
                snprintf(err, errlen, "%s does not hold a valid key", ret->file);
                explicit_bzero(ret->key, strlen(ret->key));
                free(ret->key);
                ret->key = NULL;
                return -EINVAL;
        }
        ret->source = KEY_SOURCE_FILE;
        return 0;
}

void key_info_done(KeyInfo *k) {
        if (!k)
                return;
        if (k->key) {
                explicit_bzero(k->key, strlen(k->key));
                free(k->key);
        }
        free(k->file);
        *k = (KeyInfo){0};
}

const char *key_source_name(KeySource s) {
        switch (s) {
        case KEY_SOURCE_FLAG:
                return "--key";
        case KEY_SOURCE_ENV:
                return "RUNTIME_API_KEY";
        case KEY_SOURCE_FILE:
                return "admin.key file";
        default:
                return "none";
        }
}

const char *key_file_problem(int file_errno) {
        switch (file_errno) {
        case 0:
        case ENOENT:
                return "does not exist";
        case EACCES:
        case EPERM:
                return "is not readable by this user";
        case ENODATA:
                return "is empty";
        case EINVAL:
                return "is not a regular file";
        default:
                return strerror(file_errno);
        }
}
