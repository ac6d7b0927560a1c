#include "agent/sudo_wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/macro.h"

/* ---- the front's command line ---- */

__attribute__((format(printf, 3, 4))) static int opt_error(char *err, size_t err_len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* Options of Debian's sudo that a sandbox has no use for or that need what
 * the gateway does not do; refused by name rather than half done. */
static const char *unsupported(char c) {
        switch (c) {
        case 'g': return "-g (a target group)";
        case 'b': return "-b (background)";
        case 'e': return "-e (sudoedit)";
        case 'P': return "-P (keep the caller's groups)";
        case 'C': return "-C (close from)";
        case 'D': return "-D (a working directory)";
        case 'R': return "-R (a root directory)";
        case 'T': return "-T (a timeout)";
        case 'r': return "-r (an SELinux role)";
        case 't': return "-t (an SELinux type)";
        case 'U': return "-U (list another user)";
        case 'h': return NULL;
        default: return NULL;
        }
}

static bool env_assignment(const char *s) {
        const char *eq = strchr(s, '=');
        if (!eq || eq == s)
                return false;
        for (const char *p = s; p < eq; p++)
                if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || *p == '_' ||
                      (p > s && *p >= '0' && *p <= '9')))
                        return false;
        return true;
}

int sudo_parse_options(int argc, char **argv, SudoOptions *ret, char *err, size_t err_len) {
        SudoOptions o = { .action = SUDO_ACTION_RUN };
        bool list = false, validate = false, reset = false;
        int i = 1;
        for (; i < argc; i++) {
                char *a = argv[i];
                if (strcmp(a, "--") == 0) {
                        i++;
                        break;
                }
                if (a[0] != '-' || a[1] == '\0')
                        break;
                if (a[1] == '-') {
                        const char *name = a + 2;
                        const char *val = strchr(name, '=');
                        size_t nl = val ? (size_t)(val - name) : strlen(name);
#define LONG_IS(s) (nl == strlen(s) && strncmp(name, s, nl) == 0)
                        if (LONG_IS("user")) {
                                if (!val && i + 1 >= argc)
                                        return opt_error(err, err_len, "option '%s' requires an argument", a);
                                o.user = val ? val + 1 : argv[++i];
                        } else if (LONG_IS("preserve-env")) {
                                o.flags |= SUDO_PRESERVE_ENV;
                                if (val)
                                        o.preserve = val + 1;
                        } else if (LONG_IS("login") && !val) {
                                o.flags |= SUDO_LOGIN;
                        } else if (LONG_IS("shell") && !val) {
                                o.flags |= SUDO_SHELL;
                        } else if ((LONG_IS("non-interactive") || LONG_IS("stdin") || LONG_IS("set-home") ||
                                    LONG_IS("reset-timestamp") || LONG_IS("remove-timestamp") ||
                                    LONG_IS("askpass")) && !val) {
                                /* No password is ever asked for: nothing to do. */
                                if (LONG_IS("remove-timestamp") || LONG_IS("reset-timestamp"))
                                        reset = true;
                        } else if (LONG_IS("prompt")) {
                                if (!val && ++i >= argc)
                                        return opt_error(err, err_len, "option '%s' requires an argument", a);
                        } else if (LONG_IS("list") && !val) {
                                list = true;
                        } else if (LONG_IS("validate") && !val) {
                                validate = true;
                        } else if (LONG_IS("version") && !val) {
                                o.action = SUDO_ACTION_VERSION;
                        } else if (LONG_IS("help") && !val) {
                                o.action = SUDO_ACTION_HELP;
                        } else {
                                return opt_error(err, err_len,
                                                 "option '%s' is not supported by this sandbox's sudo", a);
                        }
#undef LONG_IS
                        continue;
                }
                for (char *c = a + 1; *c; c++) {
                        const char *why = unsupported(*c);
                        if (why)
                                return opt_error(err, err_len, "%s is not supported by this sandbox's sudo", why);
                        switch (*c) {
                        case 'u':
                        case 'p':
                        case 'g':
                                if (c[1] == '\0' && i + 1 >= argc) {
                                        char opt[3] = { '-', *c, 0 };
                                        return opt_error(err, err_len, "option '%s' requires an argument", opt);
                                }
                                if (*c == 'u')
                                        o.user = c[1] ? c + 1 : argv[++i];
                                else if (c[1] == '\0')
                                        i++;
                                c += strlen(c) - 1;
                                break;
                        case 'i': o.flags |= SUDO_LOGIN; break;
                        case 's': o.flags |= SUDO_SHELL; break;
                        case 'E': o.flags |= SUDO_PRESERVE_ENV; break;
                        case 'n':
                        case 'S':
                        case 'A':
                        case 'H':
                                /* No password to ask for; HOME is the target's
                                 * already (-H). */
                                break;
                        case 'k':
                        case 'K':
                                /* No timestamp to forget: alone, nothing to do. */
                                reset = true;
                                break;
                        case 'l': list = true; break;
                        case 'v': validate = true; break;
                        case 'V': o.action = SUDO_ACTION_VERSION; break;
                        case 'h': o.action = SUDO_ACTION_HELP; break;
                        default: {
                                char opt[3] = { '-', *c, 0 };
                                return opt_error(err, err_len, "invalid option '%s'", opt);
                        }
                        }
                }
        }
        if (o.action != SUDO_ACTION_RUN) {
                *ret = o;
                return 0;
        }
        if ((o.flags & SUDO_LOGIN) && (o.flags & SUDO_SHELL))
                return opt_error(err, err_len, "%s", "you may not specify both the -i and -s options");
        /* VAR=value operands before the command set variables. */
        size_t first = (size_t)i;
        while (i < argc && env_assignment(argv[i]))
                i++;
        if ((size_t)i > first) {
                o.set = calloc((size_t)i - first, sizeof(char *));
                if (!o.set)
                        return opt_error(err, err_len, "%s", "out of memory");
                for (size_t k = first; k < (size_t)i; k++)
                        o.set[o.setc++] = argv[k];
        }
        o.argv = argv + i;
        o.argc = (size_t)(argc - i);
        if (list)
                o.action = SUDO_ACTION_LIST;
        else if ((validate || reset) && o.argc == 0)
                o.action = SUDO_ACTION_VALIDATE;
        else if (o.argc == 0 && !(o.flags & (SUDO_LOGIN | SUDO_SHELL))) {
                free(o.set);
                o.set = NULL;
                o.action = SUDO_ACTION_HELP;
                snprintf(err, err_len, "a command is required");
                *ret = o;
                return -EINVAL;
        }
        *ret = o;
        return 0;
}

