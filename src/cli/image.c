#include "cli/image.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/evp.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/parse.h"
#include "common/macro.h"

static const char build_usage[] =
        "[--force] [NAME] | -f DOCKERFILE -t NAME[:TAG] [--internet] [--allow HOST] [--deny HOST]\n"
        "                          [--secret id=ID[,src=FILE|,env=VAR]] DIR";
static const char build_help[] =
        "Builds the image NAME, default, minimal, analysis or desktop (default: default),\n"
        "from Debian's archive, a few minutes, printing its steps as they happen (mmdebstrap's\n"
        "steps and a count of its packages). Where runtimed offers the microvm driver, the image's\n"
        "microVM kernel and disk follow. An image already built from the same recipe is\n"
        "kept unless --force.\n\n"
        "With -t, builds an image of your own instead (docs/images.md): DIR is packed as\n"
        "its build context (tar, leaving out .git and what DIR/.dockerignore names as tar's\n"
        "--exclude-from reads it), the chunks runtimed lacks are sent, and the build's log\n"
        "is printed as it happens. Its steps reach no host unless --internet or --allow says so\n"
        "(the build's network, as a sandbox's; not part of the build cache's key).\n\n"
        "Options:\n"
        "  --force            build again even when the image is up to date\n"
        "  -f, --file PATH    the Dockerfile (default: DIR/Dockerfile)\n"
        "  -t, --tag NAME[:TAG]  the image's name, and its tag (default: latest)\n"
        "  --internet         let the steps reach any public host on ports 80 and 443\n"
        "  --allow HOST       let them reach HOST only (example.com, *.example.com, host:port;\n"
        "                     repeatable)\n"
        "  --deny HOST        never let them reach HOST (repeatable)\n"
        "  --secret id=ID,src=FILE | id=ID,env=VAR\n"
        "                     a build secret, what RUN --mount=type=secret,id=ID reads while that\n"
        "                     step runs: FILE's bytes or VAR's value (VAR is ID unless given;\n"
        "                     repeatable); never stored, and not in the build cache's key\n\n"
        "Examples:\n"
        "  runtime image build\n"
        "  runtime image build analysis\n"
        "  runtime image build desktop\n"
        "  runtime image build -t app:v1 .\n"
        "  runtime image build --allow pypi.org --allow files.pythonhosted.org -t app .\n"
        "  runtime image build --secret id=npmrc,src=$HOME/.npmrc -t app .\n";

typedef struct BuildOutcome {
        bool json, done, failed;
        CliError err;
} BuildOutcome;

static int on_build_event(const char *line, size_t len, void *userdata) {
        BuildOutcome *o = userdata;
        _cleanup_json_ json_t *ev = json_loadb(line, len, 0, NULL);
        const char *type = json_string_value(json_object_get(ev, "type"));

        if (!type)
                return -EBADMSG;
        if (o->json) {
                fwrite(line, 1, len, stdout);
                fputc('\n', stdout);
        } else if (strcmp(type, "log") == 0 || strcmp(type, "line") == 0) {
                json_t *l = json_object_get(ev, "line");
                if (json_is_string(l)) {
                        fwrite(json_string_value(l), 1, json_string_length(l), stdout);
                        fputc('\n', stdout);
                }
        }
        if (fflush(stdout) != 0)
                return -errno ?: -EIO;
        if (strcmp(type, "done") == 0)
                o->done = true;
        else if (strcmp(type, "error") == 0) {
                o->failed = true;
                cli_error_from_json(&o->err, 0, line, len);
        }
        return 0;
}

/* DIR as a gzipped tar, the same bytes for the same files (names
 * sorted, no owners or times), in *ret (malloc'ed). */
