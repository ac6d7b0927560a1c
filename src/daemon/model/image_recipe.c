/* Image recipes and inline files (image_recipe.h): checked, then made into
 * a Dockerfile's text and a context's archive. */
#include "daemon/model/image_recipe.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "common/base64.h"
#include "common/jsonutil.h"
#include "common/macro.h"
#include "common/random.h"
#include "common/tar.h"
#include "daemon/model/dockerfile.h"

__attribute__((format(printf, 3, 4))) static int refuse(char *why, size_t why_len, const char *fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, why_len, fmt, ap);
        va_end(ap);
        return -EINVAL;
}

/* ---- inline files ---- */

static bool env_name_ok(const char *s) {
        if (!(isalpha((unsigned char)s[0]) || s[0] == '_') || strlen(s) > 128)
                return false;
        for (; *s; s++)
                if (!isalnum((unsigned char)*s) && *s != '_')
                        return false;
        return true;
}

void image_files_done(ImageFiles *f) {
        if (!f)
                return;
        for (size_t i = 0; i < f->n; i++) {
                free(f->v[i].path);
                free(f->v[i].data);
        }
        free(f->v);
        *f = (ImageFiles){ 0 };
}

/* path relative and normalized into a new string: "", "." parts dropped;
 * NULL (why in *ret_why) for an absolute path, a ".." part, a control
 * character, or nothing left. */
static char *clean_path(const char *p, size_t len, const char **ret_why) {
        *ret_why = NULL;
        if (len == 0 || len > IMAGE_FILE_PATH_MAX || strlen(p) != len)
                *ret_why = len ? "is longer than 1024 bytes or holds a NUL" : "is empty";
        else if (p[0] == '/')
                *ret_why = "is absolute: give it relative to the context (or the recipe's workdir)";
        for (size_t i = 0; i < len && !*ret_why; i++)
                if ((unsigned char)p[i] < 0x20 || p[i] == 0x7f || p[i] == '\\')
                        *ret_why = "holds a control character or a backslash";
        if (*ret_why)
                return NULL;
        char *out = malloc(len + 1);
        if (!out)
                return NULL;
        size_t o = 0;
        for (const char *s = p; *s;) {
                size_t n = strcspn(s, "/");
                if (n == 2 && s[0] == '.' && s[1] == '.') {
                        free(out);
                        *ret_why = "holds \"..\"";
                        return NULL;
                }
                if (n > 255) {
                        free(out);
                        *ret_why = "has a part longer than 255 bytes";
                        return NULL;
                }
                if (n && !(n == 1 && s[0] == '.')) {
                        if (o)
                                out[o++] = '/';
                        memcpy(out + o, s, n);
                        o += n;
                }
                s += n;
                s += strspn(s, "/");
        }
        out[o] = '\0';
        if (!o) {
                free(out);
                *ret_why = "names no file";
                return NULL;
        }
        return out;
}

static int file_cmp(const void *a, const void *b) {
        return strcmp(((const ImageFile *)a)->path, ((const ImageFile *)b)->path);
}

