/* Dockerfiles: the parser, variable expansion and context paths
 * (dockerfile.h). */
#include "daemon/model/dockerfile.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "common/macro.h"

static const char *const OP_NAMES[] = {
        [DF_FROM] = "FROM",   [DF_RUN] = "RUN",     [DF_COPY] = "COPY",   [DF_ADD] = "ADD",
        [DF_ENV] = "ENV",     [DF_ARG] = "ARG",     [DF_WORKDIR] = "WORKDIR", [DF_USER] = "USER",
        [DF_LABEL] = "LABEL", [DF_CMD] = "CMD",     [DF_ENTRYPOINT] = "ENTRYPOINT", [DF_EXPOSE] = "EXPOSE",
        [DF_HEALTHCHECK] = "HEALTHCHECK",
};

/* Docker's other instructions: named when refused, so that the author
 * learns it is known and not done here, not that it is a typo. */
static const char *const UNSUPPORTED[] = { "VOLUME", "STOPSIGNAL", "SHELL", "ONBUILD", "MAINTAINER" };

const char *dockerfile_op_name(DockerfileOp op) {
        return (unsigned)op < ELEMENTSOF(OP_NAMES) ? OP_NAMES[op] : "?";
}

__attribute__((format(printf, 3, 4))) static int fail(DockerfileError *e, unsigned line, const char *fmt, ...) {
        if (e) {
                e->line = line;
                va_list ap;
                va_start(ap, fmt);
                vsnprintf(e->message, sizeof e->message, fmt, ap);
                va_end(ap);
        }
        return -EINVAL;
}

static void step_done(DockerfileStep *s) {
        for (size_t i = 0; i < s->n_words; i++)
                free(s->words[i]);
        free(s->words);
        free(s->as);
        free(s->from);
        free(s->chown);
        free(s->chmod);
        for (size_t i = 0; i < s->n_secrets; i++) {
                free(s->secrets[i].id);
                free(s->secrets[i].target);
                free(s->secrets[i].env);
        }
        free(s->secrets);
        *s = (DockerfileStep){ 0 };
}

void dockerfile_done(Dockerfile *d) {
        if (!d)
                return;
        for (size_t i = 0; i < d->n_steps; i++)
                step_done(&d->steps[i]);
        free(d->steps);
        *d = (Dockerfile){ 0 };
}

/* ---- words ---- */

typedef struct Words {
        char **v;
        size_t n;
} Words;

static void words_done(Words *w) {
        for (size_t i = 0; i < w->n; i++)
                free(w->v[i]);
        free(w->v);
        *w = (Words){ 0 };
}

static int words_push(Words *w, char *s) {
        if (!s)
                return -ENOMEM;
        if (w->n >= DOCKERFILE_MAX_WORDS) {
                free(s);
                return -E2BIG;
        }
        char **n = realloc(w->v, (w->n + 1) * sizeof(*n));
        if (!n) {
                free(s);
                return -ENOMEM;
        }
        w->v = n;
        w->v[w->n++] = s;
        return 0;
}

/* Splits text at unquoted blanks, taking quotes off: "..." keeps blanks and
 * takes \" and \\ as escapes; '...' keeps everything, its "$" escaped so
 * that expansion leaves it; outside quotes a backslash escapes the next
 * character. "\$" stays as written for dockerfile_expand. -EINVAL for a
 * quote left open. */
static int split_words(const char *text, Words *ret) {
        size_t len = strlen(text);
        Words w = { 0 };
        char *buf = malloc(len * 2 + 1);
        if (!buf)
                return -ENOMEM;
        size_t o = 0;
        bool in_word = false;
        char quote = 0;
        int r = 0;
        for (size_t i = 0; i < len && r == 0; i++) {
                char c = text[i];
                if (quote == '\'') {
                        if (c == '\'')
                                quote = 0;
                        else {
                                if (c == '$')
                                        buf[o++] = '\\';
                                buf[o++] = c;
                        }
                        continue;
                }
                if (quote == '"') {
                        if (c == '"')
                                quote = 0;
                        else if (c == '\\' && i + 1 < len && (text[i + 1] == '"' || text[i + 1] == '\\'))
                                buf[o++] = text[++i];
                        else
                                buf[o++] = c;
                        continue;
                }
                if (c == ' ' || c == '\t') {
                        if (in_word) {
                                buf[o] = '\0';
                                r = words_push(&w, strdup(buf));
                                o = 0;
                                in_word = false;
                        }
                        continue;
                }
                in_word = true;
                if (c == '"' || c == '\'')
                        quote = c;
                else if (c == '\\' && i + 1 < len) {
                        if (text[i + 1] == '$')
                                buf[o++] = '\\';
                        buf[o++] = text[++i];
                } else
                        buf[o++] = c;
        }
        if (r == 0 && quote)
                r = -EINVAL;
        if (r == 0 && in_word) {
                buf[o] = '\0';
                r = words_push(&w, strdup(buf));
        }
        free(buf);
        if (r < 0) {
                words_done(&w);
                return r;
        }
        *ret = w;
        return 0;
}

/* The exec form: a JSON array of strings. 1 when text is one (ret
 * filled), 0 when it is not (the shell form), or a negative errno. */