static int pack_dir(const char *dir, char **ret, size_t *ret_len) {
        /* The directory goes to the shell single-quoted. */
        size_t n = strlen(dir);
        _cleanup_free_ char *q = malloc(n * 4 + 3), *cmd = NULL;
        if (!q)
                return -ENOMEM;
        size_t o = 0;
        q[o++] = '\'';
        for (size_t i = 0; i < n; i++) {
                if (dir[i] == '\'') {
                        memcpy(q + o, "'\\''", 4);
                        o += 4;
                } else
                        q[o++] = dir[i];
        }
        q[o++] = '\'';
        q[o] = '\0';
        if (asprintf(&cmd,
                     "cd %s && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --exclude=./.git "
                     "$( [ -f .dockerignore ] && echo --exclude-from=.dockerignore ) -cf - . | gzip -n",
                     q) < 0)
                return -ENOMEM;
        FILE *f = popen(cmd, "r");
        if (!f)
                return -errno;
        char *buf = NULL;
        size_t len = 0, cap = 0;
        for (;;) {
                if (len == cap) {
                        char *m = realloc(buf, cap = cap ? cap * 2 : 1 << 20);
                        if (!m) {
                                free(buf);
                                pclose(f);
                                return -ENOMEM;
                        }
                        buf = m;
                }
                size_t got = fread(buf + len, 1, cap - len, f);
                if (got == 0)
                        break;
                len += got;
        }
        if (pclose(f) != 0) {
                free(buf);
                return -EIO;
        }
        *ret = buf;
        *ret_len = len;
        return 0;
}

static void sha256_hex(const void *data, size_t len, char out[65]) {
        unsigned char md[32];
        unsigned mdlen = 0;
        EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
        for (int i = 0; i < 32; i++)
                snprintf(out + 2 * i, 3, "%02x", md[i]);
}

#define CHUNK (1024 * 1024)

/* Sends the chunks of archive runtimed lacks; the context a build names. */
static int send_context(Client *c, const char *archive, size_t len, json_t **ret, CliError *e) {
        char whole[65];
        sha256_hex(archive, len, whole);
        _cleanup_json_ json_t *digests = json_array(), *ans = NULL;
        if (!digests)
                return -ENOMEM;
        for (size_t at = 0; at < len || (at == 0 && len == 0); at += CHUNK) {
                char d[65];
                sha256_hex(archive + at, len - at < CHUNK ? len - at : CHUNK, d);
                json_array_append_new(digests, json_string(d));
                if (len == 0)
                        break;
        }
        int r = client_json(c, "POST", "/v1/images/context/missing",
                            json_pack("{s:O}", "digests", digests), &ans, e);
        if (r < 0)
                return r;
        json_t *missing = json_object_get(ans, "missing");
        size_t sent = 0, total = json_array_size(missing);
        for (size_t i = 0; i < json_array_size(digests); i++) {
                const char *d = json_string_value(json_array_get(digests, i));
                bool want = false;
                for (size_t k = 0; k < total && !want; k++)
                        want = strcmp(json_string_value(json_array_get(missing, k)), d) == 0;
                if (!want)
                        continue;
                size_t at = i * CHUNK, n = len - at < CHUNK ? len - at : CHUNK;
                int fd = memfd_create("chunk", MFD_CLOEXEC);
                if (fd < 0)
                        return -errno;
                if (write(fd, archive + at, n) != (ssize_t)n || lseek(fd, 0, SEEK_SET) < 0) {
                        close(fd);
                        return -EIO;
                }
                char path[128];
                snprintf(path, sizeof path, "/v1/images/context/%s", d);
                json_t *put = NULL;
                r = client_upload(c, path, fd, (long long)n, &put, e);
                close(fd);
                json_decref(put);
                if (r < 0)
                        return r;
                sent++;
                fprintf(stderr, "runtime: sent %zu of %zu context chunks (%.1f MiB)\n", sent, total,
                        (double)len / (1024 * 1024));
        }
        if (total == 0)
                fprintf(stderr, "runtime: the build context (%.1f MiB) is on runtimed already\n",
                        (double)len / (1024 * 1024));
        *ret = json_pack("{s:{s:s,s:I,s:O},s:[]}", "archive", "sha256", whole, "size", (json_int_t)len, "chunks",
                         digests, "files");
        return *ret ? 0 : -ENOMEM;
}

static int follow_build(CliContext *ctx, Client *c, json_t *image, const char *name, const char *t);