static int one_file(const json_t *o, const char *field, size_t i, ImageFiles *f, char *why, size_t why_len) {
        if (!json_is_object(o))
                return refuse(why, why_len, "%s[%zu] must be an object {path, content, encoding?, mode?}", field, i);
        const char *k;
        json_t *v;
        json_object_foreach((json_t *)o, k, v) if (strcmp(k, "path") && strcmp(k, "content") && strcmp(k, "encoding") &&
                                                   strcmp(k, "mode"))
                return refuse(why, why_len, "%s[%zu] has an unknown field %.64s (path, content, encoding, mode)",
                              field, i, k);
        json_t *path = json_object_get(o, "path"), *content = json_object_get(o, "content");
        json_t *enc = json_object_get(o, "encoding"), *mode = json_object_get(o, "mode");
        if (!json_is_string(path))
                return refuse(why, why_len, "%s[%zu].path must be a string", field, i);
        if (!json_is_string(content))
                return refuse(why, why_len, "%s[%zu].content must be a string", field, i);
        bool b64 = false;
        if (enc && !json_is_null(enc)) {
                const char *e = json_string_value(enc);
                b64 = e && strcmp(e, "base64") == 0;
                if (!b64 && !(e && (strcmp(e, "utf-8") == 0 || strcmp(e, "utf8") == 0)))
                        return refuse(why, why_len, "%s[%zu].encoding must be \"base64\" or \"utf-8\"", field, i);
        }
        ImageFile file = { .mode = 0644 };
        if (mode && !json_is_null(mode)) {
                if (!json_is_integer(mode) || json_integer_value(mode) < 0 || json_integer_value(mode) > 0777)
                        return refuse(why, why_len, "%s[%zu].mode must be permissions from 0 to 0777 (511)", field, i);
                file.mode = (unsigned)json_integer_value(mode);
        }
        const char *bad = NULL;
        file.path = clean_path(json_string_value(path), json_string_length(path), &bad);
        if (!file.path)
                return bad ? refuse(why, why_len, "%s[%zu].path %s", field, i, bad) : -ENOMEM;
        const char *c = json_string_value(content);
        size_t clen = json_string_length(content);
        uint64_t left = IMAGE_FILES_BYTES - f->bytes;
        int r = 0;
        if (b64) {
                r = base64_decode(c, clen, left, &file.data, &file.len);
                if (r == -EINVAL)
                        r = refuse(why, why_len, "%s[%zu].content is not base64 (RFC 4648, padded)", field, i);
        } else if (clen > left)
                r = -E2BIG;
        else if (!(file.data = malloc(clen ? clen : 1)))
                r = -ENOMEM;
        else {
                memcpy(file.data, c, clen);
                file.len = clen;
        }
        if (r == -E2BIG)
                r = refuse(why, why_len, "%s[%zu]: the files are over %u MiB together", field, i, IMAGE_FILES_BYTES >> 20);
        if (r < 0) {
                free(file.path);
                free(file.data);
                return r;
        }
        f->bytes += file.len;
        f->v[f->n++] = file;
        return 0;
}

/* Two files of one path, or a file where another needs a directory. */
static int clashes(const ImageFiles *f, const char *field, char *why, size_t why_len) {
        for (size_t i = 1; i < f->n; i++) {
                const char *a = f->v[i - 1].path, *b = f->v[i].path;
                size_t al = strlen(a);
                if (strcmp(a, b) == 0)
                        return refuse(why, why_len, "%s: %.256s is given twice", field, a);
                /* Sorted: a file under a comes right after it, or after
                 * names that sort between ("a-x" < "a/x"). */
                for (size_t j = i; j < f->n && strncmp(f->v[j].path, a, al) == 0; j++)
                        if (f->v[j].path[al] == '/')
                                return refuse(why, why_len, "%s: %.256s is a file, and %.256s is under it", field, a,
                                              f->v[j].path);
        }
        return 0;
}

int image_files_parse(const json_t *v, const char *field, ImageFiles *ret, char *why, size_t why_len) {
        *ret = (ImageFiles){ 0 };
        if (!json_is_array(v))
                return refuse(why, why_len, "%s must be an array of {path, content, encoding?, mode?}", field);
        if (json_array_size(v) > IMAGE_FILES_MAX)
                return refuse(why, why_len, "%s has %zu files; the most is %u", field, json_array_size(v),
                              IMAGE_FILES_MAX);
        ImageFiles f = { .v = calloc(json_array_size(v) + 1, sizeof(ImageFile)) };
        if (!f.v)
                return -ENOMEM;
        size_t i;
        json_t *o;
        int r = 0;
        json_array_foreach(v, i, o) if ((r = one_file(o, field, i, &f, why, why_len)) < 0) break;
        if (r == 0) {
                qsort(f.v, f.n, sizeof(*f.v), file_cmp);
                r = clashes(&f, field, why, why_len);
        }
        if (r < 0) {
                image_files_done(&f);
                return r;
        }
        *ret = f;
        return 0;
}