static int json_form(const char *text, Words *ret) {
        if (text[0] != '[')
                return 0;
        json_error_t err;
        json_t *a = json_loads(text, JSON_REJECT_DUPLICATES, &err);
        if (!json_is_array(a)) {
                json_decref(a);
                return 0;
        }
        Words w = { 0 };
        size_t i;
        json_t *v;
        int r = 0;
        json_array_foreach(a, i, v) {
                if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v)) {
                        r = 1;
                        break;
                }
                if ((r = words_push(&w, strdup(json_string_value(v)))) < 0)
                        break;
        }
        json_decref(a);
        if (r != 0) {
                words_done(&w);
                return r < 0 ? r : 0;
        }
        *ret = w;
        return 1;
}

/* ---- instructions ---- */

typedef struct Parser {
        Dockerfile d;
        DockerfileError *e;
        char *stage_names[DOCKERFILE_MAX_STAGES];
        bool have_from;
} Parser;

static bool stage_name_ok(const char *s) {
        if (!isalpha((unsigned char)s[0]))
                return false;
        size_t n = 0;
        for (; s[n]; n++)
                if (!isalnum((unsigned char)s[n]) && !strchr("_.-", s[n]))
                        return false;
        return n <= 64;
}

int dockerfile_stage(const Dockerfile *d, const char *name) {
        if (!name || !name[0])
                return -1;
        for (size_t i = 0; i < d->n_steps; i++) {
                const DockerfileStep *s = &d->steps[i];
                if (s->op == DF_FROM && s->as && strcasecmp(s->as, name) == 0)
                        return (int)s->stage;
        }
        char *end;
        unsigned long n = strtoul(name, &end, 10);
        if (isdigit((unsigned char)name[0]) && !*end && n < d->n_stages)
                return (int)n;
        return -1;
}

/* Takes leading --flag[=value] words off w; each must be in `allowed` (its
 * value into the matching out slot), or it is refused by name. */
static int take_flags(Parser *p, unsigned line, DockerfileOp op, Words *w, const char *const *allowed,
                      char **out[], size_t n_allowed) {
        size_t k = 0;
        while (k < w->n && strncmp(w->v[k], "--", 2) == 0) {
                const char *f = w->v[k] + 2;
                size_t nl = strcspn(f, "=");
                bool found = false;
                for (size_t i = 0; i < n_allowed; i++)
                        if (strlen(allowed[i]) == nl && strncmp(f, allowed[i], nl) == 0) {
                                if (f[nl] != '=' || !f[nl + 1])
                                        return fail(p->e, line, "%s --%s needs a value (--%s=...)",
                                                    dockerfile_op_name(op), allowed[i], allowed[i]);
                                if (*out[i])
                                        return fail(p->e, line, "%s --%s is given twice", dockerfile_op_name(op),
                                                    allowed[i]);
                                *out[i] = strdup(f + nl + 1);
                                if (!*out[i])
                                        return -ENOMEM;
                                found = true;
                        }
                if (!found)
                        return fail(p->e, line, "%s --%.*s is not supported", dockerfile_op_name(op), (int)(nl > 40 ? 40 : nl), f);
                k++;
        }
        if (k == 0)
                return 0; /* w->v may be NULL: no words at all */
        for (size_t i = 0; i < k; i++)
                free(w->v[i]);
        memmove(w->v, w->v + k, (w->n - k) * sizeof(*w->v));
        w->n -= k;
        return 0;
}

static bool secret_id_ok(const char *v, size_t n) {
        if (n == 0 || n > DOCKERFILE_SECRET_ID_MAX || (n == 1 && v[0] == '.') || (n == 2 && v[0] == '.' && v[1] == '.'))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)v[i]) && !strchr("_.-", v[i]))
                        return false;
        return true;
}

/* An absolute path of plain parts, none "." or "..", and not in the
 * sandbox's own trees (/proc, /dev, /sys, the agent's /.runtime). */
static bool secret_target_ok(const char *v, size_t n) {
        if (n < 2 || n > DOCKERFILE_SECRET_TARGET_MAX || v[0] != '/' || v[n - 1] == '/')
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)v[i]) && !strchr("_.-/+@", v[i]))
                        return false;
        for (size_t i = 0; i < n;) {
                size_t j = i + 1;
                while (j < n && v[j] != '/')
                        j++;
                size_t part = j - i - 1;
                if (part == 0 || (part == 1 && v[i + 1] == '.') || (part == 2 && v[i + 1] == '.' && v[i + 2] == '.'))
                        return false;
                i = j;
        }
        static const char *const own[] = { "/proc", "/dev", "/sys", "/.runtime" };
        for (size_t i = 0; i < ELEMENTSOF(own); i++) {
                size_t m = strlen(own[i]);
                if (n >= m && strncmp(v, own[i], m) == 0 && (n == m || v[m] == '/' || v[m] == '-'))
                        return false;
        }
        return true;
}

static bool env_name_ok(const char *v, size_t n) {
        if (n == 0 || n > 128 || isdigit((unsigned char)v[0]))
                return false;
        for (size_t i = 0; i < n; i++)
                if (!isalnum((unsigned char)v[i]) && v[i] != '_')
                        return false;
        return true;
}