/* ---- the request ---- */

int sudo_header_check(const SudoHeader *h) {
        if (h->magic != SUDO_MAGIC || h->version != SUDO_VERSION || (h->flags & ~(uint32_t)SUDO_FLAGS_ALL))
                return -EPROTO;
        if (h->argc > SUDO_ARGC_MAX || h->envc > SUDO_ENVC_MAX || h->setc > SUDO_ENVC_MAX ||
            h->len > SUDO_REQUEST_MAX)
                return -E2BIG;
        if (h->argc == 0 && !(h->flags & (SUDO_LOGIN | SUDO_SHELL)))
                return -EPROTO;
        /* Every string has at least its NUL. */
        if ((uint64_t)h->len < 3ull + h->argc + h->envc + h->setc)
                return -EPROTO;
        return 0;
}

int sudo_request_parse(const SudoHeader *h, const char *payload, SudoRequest *ret) {
        int r = sudo_header_check(h);
        if (r < 0)
                return r;
        size_t total = 3 + (size_t)h->argc + h->envc + h->setc;
        const char **s = calloc(total + 3, sizeof(char *));
        if (!s)
                return -ENOMEM;
        const char *p = payload, *end = payload + h->len;
        for (size_t i = 0; i < total; i++) {
                const char *nul = memchr(p, '\0', (size_t)(end - p));
                if (!nul) {
                        free(s);
                        return -EPROTO;
                }
                s[i] = p;
                p = nul + 1;
        }
        /* Nothing may follow the last string: what was counted is all. */
        if (p != end || s[1][0] != '/') {
                free(s);
                return -EPROTO;
        }
        SudoRequest q = {
                .flags = h->flags,
                .user = s[0],
                .cwd = s[1],
                .preserve = s[2],
        };
        /* One allocation, three NULL-terminated arrays in it. */
        q.argv = s + 3;
        q.argc = h->argc;
        memmove(s + 3 + h->argc + 1, s + 3 + h->argc, ((size_t)h->envc + h->setc) * sizeof(char *));
        s[3 + h->argc] = NULL;
        q.env = s + 3 + h->argc + 1;
        q.envc = h->envc;
        memmove(q.env + h->envc + 1, q.env + h->envc, h->setc * sizeof(char *));
        q.env[h->envc] = NULL;
        q.set = q.env + h->envc + 1;
        q.setc = h->setc;
        q.set[h->setc] = NULL;
        for (size_t i = 0; i < q.envc; i++)
                if (q.env[i][0] == '=' || !strchr(q.env[i], '=')) {
                        free(s);
                        return -EPROTO;
                }
        for (size_t i = 0; i < q.setc; i++)
                if (!env_assignment(q.set[i])) {
                        free(s);
                        return -EPROTO;
                }
        *ret = q;
        return 0;
}