typedef struct Buf {
        uint8_t *p;
        size_t len, cap;
} Buf;

static int buf_write(void *userdata, const void *data, size_t n) {
        Buf *b = userdata;
        if (b->len + n > b->cap) {
                size_t cap = b->cap ? b->cap : 64 * 1024;
                while (cap < b->len + n)
                        cap *= 2;
                uint8_t *p = realloc(b->p, cap);
                if (!p)
                        return -ENOMEM;
                b->p = p;
                b->cap = cap;
        }
        memcpy(b->p + b->len, data, n);
        b->len += n;
        return 0;
}

int image_files_archive(const ImageFiles *f, uint8_t **ret, size_t *ret_len) {
        Buf b = { 0 };
        int r = 0;
        const char *prev = "";
        for (size_t i = 0; i < f->n && r == 0; i++) {
                /* The directories above the file not made for the one before
                 * it (sorted, so a directory's files come together). */
                const char *p = f->v[i].path;
                for (const char *s = strchr(p, '/'); s && r == 0; s = strchr(s + 1, '/')) {
                        size_t n = (size_t)(s - p);
                        if (strncmp(prev, p, n + 1) == 0)
                                continue;
                        char *dir = strndup(p, n + 1);
                        r = dir ? tar_write_entry(buf_write, &b, dir, '5', 0755, NULL, 0) : -ENOMEM;
                        free(dir);
                }
                if (r == 0)
                        r = tar_write_entry(buf_write, &b, p, '0', f->v[i].mode, f->v[i].data, f->v[i].len);
                prev = p;
        }
        if (r == 0)
                r = tar_write_end(buf_write, &b);
        if (r < 0) {
                free(b.p);
                return r;
        }
        *ret = b.p;
        *ret_len = b.len;
        return 0;
}

json_t *image_files_summary(const ImageFiles *f) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < f->n; i++) {
                uint8_t md[32];
                unsigned mdl = 0;
                char hex[65];
                if (EVP_Digest(f->v[i].data, f->v[i].len, md, &mdl, EVP_sha256(), NULL) != 1) {
                        json_decref(a);
                        return NULL;
                }
                hex_encode(md, sizeof md, hex);
                if (json_array_append_new(a, json_pack("{s:s,s:I,s:s,s:i}", "path", f->v[i].path, "size",
                                                       (json_int_t)f->v[i].len, "sha256", hex, "mode",
                                                       (int)f->v[i].mode)) < 0) {
                        json_decref(a);
                        return NULL;
                }
        }
        return a;
}

/* ---- a recipe's items ---- */

/* A Debian package as apt-get install takes it: name[:arch][=version or
 * /release], with no globs and no regular expressions. */