/* One --mount=... of RUN: type=secret only, its options checked. */
static int secret_mount(Parser *p, unsigned line, DockerfileStep *s, const char *spec) {
        DockerfileSecret m = { 0 };
        bool secret = false, typed = false;
        int r = 0;
        for (const char *o = spec; *o && r == 0;) {
                size_t n = strcspn(o, ",");
                const char *eq = memchr(o, '=', n);
                size_t kl = eq ? (size_t)(eq - o) : n;
                const char *v = eq ? eq + 1 : o + n;
                size_t vl = eq ? n - kl - 1 : 0;
                char **slot = NULL;
#define KEY(k) (kl == strlen(k) && strncmp(o, k, kl) == 0)
                if (KEY("type")) {
                        typed = true;
                        secret = vl == 6 && strncmp(v, "secret", 6) == 0;
                        if (!secret)
                                r = fail(p->e, line, "RUN --mount=type=%.*s is not supported (only type=secret)",
                                         (int)(vl > 16 ? 16 : vl), v);
                } else if (KEY("id")) {
                        if (!secret_id_ok(v, vl))
                                r = fail(p->e, line, "RUN --mount id must be 1 to %u of letters, digits, _ . -",
                                         DOCKERFILE_SECRET_ID_MAX);
                        slot = &m.id;
                } else if (KEY("target") || KEY("dst") || KEY("destination")) {
                        if (!secret_target_ok(v, vl))
                                r = fail(p->e, line, "RUN --mount target must be an absolute path (letters, digits, "
                                                     "_ . - + @, no . or .. part, not in /proc, /dev, /sys)");
                        slot = &m.target;
                } else if (KEY("env")) {
                        if (!env_name_ok(v, vl))
                                r = fail(p->e, line, "RUN --mount env must be a variable's name");
                        slot = &m.env;
                } else if (KEY("required")) {
                        if (!eq || (vl == 4 && strncmp(v, "true", 4) == 0))
                                m.required = true;
                        else if (vl == 5 && strncmp(v, "false", 5) == 0)
                                m.required = false;
                        else
                                r = fail(p->e, line, "RUN --mount required must be true or false");
                } else
                        r = fail(p->e, line, "RUN --mount option %.*s is not supported (type, id, target, env, "
                                             "required)", (int)(kl > 24 ? 24 : kl), o);
#undef KEY
                if (r == 0 && slot) {
                        if (*slot)
                                r = fail(p->e, line, "RUN --mount gives %.*s twice", (int)kl, o);
                        else if (!(*slot = strndup(v, vl)))
                                r = -ENOMEM;
                }
                o += n;
                if (*o == ',')
                        o++;
        }
        if (r == 0 && !typed)
                r = fail(p->e, line, "RUN --mount without type= is a bind mount, which is not supported (only "
                                     "type=secret)");
        if (r == 0 && !m.id && m.target) {
                const char *last = strrchr(m.target, '/') + 1;
                if (!secret_id_ok(last, strlen(last)))
                        r = fail(p->e, line, "RUN --mount needs id= (the target's last part is no id)");
                else if (!(m.id = strdup(last)))
                        r = -ENOMEM;
        }
        if (r == 0 && !m.id)
                r = fail(p->e, line, "RUN --mount=type=secret needs id=");
        if (r == 0 && !m.target && !m.env && asprintf(&m.target, "/run/secrets/%s", m.id) < 0) {
                m.target = NULL;
                r = -ENOMEM;
        }
        for (size_t i = 0; r == 0 && i < s->n_secrets; i++)
                if (strcmp(s->secrets[i].id, m.id) == 0 ||
                    (m.target && s->secrets[i].target && strcmp(s->secrets[i].target, m.target) == 0))
                        r = fail(p->e, line, "RUN mounts secret %.64s or its target twice", m.id);
        if (r == 0 && s->n_secrets >= DOCKERFILE_MAX_SECRETS)
                r = fail(p->e, line, "RUN has more than %u secret mounts", DOCKERFILE_MAX_SECRETS);
        DockerfileSecret *a = r == 0 ? realloc(s->secrets, (s->n_secrets + 1) * sizeof(*a)) : NULL;
        if (r == 0 && !a)
                r = -ENOMEM;
        if (r < 0) {
                free(m.id);
                free(m.target);
                free(m.env);
                return r;
        }
        s->secrets = a;
        s->secrets[s->n_secrets++] = m;
        return 0;
}

/* RUN's flags: each --mount=type=secret,... (several may be given);
 * any other is refused by name. */
static int run_mounts(Parser *p, unsigned line, DockerfileStep *s, Words *w) {
        size_t k = 0;
        while (k < w->n && strncmp(w->v[k], "--", 2) == 0) {
                const char *f = w->v[k] + 2;
                size_t nl = strcspn(f, "=");
                if (nl != 5 || strncmp(f, "mount", 5) != 0)
                        return fail(p->e, line, "RUN --%.*s is not supported", (int)(nl > 40 ? 40 : nl), f);
                if (f[nl] != '=' || !f[nl + 1])
                        return fail(p->e, line, "RUN --mount needs a value (--mount=type=secret,id=...)");
                int r = secret_mount(p, line, s, f + nl + 1);
                if (r < 0)
                        return r;
                k++;
        }
        for (size_t i = 0; i < k; i++)
                free(w->v[i]);
        if (k)
                memmove(w->v, w->v + k, (w->n - k) * sizeof(*w->v));
        w->n -= k;
        return 0;
}