/* NAME[:TAG] into its name (malloc'ed) and tag (in it, or "latest"). */
static char *split_tag(const char *ref, const char **ret_tag) {
        char *name = strdup(ref);
        *ret_tag = "latest";
        char *colon = name ? strrchr(name, ':') : NULL;
        if (colon && !strchr(colon, '/')) {
                *colon = '\0';
                *ret_tag = colon + 1;
        }
        return name;
}

/* --secret id=ID[,src=FILE|,env=VAR] into secrets ({id: value}): the file's
 * bytes (at most 16 KiB, the daemon's bound) or the variable's value, VAR
 * being ID unless given, as docker build reads it. The daemon checks the id. */
static int add_secret(json_t *secrets, const char *spec) {
        _cleanup_free_ char *copy = strdup(spec), *value = NULL;
        const char *id = NULL, *src = NULL, *env = NULL;
        if (!copy)
                return cli_fail("out of memory");
        char *save = NULL;
        for (char *kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
                if (strncmp(kv, "id=", 3) == 0)
                        id = kv + 3;
                else if (strncmp(kv, "src=", 4) == 0 || strncmp(kv, "source=", 7) == 0)
                        src = strchr(kv, '=') + 1;
                else if (strncmp(kv, "env=", 4) == 0)
                        env = kv + 4;
                else
                        return cli_usage_error("image build", build_usage, "--secret takes id=, src= or env=, not "
                                               "'%.40s'", kv);
        }
        if (!id || !*id || (src && env))
                return cli_usage_error("image build", build_usage, "--secret needs id=ID, and src=FILE or env=VAR "
                                       "(not both)");
        if (src) {
                FILE *f = fopen(src, "re");
                if (!f)
                        return cli_fail("cannot read the secret %s's file %s: %s", id, src, strerror(errno));
                value = malloc(16 * 1024 + 1);
                size_t n = value ? fread(value, 1, 16 * 1024 + 1, f) : 0;
                bool bad = ferror(f);
                fclose(f);
                if (!value)
                        return cli_fail("out of memory");
                if (bad || n > 16 * 1024)
                        return cli_fail("the secret %s's file %s is unreadable or larger than 16 KiB", id, src);
                value[n] = '\0';
                if (strlen(value) != n)
                        return cli_fail("the secret %s's file %s holds a NUL byte", id, src);
        } else {
                const char *v = getenv(env ? env : id);
                if (!v)
                        return cli_fail("the secret %s: the variable %s is not set", id, env ? env : id);
                if (!(value = strdup(v)))
                        return cli_fail("out of memory");
        }
        json_t *j = json_stringn(value, strlen(value));
        if (!j)
                return cli_fail("the secret %s is not UTF-8 text", id);
        if (json_object_set_new(secrets, id, j) < 0)
                return cli_fail("out of memory");
        return 0;
}

/* network: the build's {internet, allow, deny} as the flags gave it, or
 * NULL (none); the daemon is the judge of the patterns. secrets: the
 * --secret values, or NULL. */
static int build_dockerfile(CliContext *ctx, const char *file, const char *tag, const char *dir, json_t *network,
                            json_t *secrets) {
        _cleanup_client_ Client *c = NULL;
        const char *t;
        _cleanup_free_ char *name = split_tag(tag, &t), *path = NULL, *text = NULL, *archive = NULL;
        if (!name)
                return cli_fail("out of memory");
        if (!file) {
                if (asprintf(&path, "%s/Dockerfile", dir) < 0)
                        return cli_fail("out of memory");
                file = path;
        }
        FILE *f = fopen(file, "re");
        if (!f)
                return cli_fail("cannot read %s: %s", file, strerror(errno));
        size_t cap = 0;
        ssize_t got = getdelim(&text, &cap, '\0', f);
        fclose(f);
        if (got < 0)
                return cli_fail("cannot read %s", file);
        size_t len = 0;
        int r = pack_dir(dir, &archive, &len);
        if (r < 0)
                return cli_fail("cannot pack %s as the build context (tar and gzip)", dir);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        CliError e;
        _cleanup_json_ json_t *context = NULL, *image = NULL;
        if ((r = send_context(c, archive, len, &context, &e)) < 0)
                return r == -ENOMEM || r == -EIO ? cli_fail("sending the build context failed") : cli_error_print(&e);
        json_t *body = json_pack("{s:s,s:s,s:[s],s:O}", "dockerfile", text, "name", name, "tags", t, "context",
                                 context);
        if (body && network && json_object_set_new(body, "build", json_pack("{s:O}", "network", network)) < 0)
                json_decref(TAKE_PTR(body));
        if (body && secrets && json_object_set(body, "secrets", secrets) < 0)
                json_decref(TAKE_PTR(body));
        r = client_json(c, "POST", "/v1/images", body, &image, &e);
        if (r < 0)
                return cli_error_print(&e);
        return follow_build(ctx, c, image, name, t);
}