static bool apt_ok(const char *s) {
        size_t n = strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789+.-");
        if (n < 2 || !isalnum((unsigned char)s[0]))
                return false;
        s += n;
        if (*s == ':') {
                n = strspn(s + 1, "abcdefghijklmnopqrstuvwxyz0123456789-");
                if (!n)
                        return false;
                s += n + 1;
        }
        if (*s == '=' || *s == '/') {
                n = strspn(s + 1, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.+~:-");
                if (!n || !isalnum((unsigned char)s[1]))
                        return false;
                s += n + 1;
        }
        return *s == '\0';
}

/* A requirement pip takes (PEP 508's name[extras] and version specifiers,
 * a URL, or a path in the image), without markers, spaces or quotes. */
static bool pip_ok(const char *s) {
        if (!isalnum((unsigned char)s[0]) && s[0] != '.' && s[0] != '/')
                return false;
        static const char extra[] = "._-[],<>=!~*+/:@%";
        for (; *s; s++)
                if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
                        return false;
        return true;
}

/* A package npm takes: [@scope/]name[@version or range or tag], a path,
 * a tarball's or a git URL. */
static bool npm_ok(const char *s) {
        if (!isalnum((unsigned char)s[0]) && s[0] != '@' && s[0] != '.' && s[0] != '/')
                return false;
        static const char extra[] = "._-@/^~<>=:+*#";
        for (; *s; s++)
                if (!isalnum((unsigned char)*s) && !strchr(extra, *s))
                        return false;
        return true;
}

/* A registry's reference, or an image's name[:tag or @version]. */
static bool base_ok(const char *s) {
        if (!isalnum((unsigned char)s[0]) || strlen(s) > 255)
                return false;
        return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/:@") == strlen(s);
}

/* An absolute path of plain characters, no "." or ".." parts. */
static bool workdir_ok(const char *s) {
        if (s[0] != '/' || strlen(s) > 1024 ||
            strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-/+@") != strlen(s))
                return false;
        for (const char *p = s; *p;) {
                p += strspn(p, "/");
                size_t n = strcspn(p, "/");
                if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
                        return false;
                p += n;
        }
        return true;
}

static bool printable(const char *s, size_t len) {
        for (size_t i = 0; i < len; i++)
                if (((unsigned char)s[i] < 0x20 && s[i] != '\t') || s[i] == 0x7f)
                        return false;
        return true;
}

/* ---- the Dockerfile's text ---- */

typedef struct Text {
        char *p;
        size_t len, cap;
        ImageRecipe *r;
        bool failed;
} Text;

static void text_add(Text *t, const char *s, size_t n) {
        if (t->failed)
                return;
        if (t->len + n + 1 > t->cap) {
                size_t cap = t->cap ? t->cap : 1024;
                while (cap < t->len + n + 1)
                        cap *= 2;
                char *p = realloc(t->p, cap);
                if (!p) {
                        t->failed = true;
                        return;
                }
                t->p = p;
                t->cap = cap;
        }
        memcpy(t->p + t->len, s, n);
        t->len += n;
        t->p[t->len] = '\0';
}

static void text_str(Text *t, const char *s) {
        text_add(t, s, strlen(s));
}

/* A line ends: the field it came from noted. */
static void text_end(Text *t, const char *field) {
        text_str(t, "\n");
        char **f = t->failed ? NULL : realloc(t->r->fields, (t->r->n_fields + 1) * sizeof(*f));
        char *d = f ? strdup(field) : NULL;
        if (f)
                t->r->fields = f;
        if (!d) {
                t->failed = true;
                return;
        }
        t->r->fields[t->r->n_fields++] = d;
}

/* An exec-form RUN: its words as a JSON array, on one line. */
static void text_run_exec(Text *t, json_t *argv, const char *field) {
        char *s = argv ? json_dumps(argv, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
        if (!s)
                t->failed = true;
        text_str(t, "RUN ");
        if (s)
                text_str(t, s);
        free(s);
        text_end(t, field);
}

/* An ENV value in double quotes, for the Dockerfile's words and then its
 * expansion: \ and " escaped for the first, $ for the second. */
static void text_env(Text *t, const char *name, const char *value) {
        text_str(t, "ENV ");
        text_str(t, name);
        text_str(t, "=\"");
        for (const char *c = value; *c; c++) {
                if (*c == '\\' || *c == '"' || *c == '$')
                        text_str(t, "\\");
                text_add(t, c, 1);
        }
        text_str(t, "\"");
        text_end(t, "recipe.env");
}

/* The user's command: in the shell form when the Dockerfile reads it back
 * as it is, else as ["/bin/sh", "-c", command] (the same run). A "<<" is
 * the exec form's, where a heredoc is the shell's own. */
static void text_command(Text *t, const char *cmd, const char *field) {
        size_t n = strlen(cmd);
        bool plain = n && cmd[0] != '[' && cmd[0] != '-' && cmd[0] != '#' && !isspace((unsigned char)cmd[0]) &&
                     !isspace((unsigned char)cmd[n - 1]) && cmd[n - 1] != '\\' && printable(cmd, n) &&
                     !strchr(cmd, '\t') && !strstr(cmd, "<<");
        if (plain) {
                text_str(t, "RUN ");
                text_str(t, cmd);
                text_end(t, field);
                return;
        }
        _cleanup_json_ json_t *argv = json_pack("[s,s,s]", "/bin/sh", "-c", cmd);
        text_run_exec(t, argv, field);
}

/* ---- a recipe ---- */

void image_recipe_done(ImageRecipe *r) {
        if (!r)
                return;
        free(r->dockerfile);
        json_decref(r->record);
        image_files_done(&r->files);
        for (size_t i = 0; i < r->n_fields; i++)
                free(r->fields[i]);
        free(r->fields);
        *r = (ImageRecipe){ 0 };
}

const char *image_recipe_field_of_line(const ImageRecipe *r, unsigned line) {
        return line >= 1 && line <= r->n_fields ? r->fields[line - 1] : "recipe";
}

typedef bool (*ItemOk)(const char *s);

/* recipe.<key>: an array of at most max strings, each at most len bytes
 * and passing ok (NULL: any printable text). */
static int strings(const json_t *recipe, const char *key, size_t max, size_t len, ItemOk ok, const char *what,
                   char *why, size_t why_len) {
        json_t *a = json_object_get(recipe, key);
        if (!a || json_is_null(a))
                return 0;
        if (!json_is_array(a) || json_array_size(a) > max)
                return refuse(why, why_len, "recipe.%s must be an array of at most %zu strings", key, max);
        size_t i;
        json_t *v;
        json_array_foreach(a, i, v) {
                const char *s = json_string_value(v);
                if (!s || !s[0] || json_string_length(v) > len || strlen(s) != json_string_length(v))
                        return refuse(why, why_len, "recipe.%s[%zu] must be a string of 1 to %zu bytes", key, i, len);
                if (s[0] == '-')
                        return refuse(why, why_len, "recipe.%s[%zu] starts with \"-\": options are not taken, "
                                      "only %s", key, i, what);
                if (ok ? !ok(s) : !printable(s, strlen(s)))
                        return refuse(why, why_len, "recipe.%s[%zu] is not %s: %.64s", key, i, what, s);
        }
        return 0;
}

static int check(const json_t *v, char *why, size_t why_len) {
        static const char *const known[] = { "base", "apt", "pip", "npm", "commands", "env", "files", "workdir",
                                             "user" };
        if (!json_is_object(v))
                return refuse(why, why_len, "recipe must be an object {base, apt, pip, npm, commands, env, files, "
                              "workdir, user}");
        const char *k;
        json_t *x;
        json_object_foreach((json_t *)v, k, x) {
                bool found = false;
                for (size_t i = 0; i < ELEMENTSOF(known) && !found; i++)
                        found = strcmp(k, known[i]) == 0;
                if (!found)
                        return refuse(why, why_len, "recipe has an unknown field %.64s (base, apt, pip, npm, commands, "
                                      "env, files, workdir, user)", k);
        }
        x = json_object_get(v, "base");
        if (x && !json_is_null(x) && (!json_is_string(x) || !base_ok(json_string_value(x))))
                return refuse(why, why_len, "recipe.base must name an image: default, an image of yours, or a "
                              "registry's (python:3.12-slim)");
        x = json_object_get(v, "workdir");
        if (x && !json_is_null(x) && (!json_is_string(x) || !workdir_ok(json_string_value(x))))
                return refuse(why, why_len, "recipe.workdir must be an absolute path of letters, digits and "
                              "._-+@ with no . or .. part");
        x = json_object_get(v, "user");
        /* As a Dockerfile's USER: the image's users, root and sandbox. */
        if (x && !json_is_null(x) &&
            (!json_is_string(x) || (strcmp(json_string_value(x), "root") != 0 &&
                                    strcmp(json_string_value(x), "sandbox") != 0)))
                return refuse(why, why_len, "recipe.user must be \"root\" or \"sandbox\" (the image's users)");
        x = json_object_get(v, "env");
        if (x && !json_is_null(x)) {
                if (!json_is_object(x) || json_object_size(x) > IMAGE_RECIPE_ENV_MAX)
                        return refuse(why, why_len, "recipe.env must be an object of at most %u strings",
                                      IMAGE_RECIPE_ENV_MAX);
                json_t *e;
                json_object_foreach(x, k, e) {
                        if (!env_name_ok(k))
                                return refuse(why, why_len, "recipe.env: %.64s is not a variable's name", k);
                        if (!json_is_string(e) || json_string_length(e) > IMAGE_RECIPE_ENV_VALUE_LEN ||
                            strlen(json_string_value(e)) != json_string_length(e) ||
                            !printable(json_string_value(e), json_string_length(e)))
                                return refuse(why, why_len, "recipe.env.%.64s must be a string of at most %u bytes "
                                              "with no line breaks", k, IMAGE_RECIPE_ENV_VALUE_LEN);
                }
        }
        int r;
        if ((r = strings(v, "apt", IMAGE_RECIPE_PACKAGES_MAX, 128, apt_ok, "a Debian package (name[:arch][=version])",
                         why, why_len)) < 0 ||
            (r = strings(v, "pip", IMAGE_RECIPE_PACKAGES_MAX, IMAGE_RECIPE_PACKAGE_LEN, pip_ok,
                         "a pip requirement (name[extras]==version, a URL or a path; no spaces, quotes or ;)", why,
                         why_len)) < 0 ||
            (r = strings(v, "npm", IMAGE_RECIPE_PACKAGES_MAX, IMAGE_RECIPE_PACKAGE_LEN, npm_ok,
                         "an npm package ([@scope/]name[@version], a path or a URL)", why, why_len)) < 0)
                return r;
        /* A command is the user's own shell line: any text but a NUL. */
        json_t *c = json_object_get(v, "commands");
        if (c && !json_is_null(c)) {
                if (!json_is_array(c) || json_array_size(c) > IMAGE_RECIPE_COMMANDS_MAX)
                        return refuse(why, why_len, "recipe.commands must be an array of at most %u strings",
                                      IMAGE_RECIPE_COMMANDS_MAX);
                size_t i;
                json_array_foreach(c, i, x) if (!json_is_string(x) || !json_string_length(x) ||
                                                json_string_length(x) > IMAGE_RECIPE_COMMAND_LEN ||
                                                strlen(json_string_value(x)) != json_string_length(x))
                        return refuse(why, why_len, "recipe.commands[%zu] must be a string of 1 to %u bytes", i,
                                      IMAGE_RECIPE_COMMAND_LEN);
        }
        return 0;
}

static json_t *words(const char *const *head, size_t n, const json_t *items) {
        json_t *a = json_array();
        for (size_t i = 0; a && i < n; i++)
                if (json_array_append_new(a, json_string(head[i])) < 0) {
                        json_decref(a);
                        return NULL;
                }
        if (a && json_array_extend(a, (json_t *)items) < 0) {
                json_decref(a);
                return NULL;
        }
        return a;
}

static int key_cmp(const void *a, const void *b) {
        return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The steps, in their fixed order: FROM, ENV (by name), WORKDIR, apt, the
 * files, pip, npm, each command, then USER. */
static void make_text(const json_t *v, Text *t) {
        const char *base = json_string_value(json_object_get(v, "base"));
        text_str(t, "FROM ");
        text_str(t, base ? base : IMAGE_RECIPE_BASE_DEFAULT);
        text_end(t, "recipe.base");
        json_t *env = json_object_get(v, "env");
        const char *names[IMAGE_RECIPE_ENV_MAX];
        size_t n = 0;
        const char *k;
        json_t *x;
        json_object_foreach(env, k, x) if (n < IMAGE_RECIPE_ENV_MAX) names[n++] = k;
        qsort(names, n, sizeof(*names), key_cmp);
        for (size_t i = 0; i < n; i++)
                text_env(t, names[i], json_string_value(json_object_get(env, names[i])));
        const char *wd = json_string_value(json_object_get(v, "workdir"));
        text_str(t, "WORKDIR ");
        text_str(t, wd ? wd : IMAGE_RECIPE_WORKDIR_DEFAULT);
        text_end(t, "recipe.workdir");
        json_t *apt = json_object_get(v, "apt");
        if (json_array_size(apt)) {
                /* The packages are the script's arguments ("$@"), never its text. */
                static const char *const head[] = { "/bin/sh", "-c",
                                                    "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y "
                                                    "--no-install-recommends \"$@\" && rm -rf /var/lib/apt/lists/*",
                                                    "apt" };
                _cleanup_json_ json_t *argv = words(head, ELEMENTSOF(head), apt);
                text_run_exec(t, argv, "recipe.apt");
        }
        if (t->r->files.n) {
                text_str(t, "COPY . ./");
                text_end(t, "recipe.files");
        }
        json_t *pip = json_object_get(v, "pip");
        if (json_array_size(pip)) {
                static const char *const head[] = { "env", "PIP_BREAK_SYSTEM_PACKAGES=1", "PIP_ROOT_USER_ACTION=ignore",
                                                    "python3", "-m", "pip", "install", "--no-cache-dir",
                                                    "--disable-pip-version-check", "--" };
                _cleanup_json_ json_t *argv = words(head, ELEMENTSOF(head), pip);
                text_run_exec(t, argv, "recipe.pip");
        }
        json_t *npm = json_object_get(v, "npm");
        if (json_array_size(npm)) {
                static const char *const head[] = { "npm", "install", "-g", "--" };
                _cleanup_json_ json_t *argv = words(head, ELEMENTSOF(head), npm);
                text_run_exec(t, argv, "recipe.npm");
        }
        json_t *cmds = json_object_get(v, "commands");
        size_t i;
        json_array_foreach(cmds, i, x) {
                char field[64];
                snprintf(field, sizeof field, "recipe.commands[%zu]", i);
                text_command(t, json_string_value(x), field);
        }
        /* Last: every line above runs as root, the image's sandboxes as the user. */
        const char *user = json_string_value(json_object_get(v, "user"));
        if (user) {
                text_str(t, "USER ");
                text_str(t, user);
                text_end(t, "recipe.user");
        }
}

int image_recipe_parse(const json_t *v, ImageRecipe *ret, char *why, size_t why_len) {
        *ret = (ImageRecipe){ 0 };
        int r = check(v, why, why_len);
        if (r < 0)
                return r;
        ImageRecipe rec = { 0 };
        json_t *files = json_object_get(v, "files");
        if (files && !json_is_null(files) && (r = image_files_parse(files, "recipe.files", &rec.files, why, why_len)) < 0)
                return r;
        Text t = { .r = &rec };
        make_text(v, &t);
        rec.dockerfile = t.p;
        rec.record = json_deep_copy(v);
        json_t *summary = rec.files.n ? image_files_summary(&rec.files) : NULL;
        if (t.failed || !rec.record || (rec.files.n && (!summary || json_object_set_new(rec.record, "files", summary) < 0))) {
                image_recipe_done(&rec);
                return -ENOMEM;
        }
        if (t.len > DOCKERFILE_MAX_BYTES) {
                image_recipe_done(&rec);
                return refuse(why, why_len, "recipe makes a Dockerfile of %zu KiB; the most is %u KiB", t.len >> 10,
                              DOCKERFILE_MAX_BYTES >> 10);
        }
        *ret = rec;
        return 0;
}