static bool heredoc_at(const char *s) {
        const char *h = strstr(s, "<<");
        while (h) {
                const char *t = h + 2;
                if (*t == '-')
                        t++;
                if (isalpha((unsigned char)*t) || *t == '_' || *t == '"' || *t == '\'')
                        return true;
                h = strstr(h + 2, "<<");
        }
        return false;
}

static bool is_url(const char *s) {
        return strstr(s, "://") || strncmp(s, "git@", 4) == 0;
}

static bool is_archive(const char *s) {
        static const char *const ext[] = { ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst" };
        size_t n = strlen(s);
        for (size_t i = 0; i < ELEMENTSOF(ext); i++) {
                size_t m = strlen(ext[i]);
                if (n > m && strcasecmp(s + n - m, ext[i]) == 0)
                        return true;
        }
        return false;
}

static bool port_ok(const char *s) {
        if (strchr(s, '$'))
                return true; /* checked once expanded */
        char *end;
        unsigned long lo = strtoul(s, &end, 10), hi = lo;
        if (end == s)
                return false;
        if (*end == '-') {
                const char *h = end + 1;
                hi = strtoul(h, &end, 10);
                if (end == h)
                        return false;
        }
        if (*end == '/' && strcasecmp(end + 1, "tcp") != 0 && strcasecmp(end + 1, "udp") != 0)
                return false;
        if (*end && *end != '/')
                return false;
        return lo >= 1 && hi <= 65535 && lo <= hi;
}

/* name=value pairs (ENV and LABEL), or ENV's older "name value...". */
static int pairs(Parser *p, unsigned line, DockerfileOp op, const char *rest, Words *w, Words *out) {
        if (w->n == 0)
                return fail(p->e, line, "%s needs name=value", dockerfile_op_name(op));
        if (!strchr(w->v[0], '=')) {
                if (op != DF_ENV || w->n < 2)
                        return fail(p->e, line, "%s needs name=value", dockerfile_op_name(op));
                /* ENV name value with blanks: the rest of the line is the value. */
                size_t nl = strcspn(rest, " \t");
                const char *v = rest + nl + strspn(rest + nl, " \t");
                int r = words_push(out, strdup(w->v[0]));
                return r < 0 ? r : words_push(out, strdup(v));
        }
        for (size_t i = 0; i < w->n; i++) {
                char *eq = strchr(w->v[i], '=');
                if (!eq || eq == w->v[i])
                        return fail(p->e, line, "%s needs name=value, not %.64s", dockerfile_op_name(op), w->v[i]);
                int r = words_push(out, strndup(w->v[i], (size_t)(eq - w->v[i])));
                if (r == 0)
                        r = words_push(out, strdup(eq + 1));
                if (r < 0)
                        return r;
        }
        return 0;
}

static int add_step(Parser *p, DockerfileStep *s) {
        if (p->d.n_steps >= DOCKERFILE_MAX_STEPS) {
                fail(p->e, s->line, "more than %u instructions", DOCKERFILE_MAX_STEPS);
                return -E2BIG;
        }
        DockerfileStep *n = realloc(p->d.steps, (p->d.n_steps + 1) * sizeof(*n));
        if (!n)
                return -ENOMEM;
        p->d.steps = n;
        p->d.steps[p->d.n_steps++] = *s;
        *s = (DockerfileStep){ 0 };
        return 0;
}

/* RUN, CMD, ENTRYPOINT, COPY and ADD: their flags, then the shell form's
 * words or the exec form's JSON. */
static int command_step(Parser *p, unsigned line, DockerfileOp op, const char *rest, DockerfileStep *s, Words *w,
                        Words *out) {
        int r;
        bool exec_form = false;
        /* Flags come first, in the shell form's words. */
        r = split_words(rest, w);
        if (r == -EINVAL)
                r = fail(p->e, line, "%s has a quote that is not closed", OP_NAMES[op]);
        if (r < 0)
                return r;
        if (op == DF_RUN) {
                r = run_mounts(p, line, s, w);
        } else if (op == DF_COPY || op == DF_ADD) {
                static const char *const allowed[] = { "from", "chown", "chmod" };
                char **slots[] = { &s->from, &s->chown, &s->chmod };
                r = take_flags(p, line, op, w, allowed, slots, ELEMENTSOF(allowed));
                if (r == 0 && op == DF_ADD && s->from)
                        r = fail(p->e, line, "ADD --from is not supported: use COPY --from");
        } else if (w->n && strncmp(w->v[0], "--", 2) == 0)
                r = fail(p->e, line, "%s takes no flags (%.40s)", OP_NAMES[op], w->v[0]);
        if (r < 0)
                return r;
        /* What follows the flags, as written. */
        const char *body = rest;
        for (const char *f = rest; strncmp(f, "--", 2) == 0;) {
                f += strcspn(f, " \t");
                f += strspn(f, " \t");
                body = f;
        }
        int j = json_form(body, out);
        if (j < 0) {
                r = j;
                return r;
        }
        /* The exec form's words are JSON strings: a "<<" in them is the
         * command's own (a shell it runs may read a heredoc), never lines
         * of the Dockerfile, as BuildKit reads them. */
        if (j != 1 && heredoc_at(body)) {
                r = fail(p->e, line, "%s with a heredoc (<<) is not supported", OP_NAMES[op]);
                return r;
        }
        exec_form = j == 1;
        if (!exec_form && (op == DF_RUN || op == DF_CMD || op == DF_ENTRYPOINT)) {
                if (!body[0] && op == DF_RUN) {
                        r = fail(p->e, line, "RUN needs a command");
                        return r;
                }
                r = body[0] ? words_push(out, strdup(body)) : 0;
        } else if (!exec_form) {
                *out = *w;
                *w = (Words){ 0 };
        }
        if (r < 0)
                return r;
        if (exec_form && op == DF_RUN && out->n == 0) {
                r = fail(p->e, line, "RUN needs a command");
                return r;
        }
        if (op == DF_COPY || op == DF_ADD) {
                if (out->n < 2) {
                        r = fail(p->e, line, "%s needs a source and a destination", OP_NAMES[op]);
                        return r;
                }
                for (size_t k = 0; k + 1 < out->n; k++) {
                        if (op == DF_ADD && is_url(out->v[k]))
                                r = fail(p->e, line, "ADD from a URL is not supported: download it in a RUN");
                        else if (op == DF_ADD && is_archive(out->v[k]))
                                r = fail(p->e, line, "ADD of an archive (which ADD would unpack) is not "
                                                     "supported: COPY it and unpack it in a RUN");
                        if (r < 0)
                                return r;
                }
                if (s->from) {
                        /* Not a stage named before: an image, as Docker reads it; a
                         * number or this stage is no image. */
                        int st = dockerfile_stage(&p->d, s->from);
                        size_t fl = strlen(s->from);
                        bool digits = strspn(s->from, "0123456789") == fl;
                        if (st >= 0 && (unsigned)st < s->stage) {
                                /* an earlier stage */
                        } else if (st >= 0 || digits) {
                                r = fail(p->e, line, "COPY --from=%.64s names no earlier stage", s->from);
                                return r;
                        } else if (fl > 255 || s->from[0] == '-' ||
                                   strspn(s->from, "abcdefghijklmnopqrstuvwxyz0123456789_.-/:@$}{ABCDEFGHIJKLMNOPQRSTUVWXYZ") != fl) {
                                r = fail(p->e, line, "COPY --from=%.64s is neither an earlier stage nor an image's "
                                                     "name", s->from);
                                return r;
                        } else
                                s->from_image = true;
                }
                if (s->chmod) {
                        char *end;
                        unsigned long m = strtoul(s->chmod, &end, 8);
                        if (!s->chmod[0] || *end || m > 07777) {
                                r = fail(p->e, line, "%s --chmod=%.16s is not an octal mode", OP_NAMES[op], s->chmod);
                                return r;
                        }
                }
        }
        s->exec = exec_form;
        return 0;
}

/* HEALTHCHECK [--interval= --timeout= --start-period= --start-interval=
 * --retries=] CMD command, or NONE. Docker's timing flags are taken and
 * left: what an image keeps of it is the command, its start command's
 * readiness check, polled on the start's own timeout (docs/images.md). */
static int healthcheck_step(Parser *p, unsigned line, const char *rest, DockerfileStep *s, Words *w, Words *out) {
        static const char *const allowed[] = { "interval", "timeout", "start-period", "start-interval", "retries" };
        char *vals[ELEMENTSOF(allowed)] = { 0 };
        char **slots[] = { &vals[0], &vals[1], &vals[2], &vals[3], &vals[4] };
        int r = split_words(rest, w);
        if (r == -EINVAL)
                r = fail(p->e, line, "HEALTHCHECK has a quote that is not closed");
        if (r == 0)
                r = take_flags(p, line, DF_HEALTHCHECK, w, allowed, slots, ELEMENTSOF(allowed));
        for (size_t i = 0; i < ELEMENTSOF(vals); i++)
                free(vals[i]);
        if (r < 0)
                return r;
        const char *body = rest;
        while (strncmp(body, "--", 2) == 0) {
                body += strcspn(body, " \t");
                body += strspn(body, " \t");
        }
        size_t kw = strcspn(body, " \t");
        if (kw == 4 && strncasecmp(body, "NONE", 4) == 0 && !body[4 + strspn(body + 4, " \t")])
                return 0;
        if (kw != 3 || strncasecmp(body, "CMD", 3) != 0)
                return fail(p->e, line, "HEALTHCHECK takes CMD and a command, or NONE");
        body += 3;
        body += strspn(body, " \t");
        words_done(w);
        *w = (Words){ 0 };
        r = command_step(p, line, DF_CMD, body, s, w, out);
        if (r == 0 && out->n == 0)
                r = fail(p->e, line, "HEALTHCHECK CMD needs a command");
        return r;
}

static int instruction(Parser *p, unsigned line, const char *kw, const char *rest) {
        DockerfileOp op;
        size_t i;
        for (i = 0; i < ELEMENTSOF(OP_NAMES); i++)
                if (strcasecmp(kw, OP_NAMES[i]) == 0)
                        break;
        if (i == ELEMENTSOF(OP_NAMES)) {
                for (size_t k = 0; k < ELEMENTSOF(UNSUPPORTED); k++)
                        if (strcasecmp(kw, UNSUPPORTED[k]) == 0)
                                return fail(p->e, line, "%s is not supported", UNSUPPORTED[k]);
                return fail(p->e, line, "unknown instruction %.32s", kw);
        }
        op = (DockerfileOp)i;
        if (!p->have_from && op != DF_FROM && op != DF_ARG)
                return fail(p->e, line, "%s before the first FROM (only ARG may come before it)", OP_NAMES[op]);
        DockerfileStep s = { .op = op, .line = line, .stage = p->d.n_stages ? p->d.n_stages - 1 : 0 };
        Words w = { 0 }, out = { 0 };
        int r = 0;
        if (op == DF_RUN || op == DF_CMD || op == DF_ENTRYPOINT || op == DF_COPY || op == DF_ADD) {
                r = command_step(p, line, op, rest, &s, &w, &out);
                if (r < 0)
                        goto done;
                goto take;
        }
        if (op == DF_HEALTHCHECK) {
                r = healthcheck_step(p, line, rest, &s, &w, &out);
                if (r < 0)
                        goto done;
                goto take;
        }
        r = split_words(rest, &w);
        if (r == -EINVAL)
                r = fail(p->e, line, "%s has a quote that is not closed", OP_NAMES[op]);
        if (r < 0)
                goto done;
        if (w.n && strncmp(w.v[0], "--", 2) == 0) {
                size_t fl = strcspn(w.v[0] + 2, "=");
                r = fail(p->e, line, "%s --%.*s is not supported", OP_NAMES[op], (int)(fl > 40 ? 40 : fl), w.v[0] + 2);
                goto done;
        }
        switch (op) {
        case DF_FROM:
                if (w.n != 1 && !(w.n == 3 && strcasecmp(w.v[1], "AS") == 0)) {
                        r = fail(p->e, line, "FROM takes an image and AS name at most");
                        goto done;
                }
                if (p->d.n_stages >= DOCKERFILE_MAX_STAGES) {
                        r = fail(p->e, line, "more than %u stages", DOCKERFILE_MAX_STAGES);
                        goto done;
                }
                if (w.n == 3) {
                        if (!stage_name_ok(w.v[2])) {
                                r = fail(p->e, line, "stage name %.64s: a letter, then letters, digits, _ . -",
                                         w.v[2]);
                                goto done;
                        }
                        if (dockerfile_stage(&p->d, w.v[2]) >= 0 && !isdigit((unsigned char)w.v[2][0])) {
                                r = fail(p->e, line, "stage %.64s is named twice", w.v[2]);
                                goto done;
                        }
                        s.as = TAKE_PTR(w.v[2]);
                }
                s.stage = p->d.n_stages++;
                p->have_from = true;
                r = words_push(&out, TAKE_PTR(w.v[0]));
                break;
        case DF_ENV:
        case DF_LABEL:
                r = pairs(p, line, op, rest, &w, &out);
                break;
        case DF_ARG:
                if (w.n == 0) {
                        r = fail(p->e, line, "ARG needs a name");
                        goto done;
                }
                /* One step per name, each with its default or none. */
                for (size_t k = 0; k < w.n && r == 0; k++) {
                        char *eq = strchr(w.v[k], '=');
                        DockerfileStep a = { .op = DF_ARG, .line = line, .stage = s.stage };
                        Words aw = { 0 };
                        r = words_push(&aw, eq ? strndup(w.v[k], (size_t)(eq - w.v[k])) : strdup(w.v[k]));
                        if (r == 0 && !aw.v[0][0])
                                r = fail(p->e, line, "ARG needs a name before =");
                        if (r == 0 && (r = words_push(&aw, strdup(eq ? eq + 1 : ""))) == 0 && !eq) {
                                free(aw.v[1]);
                                aw.v[1] = NULL;
                        }
                        a.words = aw.v;
                        a.n_words = aw.n;
                        r = r == 0 ? add_step(p, &a) : r;
                        step_done(&a);
                }
                goto done;
        case DF_WORKDIR:
        case DF_USER:
                if (w.n != 1) {
                        r = fail(p->e, line, "%s takes one %s", OP_NAMES[op], op == DF_USER ? "user" : "path");
                        goto done;
                }
                r = words_push(&out, TAKE_PTR(w.v[0]));
                break;
        case DF_EXPOSE:
                if (w.n == 0) {
                        r = fail(p->e, line, "EXPOSE needs a port");
                        goto done;
                }
                for (size_t k = 0; k < w.n; k++)
                        if (!port_ok(w.v[k])) {
                                r = fail(p->e, line, "EXPOSE %.32s is not a port (1-65535, /tcp or /udp)", w.v[k]);
                                goto done;
                        }
                out = w;
                w = (Words){ 0 };
                break;
        default:
                break;
        }
        if (r < 0)
                goto done;
take:
        s.words = TAKE_PTR(out.v);
        s.n_words = out.n;
        out.n = 0;
        r = add_step(p, &s);
done:
        if (r == -E2BIG && p->e && !p->e->message[0])
                fail(p->e, line, "%s has more than %u words", OP_NAMES[op], DOCKERFILE_MAX_WORDS);
        words_done(&w);
        words_done(&out);
        step_done(&s);
        return r;
}

/* A line that is only blanks, or a comment. */
static bool blank_or_comment(const char *s, size_t n) {
        size_t i = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\r'))
                i++;
        return i == n || s[i] == '#';
}

/* "# name=value" at the top of the file. */
static int directive(Parser *p, unsigned line, const char *s, size_t n, bool *ret_is) {
        *ret_is = false;
        size_t i = 0;
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
                i++;
        if (i >= n || s[i] != '#')
                return 0;
        i++;
        while (i < n && (s[i] == ' ' || s[i] == '\t'))
                i++;
        size_t k = i;
        while (k < n && (isalnum((unsigned char)s[k]) || s[k] == '_'))
                k++;
        size_t eq = k;
        while (eq < n && (s[eq] == ' ' || s[eq] == '\t'))
                eq++;
        if (k == i || eq >= n || s[eq] != '=')
                return 0;
        *ret_is = true;
        const char *v = s + eq + 1;
        size_t vn = n - eq - 1;
        while (vn && (*v == ' ' || *v == '\t'))
                v++, vn--;
        while (vn && (v[vn - 1] == ' ' || v[vn - 1] == '\t' || v[vn - 1] == '\r'))
                vn--;
        if (k - i == 6 && strncasecmp(s + i, "escape", 6) == 0 && !(vn == 1 && v[0] == '\\'))
                return fail(p->e, line, "the escape directive is not supported (the escape character is \\)");
        /* syntax names a BuildKit front end, and check its linter: this
         * parser is the only front end, and those change nothing built. */
        return 0;
}

int dockerfile_parse(const char *text, size_t len, Dockerfile *ret, DockerfileError *e) {
        if (e)
                *e = (DockerfileError){ 0 };
        if (len > DOCKERFILE_MAX_BYTES) {
                fail(e, 0, "the Dockerfile is over %u KiB", DOCKERFILE_MAX_BYTES / 1024);
                return -E2BIG;
        }
        if (memchr(text, '\0', len))
                return fail(e, 0, "the Dockerfile holds a NUL byte");
        Parser p = { .e = e };
        char *logical = malloc(len + 1);
        if (!logical)
                return -ENOMEM;
        size_t at = 0, ln = 0;
        unsigned line = 0, start = 0;
        bool directives = true, continuing = false;
        int r = 0;
        while (at < len && r == 0) {
                const char *s = text + at;
                /* The text need not end in a NUL: never read past len. */
                const char *nl = memchr(s, '\n', len - at);
                size_t n = nl ? (size_t)(nl - s) : len - at;
                at += n + (at + n < len);
                line++;
                if (directives) {
                        bool is;
                        r = directive(&p, line, s, n, &is);
                        if (r < 0 || is)
                                continue;
                        directives = false;
                }
                if (blank_or_comment(s, n))
                        continue; /* inside a continued instruction too, as Docker does */
                size_t m = n;
                while (m && (s[m - 1] == ' ' || s[m - 1] == '\t' || s[m - 1] == '\r'))
                        m--;
                bool more = m && s[m - 1] == '\\';
                if (more)
                        m--;
                if (!continuing) {
                        start = line;
                        ln = 0;
                        size_t lead = 0;
                        while (lead < m && (s[lead] == ' ' || s[lead] == '\t'))
                                lead++;
                        s += lead;
                        m -= lead;
                }
                memcpy(logical + ln, s, m);
                ln += m;
                logical[ln] = '\0';
                continuing = more;
                if (continuing)
                        continue;
                size_t kw = strcspn(logical, " \t");
                char keyword[33];
                snprintf(keyword, sizeof keyword, "%.*s", (int)(kw > 32 ? 32 : kw), logical);
                const char *rest = logical + kw;
                rest += strspn(rest, " \t");
                r = instruction(&p, start, keyword, rest);
        }
        if (r == 0 && continuing) {
                size_t kw = strcspn(logical, " \t");
                char keyword[33];
                snprintf(keyword, sizeof keyword, "%.*s", (int)(kw > 32 ? 32 : kw), logical);
                const char *rest = logical + kw;
                rest += strspn(rest, " \t");
                r = instruction(&p, start, keyword, rest);
        }
        free(logical);
        if (r == 0 && !p.have_from)
                r = fail(e, 0, "the Dockerfile has no FROM");
        /* A COPY --from naming a stage defined after it is no image. */
        for (size_t i = 0; r == 0 && i < p.d.n_steps; i++)
                if (p.d.steps[i].from_image && dockerfile_stage(&p.d, p.d.steps[i].from) >= 0)
                        r = fail(e, p.d.steps[i].line, "COPY --from=%.64s names a later stage", p.d.steps[i].from);
        if (r < 0) {
                dockerfile_done(&p.d);
                return r;
        }
        *ret = p.d;
        return 0;
}

/* ---- expansion ---- */

typedef struct Buf {
        char *s;
        size_t n, cap;
} Buf;

static int buf_add(Buf *b, const char *s, size_t n) {
        if (b->n + n > DOCKERFILE_MAX_EXPANDED)
                return -E2BIG;
        if (b->n + n + 1 > b->cap) {
                size_t cap = (b->n + n + 1) * 2;
                char *t = realloc(b->s, cap);
                if (!t)
                        return -ENOMEM;
                b->s = t;
                b->cap = cap;
        }
        memcpy(b->s + b->n, s, n);
        b->n += n;
        b->s[b->n] = '\0';
        return 0;
}

static bool name_char(char c, bool first) {
        return c == '_' || isalpha((unsigned char)c) || (!first && isdigit((unsigned char)c));
}

static int expand_into(const char *w, size_t len, DockerfileLookupFn lookup, void *userdata, Buf *b,
                       DockerfileError *e, unsigned depth) {
        int r = 0;
        for (size_t i = 0; i < len && r == 0;) {
                if (w[i] == '\\' && i + 1 < len && w[i + 1] == '$') {
                        r = buf_add(b, "$", 1);
                        i += 2;
                        continue;
                }
                if (w[i] != '$') {
                        r = buf_add(b, w + i, 1);
                        i++;
                        continue;
                }
                if (i + 1 < len && w[i + 1] == '{') {
                        size_t j = i + 2, k = j;
                        while (k < len && name_char(w[k], k == j))
                                k++;
                        if (k == j)
                                return fail(e, 0, "${ without a variable's name");
                        /* Find the matching }, nested ${...} counted. */
                        size_t end = k;
                        unsigned open = 1;
                        while (end < len && open) {
                                if (w[end] == '$' && end + 1 < len && w[end + 1] == '{')
                                        open++, end++;
                                else if (w[end] == '}')
                                        open--;
                                if (open)
                                        end++;
                        }
                        if (end >= len)
                                return fail(e, 0, "${%.*s without its }", (int)(k - j > 40 ? 40 : k - j), w + j);
                        char name[256];
                        if (k - j >= sizeof name)
                                return fail(e, 0, "a variable's name is over 255 bytes");
                        memcpy(name, w + j, k - j);
                        name[k - j] = '\0';
                        const char *v = lookup(userdata, name);
                        if (k == end) {
                                r = v ? buf_add(b, v, strlen(v)) : 0;
                        } else if (end - k >= 2 && w[k] == ':' && (w[k + 1] == '-' || w[k + 1] == '+')) {
                                bool set = v && v[0];
                                bool use_word = w[k + 1] == '-' ? !set : set;
                                if (depth > 8)
                                        return fail(e, 0, "variables nested too deep");
                                if (use_word)
                                        r = expand_into(w + k + 2, end - k - 2, lookup, userdata, b, e, depth + 1);
                                else if (set)
                                        r = buf_add(b, v, strlen(v));
                        } else
                                return fail(e, 0, "${%s%.*s}: only ${NAME:-word} and ${NAME:+word} are supported",
                                            name, (int)(end - k > 16 ? 16 : end - k), w + k);
                        i = end + 1;
                        continue;
                }
                size_t j = i + 1, k = j;
                while (k < len && name_char(w[k], k == j))
                        k++;
                if (k == j) {
                        r = buf_add(b, "$", 1);
                        i++;
                        continue;
                }
                char name[256];
                if (k - j >= sizeof name)
                        return fail(e, 0, "a variable's name is over 255 bytes");
                memcpy(name, w + j, k - j);
                name[k - j] = '\0';
                const char *v = lookup(userdata, name);
                if (v)
                        r = buf_add(b, v, strlen(v));
                i = k;
        }
        if (r == -E2BIG)
                fail(e, 0, "a word grows past %u KiB once its variables are expanded", DOCKERFILE_MAX_EXPANDED / 1024);
        return r;
}

int dockerfile_expand(const char *word, DockerfileLookupFn lookup, void *userdata, char **ret, DockerfileError *e) {
        Buf b = { 0 };
        int r = buf_add(&b, "", 0);
        if (r == 0)
                r = expand_into(word, strlen(word), lookup, userdata, &b, e, 0);
        if (r < 0) {
                free(b.s);
                return r;
        }
        *ret = b.s;
        return 0;
}

/* ---- context paths ---- */

int dockerfile_context_path(const char *path, char **ret) {
        size_t len = strlen(path);
        char *out = malloc(len + 1);
        if (!out)
                return -ENOMEM;
        size_t o = 0;
        const char *s = path;
        while (*s) {
                while (*s == '/')
                        s++;
                size_t n = strcspn(s, "/");
                if (n == 0)
                        break;
                if (n == 1 && s[0] == '.') {
                } else if (n == 2 && s[0] == '.' && s[1] == '.') {
                        if (o == 0) {
                                free(out);
                                return -EPERM;
                        }
                        while (o && out[o - 1] != '/')
                                o--;
                        if (o)
                                o--;
                } else {
                        if (o)
                                out[o++] = '/';
                        memcpy(out + o, s, n);
                        o += n;
                }
                s += n;
        }
        out[o] = '\0';
        *ret = out;
        return 0;
}