/* An image queued: its log followed to its end, printed as it comes. */
static int follow_build(CliContext *ctx, Client *c, json_t *image, const char *name, const char *t) {
        CliError e;
        int r;
        const char *id = json_string_value(json_object_get(image, "id"));
        fprintf(stderr, "runtime: image %s (%s:%s, version %lld) queued\n", id ? id : "?", name, t,
                (long long)json_integer_value(json_object_get(image, "version")));
        char logs[128];
        snprintf(logs, sizeof logs, "/v1/images/%s/logs?follow=true", id ? id : "");
        BuildOutcome o = {.json = ctx->json};
        r = client_stream_lines(c, "GET", logs, NULL, on_build_event, &o, &e);
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r == -EBADMSG)
                return cli_fail("runtimed sent an event this client cannot read");
        if (r < 0)
                return cli_error_print(&e);
        if (o.failed)
                return cli_error_print(&o.err);
        if (!o.done)
                return cli_fail("the build log ended before the build finished");
        if (!ctx->json)
                fprintf(stderr, "runtime: image %s:%s is ready (%s)\n", name, t, id);
        return CLI_EXIT_OK;
}

int cmd_image_build(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"force", no_argument, NULL, 'F'},
                {"file", required_argument, NULL, 'f'},
                {"tag", required_argument, NULL, 't'},
                {"json", no_argument, NULL, 'j'},
                {"internet", no_argument, NULL, 'i'},
                {"allow", required_argument, NULL, 'a'},
                {"deny", required_argument, NULL, 'd'},
                {"secret", required_argument, NULL, 's'},
                {NULL, 0, NULL, 0},
        };
        const char *file = NULL, *tag = NULL;
        _cleanup_json_ json_t *network = NULL, *secrets = NULL;
        _cleanup_client_ Client *c = NULL;
        BuildOutcome o = {.json = ctx->json};
        const char *name = "default";
        bool force = false;
        char path[160];
        CliError e;
        int ch, r;

        optind = 0;
        opterr = 0;
        while ((ch = getopt_long(argc, argv, "hf:t:", opts, NULL)) != -1) {
                if (ch == 'h')
                        return cli_help("image build", build_usage, build_help);
                if (ch == 'F')
                        force = true;
                else if (ch == 'f')
                        file = optarg;
                else if (ch == 't')
                        tag = optarg;
                else if (ch == 'j')
                        o.json = ctx->json = true;
                else if (ch == 's') {
                        if (!secrets && !(secrets = json_object()))
                                return cli_fail("out of memory");
                        if ((r = add_secret(secrets, optarg)) != 0)
                                return r;
                } else if (ch == 'i' || ch == 'a' || ch == 'd') {
                        if (!network && !(network = json_pack("{s:b,s:[],s:[]}", "internet", false, "allow", "deny")))
                                return cli_fail("out of memory");
                        json_t *host = ch == 'i' ? NULL : json_string(optarg);
                        if (ch == 'i')
                                json_object_set_new(network, "internet", json_true());
                        else if (!host)
                                return cli_usage_error("image build", build_usage, "'%.80s' is not a host pattern",
                                                       optarg);
                        else if (json_array_append_new(json_object_get(network, ch == 'a' ? "allow" : "deny"),
                                                       host) < 0)
                                return cli_fail("out of memory");
                } else
                        return cli_usage_error("image build", build_usage, "unknown option '%s'",
                                               argv[optind - 1]);
        }
        if (tag || file) {
                if (!tag || argc - optind != 1)
                        return cli_usage_error("image build", build_usage, "give -t NAME[:TAG] and one DIR");
                return build_dockerfile(ctx, file, tag, argv[optind], network, secrets);
        }
        if (network || secrets)
                return cli_usage_error("image build", build_usage,
                                       "--internet, --allow, --deny and --secret are for -t builds");
        if (argc - optind > 1)
                return cli_usage_error("image build", build_usage, "too many arguments");
        if (argc - optind == 1)
                name = argv[optind];
        if (!image_name_valid(name))
                return cli_usage_error("image build", build_usage, "'%.80s' is not an image name", name);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/images/%s:build%s", name, force ? "?force=1" : "");
        r = client_stream_lines(c, "POST", path, NULL, on_build_event, &o, &e);
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r == -EBADMSG)
                return cli_fail("runtimed sent an event this client cannot read");
        if (r < 0)
                return cli_error_print(&e);
        if (o.failed)
                return cli_error_print(&o.err);
        if (!o.done)
                return cli_fail("the build log ended before the build finished");
        if (!ctx->json)
                fprintf(stderr, "runtime: image %s is built\n", name);
        return CLI_EXIT_OK;
}