void sudo_request_free(SudoRequest *r) {
        if (r && r->argv)
                free((void *)(r->argv - 3));
}

static int add_str(char **buf, size_t *len, size_t *cap, const char *s) {
        size_t n = strlen(s) + 1;
        if (*len + n > SUDO_REQUEST_MAX)
                return -E2BIG;
        if (*len + n > *cap) {
                size_t c = *cap ? *cap : 4096;
                while (c < *len + n)
                        c *= 2;
                char *b = realloc(*buf, c);
                if (!b)
                        return -ENOMEM;
                *buf = b;
                *cap = c;
        }
        memcpy(*buf + *len, s, n);
        *len += n;
        return 0;
}

int sudo_request_encode(const SudoOptions *o, const char *cwd, char *const env[], SudoHeader *ret_hdr,
                        char **ret_payload) {
        _cleanup_free_ char *buf = NULL;
        size_t len = 0, cap = 0, envc = 0;
        int r;
        if (o->argc > SUDO_ARGC_MAX || o->setc > SUDO_ENVC_MAX)
                return -E2BIG;
        if ((r = add_str(&buf, &len, &cap, o->user ? o->user : "")) < 0 ||
            (r = add_str(&buf, &len, &cap, cwd)) < 0 ||
            (r = add_str(&buf, &len, &cap, o->preserve ? o->preserve : "")) < 0)
                return r;
        for (size_t i = 0; i < o->argc; i++)
                if ((r = add_str(&buf, &len, &cap, o->argv[i])) < 0)
                        return r;
        /* The caller's environment, as much of it as the bound takes: the
         * gateway keeps only what sudo would anyway. */
        for (size_t i = 0; env && env[i] && envc < SUDO_ENVC_MAX; i++) {
                if (!strchr(env[i], '=') || env[i][0] == '=')
                        continue;
                if ((r = add_str(&buf, &len, &cap, env[i])) < 0)
                        return r;
                envc++;
        }
        for (size_t i = 0; i < o->setc; i++)
                if ((r = add_str(&buf, &len, &cap, o->set[i])) < 0)
                        return r;
        *ret_hdr = (SudoHeader){
                .magic = SUDO_MAGIC,
                .version = SUDO_VERSION,
                .flags = o->flags,
                .argc = (uint32_t)o->argc,
                .envc = (uint32_t)envc,
                .setc = (uint32_t)o->setc,
                .len = (uint32_t)len,
        };
        *ret_payload = TAKE_PTR(buf);
        return 0;
}

/* ---- the command's environment ---- */

/* Kept by Debian's sudo under env_reset (its built-in env_keep list), and
 * the sandbox's network settings, without which `sudo apt-get` or `sudo pip
 * install` could reach nothing (the sandbox has no network device; its
 * traffic goes through the agent's relay, with the egress CA). */
static const char *const keep_names[] = {
        "COLORS", "DISPLAY", "HOSTNAME", "KRB5CCNAME", "LS_COLORS", "PS1", "PS2", "XAUTHORITY",
        "XAUTHORIZATION", "XDG_CURRENT_DESKTOP", "TERM", "COLUMNS", "LINES",
        "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
        "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS",
};

static bool name_is(const char *var, const char *name) {
        size_t n = strlen(name);
        return strncmp(var, name, n) == 0 && var[n] == '=';
}

static bool in_list(const char *var, const char *list) {
        size_t vn = strcspn(var, "=");
        for (const char *p = list; *p;) {
                size_t n = strcspn(p, ",");
                if (n == vn && strncmp(p, var, n) == 0)
                        return true;
                p += n;
                if (*p == ',')
                        p++;
        }
        return false;
}

/* sudo keeps the locale and TZ only when their values are safe: no path
 * and no format characters. */
static bool keep_checked(const char *var) {
        const char *v = strchr(var, '=') + 1;
        bool locale = strncmp(var, "LC_", 3) == 0 || name_is(var, "LANG") || name_is(var, "LANGUAGE") ||
                      name_is(var, "LINGUAS");
        if (locale)
                return !strchr(v, '/') && !strchr(v, '%');
        if (name_is(var, "TZ"))
                return !strstr(v, "..") && strlen(v) < 256;
        return false;
}