static const char import_usage[] = "-t NAME[:TAG] FILE";
static const char import_help[] =
        "Imports an image from an OCI layout archive (skopeo copy ... oci-archive:FILE) or a\n"
        "docker save archive: runtimed reads it as it pulls from a registry and records it as\n"
        "NAME:TAG, printing the log as it happens.\n\n"
        "Example:\n  docker save python:3.12-slim -o py.tar && runtime image import -t py:3.12 py.tar\n";

int cmd_image_import(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"tag", required_argument, NULL, 't'},
                {"json", no_argument, NULL, 'j'},
                {NULL, 0, NULL, 0},
        };
        const char *ref = NULL;
        int ch;
        optind = 0;
        opterr = 0;
        while ((ch = getopt_long(argc, argv, "ht:", opts, NULL)) != -1) {
                if (ch == 'h')
                        return cli_help("image import", import_usage, import_help);
                if (ch == 't')
                        ref = optarg;
                else if (ch == 'j')
                        ctx->json = true;
                else
                        return cli_usage_error("image import", import_usage, "unknown option '%s'", argv[optind - 1]);
        }
        if (!ref || argc - optind != 1)
                return cli_usage_error("image import", import_usage, "give -t NAME[:TAG] and one FILE");
        const char *t;
        _cleanup_free_ char *name = split_tag(ref, &t), *ename = NULL, *etag = NULL, *path = NULL;
        if (!name)
                return cli_fail("out of memory");
        _cleanup_close_ int fd = open(argv[optind], O_RDONLY | O_CLOEXEC);
        struct stat st;
        if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
                return cli_fail("cannot read %s: %s", argv[optind], fd < 0 ? strerror(errno) : "not a file");
        _cleanup_client_ Client *c = NULL;
        int r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        CURL *esc = curl_easy_init();
        if (esc) {
                char *a = curl_easy_escape(esc, name, 0), *b = curl_easy_escape(esc, t, 0);
                ename = a ? strdup(a) : NULL;
                etag = b ? strdup(b) : NULL;
                curl_free(a);
                curl_free(b);
                curl_easy_cleanup(esc);
        }
        if (!ename || !etag || asprintf(&path, "/v1/images/import?name=%s&tag=%s", ename, etag) < 0)
                return cli_fail("out of memory");
        fprintf(stderr, "runtime: sending %s (%.1f MiB)\n", argv[optind], (double)st.st_size / (1024 * 1024));
        CliError e;
        _cleanup_json_ json_t *image = NULL;
        if ((r = client_upload(c, path, fd, (long long)st.st_size, &image, &e)) < 0)
                return cli_error_print(&e);
        return follow_build(ctx, c, image, name, t);
}

static const char ls_help[] =
        "Lists the images and whether they are built.\n\nExample:\n  runtime image ls\n";

int cmd_image_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "image ls", ls_help, argc, argv, "/v1/images", &ans);
        if (r != CLI_PROCEED)
                return r;
        format_image_table(stdout, json_object_get(ans, "images"));
        return CLI_EXIT_OK;
}