void sudo_env_free(char **env) {
        for (size_t i = 0; env && env[i]; i++)
                free(env[i]);
        free(env);
}

/* Sets name=value (or a whole "name=value" when value is NULL) in env,
 * replacing an earlier one. */
static int env_put(char ***env, size_t *n, const char *name, const char *value) {
        char *s;
        if (value) {
                if (asprintf(&s, "%s=%s", name, value) < 0)
                        return -ENOMEM;
        } else if (!(s = strdup(name)))
                return -ENOMEM;
        size_t kl = strcspn(s, "=") + 1;
        for (size_t i = 0; i < *n; i++)
                if (strncmp((*env)[i], s, kl) == 0) {
                        free((*env)[i]);
                        (*env)[i] = s;
                        return 0;
                }
        char **e = realloc(*env, (*n + 2) * sizeof(char *));
        if (!e) {
                free(s);
                return -ENOMEM;
        }
        *env = e;
        e[(*n)++] = s;
        e[*n] = NULL;
        return 0;
}

static char *join_command(const SudoRequest *r) {
        size_t len = 1;
        for (size_t i = 0; i < r->argc; i++)
                len += strlen(r->argv[i]) + 1;
        /* sudo's own bound of SUDO_COMMAND is the argument space; 4 KiB is
         * plenty for a variable. */
        if (len > 4096)
                len = 4096;
        char *s = malloc(len);
        if (!s)
                return NULL;
        size_t n = 0;
        for (size_t i = 0; i < r->argc && n + 1 < len; i++) {
                if (i && n + 1 < len)
                        s[n++] = ' ';
                size_t l = strlen(r->argv[i]);
                if (l > len - 1 - n)
                        l = len - 1 - n;
                memcpy(s + n, r->argv[i], l);
                n += l;
        }
        s[n] = '\0';
        return s;
}

char **sudo_build_env(const SudoRequest *r, const SudoTarget *t, const char *caller_name, uid_t caller_uid,
                      gid_t caller_gid) {
        _cleanup_free_ char *cmd = NULL;
        char **env = calloc(1, sizeof(char *));
        size_t n = 0;
        if (!env)
                return NULL;
        bool keep_all = (r->flags & SUDO_PRESERVE_ENV) && !r->preserve[0] && !(r->flags & SUDO_LOGIN);
        for (size_t i = 0; i < r->envc; i++) {
                const char *v = r->env[i];
                bool keep = keep_all || keep_checked(v) || in_list(v, r->preserve);
                for (size_t k = 0; !keep && k < ELEMENTSOF(keep_names); k++)
                        keep = name_is(v, keep_names[k]);
                /* What sudo sets itself is never taken from the caller. */
                if (strncmp(v, "SUDO_", 5) == 0)
                        keep = false;
                if (keep && env_put(&env, &n, v, NULL) < 0)
                        goto fail;
        }
        char uid[16], gid[16];
        snprintf(uid, sizeof uid, "%u", (unsigned)caller_uid);
        snprintf(gid, sizeof gid, "%u", (unsigned)caller_gid);
        cmd = join_command(r);
        char mail[300];
        snprintf(mail, sizeof mail, "/var/mail/%s", t->name);
        if (!cmd || env_put(&env, &n, "PATH", SUDO_SECURE_PATH) < 0 ||
            env_put(&env, &n, "LOGNAME", t->name) < 0 || env_put(&env, &n, "USER", t->name) < 0 ||
            env_put(&env, &n, "SUDO_COMMAND", cmd) < 0 || env_put(&env, &n, "SUDO_USER", caller_name) < 0 ||
            env_put(&env, &n, "SUDO_UID", uid) < 0 || env_put(&env, &n, "SUDO_GID", gid) < 0)
                goto fail;
        /* env_reset sets these to the target's; -E keeps the caller's HOME
         * and SHELL (Debian sets no always_set_home). */
        if (!keep_all && (env_put(&env, &n, "HOME", t->home) < 0 || env_put(&env, &n, "SHELL", t->shell) < 0 ||
                          env_put(&env, &n, "MAIL", mail) < 0))
                goto fail;
        for (size_t i = 0; i < r->setc; i++)
                if (env_put(&env, &n, r->set[i], NULL) < 0)
                        goto fail;
        return env;
fail:
        sudo_env_free(env);
        return NULL;
}

static char *shell_join(const SudoRequest *r) {
        size_t len = 1;
        for (size_t i = 0; i < r->argc; i++)
                len += 2 * strlen(r->argv[i]) + 1;
        char *s = malloc(len);
        if (!s)
                return NULL;
        size_t n = 0;
        for (size_t i = 0; i < r->argc; i++) {
                if (i)
                        s[n++] = ' ';
                for (const char *c = r->argv[i]; *c; c++) {
                        bool plain = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                                     (*c >= '0' && *c <= '9') || *c == '_' || *c == '-' || *c == '$';
                        if (!plain)
                                s[n++] = '\\';
                        s[n++] = *c;
                }
        }
        s[n] = '\0';
        return s;
}

char **sudo_build_argv(const SudoRequest *r, const SudoTarget *t, const char *caller_shell) {
        char **argv = calloc(r->argc + 4, sizeof(char *));
        if (!argv)
                return NULL;
        if (!(r->flags & (SUDO_LOGIN | SUDO_SHELL))) {
                for (size_t i = 0; i < r->argc; i++)
                        if (!(argv[i] = strdup(r->argv[i])))
                                goto fail;
                return argv;
        }
        const char *shell = (r->flags & SUDO_SHELL) && caller_shell && caller_shell[0] == '/' ? caller_shell
                                                                                                : t->shell;
        size_t n = 0;
        if (r->flags & SUDO_LOGIN) {
                const char *base = strrchr(shell, '/');
                if (asprintf(&argv[n++], "-%s", base ? base + 1 : shell) < 0) {
                        argv[n - 1] = NULL;
                        goto fail;
                }
        } else if (!(argv[n++] = strdup(shell)))
                goto fail;
        if (r->argc) {
                if (!(argv[n++] = strdup("-c")) || !(argv[n++] = shell_join(r)))
                        goto fail;
        }
        return argv;
fail:
        sudo_env_free(argv);
        return NULL;
}

/* ---- the image's users and groups ---- */

size_t sudo_parse_groups(const char *buf, size_t len, const char *user, gid_t primary, gid_t *gids, size_t max) {
        size_t n = 0, ul = strlen(user);
        if (max == 0)
                return 0;
        gids[n++] = primary;
        const char *p = buf, *end = buf + len;
        while (p < end && n < max) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *le = nl ? nl : end;
                /* name:password:gid:member,member */
                const char *c1 = memchr(p, ':', (size_t)(le - p));
                const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(le - c1 - 1)) : NULL;
                const char *c3 = c2 ? memchr(c2 + 1, ':', (size_t)(le - c2 - 1)) : NULL;
                if (c3) {
                        unsigned gid = 0;
                        bool ok = c3 > c2 + 1 && c3 - c2 - 1 <= 5;
                        for (const char *d = c2 + 1; ok && d < c3; d++) {
                                ok = *d >= '0' && *d <= '9';
                                gid = gid * 10 + (unsigned)(*d - '0');
                        }
                        for (const char *m = c3 + 1; ok && m < le;) {
                                const char *me = memchr(m, ',', (size_t)(le - m));
                                if (!me)
                                        me = le;
                                if ((size_t)(me - m) == ul && memcmp(m, user, ul) == 0) {
                                        bool dup = false;
                                        for (size_t k = 0; k < n; k++)
                                                dup |= gids[k] == gid;
                                        if (!dup && gid <= 65533)
                                                gids[n++] = gid;
                                        break;
                                }
                                m = me + 1;
                        }
                }
                p = nl ? nl + 1 : end;
        }
        return n;
}

int sudo_parse_shell(const char *buf, size_t len, const char *name, char *shell, size_t shell_len) {
        size_t nlen = strlen(name);
        const char *p = buf, *end = buf + len;
        while (p < end) {
                const char *nl = memchr(p, '\n', (size_t)(end - p));
                const char *le = nl ? nl : end;
                if ((size_t)(le - p) > nlen && memcmp(p, name, nlen) == 0 && p[nlen] == ':') {
                        const char *last = NULL;
                        for (const char *c = p; c < le; c++)
                                if (*c == ':')
                                        last = c;
                        size_t sl = (size_t)(le - last - 1);
                        if (sl == 0) {
                                snprintf(shell, shell_len, "/bin/sh");
                                return 0;
                        }
                        if (sl >= shell_len || last[1] != '/' || memchr(last + 1, '\0', sl))
                                return -ERANGE;
                        memcpy(shell, last + 1, sl);
                        shell[sl] = '\0';
                        return 0;
                }
                p = nl ? nl + 1 : end;
        }
        return -ENOENT;
}
