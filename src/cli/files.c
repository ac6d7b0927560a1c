#include "cli/files.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/format.h"
#include "common/tar.h"
#include "cli/parse.h"
#include "common/io.h"
#include "common/macro.h"

#define FILES_DEPTH_MAX 10

static const char get_usage[] = "ID PATH [LOCAL]";
static const char get_help[] =
        "Copies the file PATH out of sandbox ID into LOCAL (a file, or a directory to put it\n"
        "in), or to stdout when LOCAL is missing or '-'. The bytes stream as they come; a\n"
        "LOCAL file appears only once it is complete. A relative PATH is under /workspace.\n\n"
        "Examples:\n"
        "  runtime files get sbx_9f2c4e1a7b3d5c6e8f01 out/report.csv .\n"
        "  runtime files get sbx_9f2c4e1a7b3d5c6e8f01 /etc/os-release | head -3\n";

static const char put_usage[] = "[--mode MODE] ID LOCAL PATH";
static const char put_help[] =
        "Copies LOCAL ('-' for stdin) into sandbox ID as PATH, streamed. The write is atomic\n"
        "and makes parent directories. A relative PATH is under /workspace.\n\n"
        "Options:\n"
        "  --mode MODE   the file's permission bits in octal, e.g. 755 (default: the daemon's, 644)\n\n"
        "Examples:\n"
        "  runtime files put sbx_9f2c4e1a7b3d5c6e8f01 data.csv data.csv\n"
        "  tar cz src | runtime files put sbx_9f2c4e1a7b3d5c6e8f01 - /tmp/src.tgz\n";

static const char ls_usage[] = "[--depth N] ID [PATH]";
static const char ls_help[] = "Lists the directory PATH (default /workspace) of sandbox ID.\n\n"
                              "Options:\n"
                              "  --depth N   descend N levels, 1 to 10 (default 1)\n\n"
                              "Example:\n"
                              "  runtime files ls --depth 2 sbx_9f2c4e1a7b3d5c6e8f01 /workspace\n";

/* Parses a verb's options: --help and, when given, one valued option. */
static int parse_opts(CliContext *ctx, const char *verb, const char *usage, const char *help,
                      const char *valued, int argc, char **argv, const char **ret_value, int *ret_optind) {
        struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {valued ? valued : "help", required_argument, NULL, 'v'},
                {NULL, 0, NULL, 0},
        };
        int c;

        optind = 0;
        opterr = 0;
        while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
                switch (c) {
                case 'h':
                        return cli_help(verb, usage, help);
                case 'v':
                        *ret_value = optarg;
                        break;
                case 'j':
                        ctx->json = true;
                        break;
                case ':':
                        return cli_usage_error(verb, usage, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error(verb, usage, "unknown option '%s'", argv[optind - 1]);
                }
        }
        *ret_optind = optind;
        return CLI_PROCEED;
}

/* /v1/sandboxes/ID/files/ROUTE?path=PATH[EXTRA]; EXTRA is "&name=value..." or NULL. */
static char *files_route(const char *id, const char *route, const char *path, const char *extra) {
        _cleanup_free_ char *esc = url_escape(path);
        char *r;

        if (!esc)
                return NULL;
        if (asprintf(&r, "/v1/sandboxes/%s/files/%s?path=%s%s", id, route, esc, extra ? extra : "") < 0)
                return NULL;
        return r;
}

char *files_local_target(const char *local, const char *remote, int *ret_errno) {
        struct stat st;
        const char *base;
        size_t n;
        char *r;

        if (stat(local, &st) < 0 || !S_ISDIR(st.st_mode))
                return strdup(local);
        n = strlen(remote);
        while (n > 0 && remote[n - 1] == '/')
                n--;
        base = remote;
        for (size_t i = 0; i < n; i++)
                if (remote[i] == '/')
                        base = remote + i + 1;
        n -= (size_t)(base - remote);
        if (n == 0 || (n == 1 && base[0] == '.') || (n == 2 && base[0] == '.' && base[1] == '.')) {
                *ret_errno = EISDIR;
                return NULL;
        }
        if (asprintf(&r, "%s/%.*s", local, (int)n, base) < 0) {
                *ret_errno = ENOMEM;
                return NULL;
        }
        return r;
}

typedef struct FileSink {
        int fd;
        int write_errno; /* why writing the local side failed */
} FileSink;

static int write_fd(const void *data, size_t len, void *userdata) {
        FileSink *sink = userdata;
        int r = io_write_all(sink->fd, data, len);
        if (r < 0)
                sink->write_errno = -r;
        return r;
}

int cmd_files_get(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_free_ char *path = NULL, *target = NULL, *tmp = NULL, *dir_copy = NULL;
        _cleanup_close_ int fd = -1;
        const char *unused = NULL, *local;
        char err[CLI_ERR_MAX];
        FileSink sink = {.fd = STDOUT_FILENO};
        struct stat st;
        int r, first, e = 0;
        CliError ce;

        r = parse_opts(ctx, "files get", get_usage, get_help, NULL, argc, argv, &unused, &first);
        if (r != CLI_PROCEED)
                return r;
        if (argc - first < 2 || argc - first > 3)
                return cli_usage_error("files get", get_usage,
                                       argc - first < 2 ? "missing arguments" : "too many arguments");
        r = cli_check_id("files get", get_usage, argv[first]);
        if (r > 0)
                return r;
        if (sandbox_path_check(argv[first + 1], err, sizeof(err)) < 0)
                return cli_usage_error("files get", get_usage, "%s", err);
        local = argc - first == 3 ? argv[first + 2] : "-";
        path = files_route(argv[first], "content", argv[first + 1], NULL);
        if (!path)
                return cli_fail("out of memory");
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;

        if (strcmp(local, "-") != 0) {
                mode_t mask;

                target = files_local_target(local, argv[first + 1], &e);
                if (!target)
                        return cli_fail("%s: %s", local,
                                        e == EISDIR ? "is a directory and PATH names no file to put in it"
                                                    : strerror(e));
                if (stat(target, &st) == 0 && !S_ISREG(st.st_mode)) {
                        /* A device or a pipe (/dev/stdout, a fifo) is written
                         * in place: renaming over it would replace it. */
                        fd = open(target, O_WRONLY | O_CLOEXEC | O_NOCTTY);
                        if (fd < 0)
                                return cli_fail("cannot write %s: %s", target, strerror(errno));
                        sink.fd = fd;
                        goto download;
                }
                /* A temporary name next to the target, renamed into place
                 * when complete: no half-written file under the real name. */
                dir_copy = strdup(target);
                if (!dir_copy || asprintf(&tmp, "%s/.runtime-get-XXXXXX", dirname(dir_copy)) < 0) {
                        tmp = NULL;
                        return cli_fail("out of memory");
                }
                fd = mkostemp(tmp, O_CLOEXEC);
                if (fd < 0) {
                        e = errno;
                        free(tmp);
                        tmp = NULL;
                        return cli_fail("cannot write %s: %s", target, strerror(e));
                }
                mask = umask(0);
                umask(mask);
                (void)fchmod(fd, 0666 & ~mask);
                sink.fd = fd;
        }
download:
        r = client_download(c, path, write_fd, &sink, &ce);
        if (r == 0 && tmp && fsync(fd) < 0) {
                sink.write_errno = errno;
                r = -errno;
        }
        if (r == 0 && tmp) {
                if (close(TAKE_FD(fd)) < 0 || rename(tmp, target) < 0) {
                        e = errno;
                        unlink(tmp);
                        return cli_fail("cannot write %s: %s", target, strerror(e));
                }
                return CLI_EXIT_OK;
        }
        if (r == 0)
                return CLI_EXIT_OK;
        if (tmp)
                unlink(tmp);
        if (r == -EINTR)
                return cli_interrupted_exit();
        /* The reader went away, as with SIGPIPE: a pipe says EPIPE, a socket
         * closed with output unread ECONNRESET. */
        if (sink.write_errno == EPIPE || (!target && sink.write_errno == ECONNRESET))
                return 141;
        if (sink.write_errno)
                return cli_fail("cannot write %s: %s", target ? target : "stdout",
                                strerror(sink.write_errno));
        return cli_error_print(&ce);
}

static bool mode_valid(const char *m) {
        size_t n = strlen(m);

        if (n < 1 || n > 4)
                return false;
        for (size_t i = 0; i < n; i++)
                if (m[i] < '0' || m[i] > '7')
                        return false;
        return true;
}

int cmd_files_put(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_free_ char *path = NULL, *extra = NULL;
        _cleanup_json_ json_t *ans = NULL;
        _cleanup_close_ int fd = -1;
        const char *mode = NULL, *local;
        char err[CLI_ERR_MAX];
        long long size = -1;
        int r, first, in_fd;
        struct stat st;
        CliError ce;

        r = parse_opts(ctx, "files put", put_usage, put_help, "mode", argc, argv, &mode, &first);
        if (r != CLI_PROCEED)
                return r;
        if (argc - first != 3)
                return cli_usage_error("files put", put_usage,
                                       argc - first < 3 ? "missing arguments" : "too many arguments");
        if (mode && !mode_valid(mode))
                return cli_usage_error("files put", put_usage,
                                       "--mode: '%.16s' is not an octal mode like 644", mode);
        r = cli_check_id("files put", put_usage, argv[first]);
        if (r > 0)
                return r;
        if (sandbox_path_check(argv[first + 2], err, sizeof(err)) < 0)
                return cli_usage_error("files put", put_usage, "%s", err);
        local = argv[first + 1];
        if (mode && asprintf(&extra, "&mode=%s", mode) < 0)
                return cli_fail("out of memory");
        path = files_route(argv[first], "content", argv[first + 2], extra);
        if (!path)
                return cli_fail("out of memory");

        if (strcmp(local, "-") == 0)
                in_fd = STDIN_FILENO;
        else {
                fd = open(local, O_RDONLY | O_CLOEXEC | O_NOCTTY);
                if (fd < 0)
                        return cli_fail("cannot read %s: %s", local, strerror(errno));
                in_fd = fd;
        }
        if (fstat(in_fd, &st) < 0)
                return cli_fail("cannot read %s: %s", local, strerror(errno));
        if (S_ISDIR(st.st_mode))
                return cli_fail("%s is a directory; copy a directory as an archive (tar c DIR | runtime "
                                "files put ID - DIR.tar)",
                                local);
        /* A regular file's size is known and sent; a pipe goes chunked. */
        if (S_ISREG(st.st_mode) && lseek(in_fd, 0, SEEK_CUR) == 0)
                size = (long long)st.st_size;

        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_upload(c, path, in_fd, size, &ans, &ce);
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r < 0)
                return cli_error_print(&ce);
        if (ctx->json)
                cli_print_json(ans);
        else {
                json_t *sz = json_object_get(ans, "size");
                const char *p = json_string_value(json_object_get(ans, "path"));
                printf("%s: %" JSON_INTEGER_FORMAT " bytes\n", p ? p : argv[first + 2],
                       json_is_integer(sz) ? json_integer_value(sz) : (json_int_t)0);
        }
        return CLI_EXIT_OK;
}

int cmd_files_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_free_ char *path = NULL, *extra = NULL;
        _cleanup_json_ json_t *ans = NULL;
        const char *depth_s = NULL, *dir;
        char err[CLI_ERR_MAX];
        long long depth = 1;
        int r, first;
        CliError ce;

        r = parse_opts(ctx, "files ls", ls_usage, ls_help, "depth", argc, argv, &depth_s, &first);
        if (r != CLI_PROCEED)
                return r;
        if (argc - first < 1 || argc - first > 2)
                return cli_usage_error("files ls", ls_usage,
                                       argc - first < 1 ? "missing arguments" : "too many arguments");
        if (depth_s &&
            parse_uint_bounded("--depth", depth_s, 1, FILES_DEPTH_MAX, &depth, err, sizeof(err)) < 0)
                return cli_usage_error("files ls", ls_usage, "%s", err);
        r = cli_check_id("files ls", ls_usage, argv[first]);
        if (r > 0)
                return r;
        dir = argc - first == 2 ? argv[first + 1] : "/workspace";
        if (sandbox_path_check(dir, err, sizeof(err)) < 0)
                return cli_usage_error("files ls", ls_usage, "%s", err);
        if (asprintf(&extra, "&depth=%lld", depth) < 0)
                return cli_fail("out of memory");
        path = files_route(argv[first], "list", dir, extra);
        if (!path)
                return cli_fail("out of memory");
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_json(c, "GET", path, NULL, &ans, &ce);
        if (r < 0)
                return cli_error_print(&ce);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        json_t *entries = json_object_get(ans, "data");
        format_file_entries(stdout, entries ? entries : json_object_get(ans, "entries"));
        if (json_is_true(json_object_get(ans, "truncated")))
                fprintf(stderr, "runtime: the listing was cut at the daemon's limit of entries\n");
        return CLI_EXIT_OK;
}

static const char cp_usage[] = "SRC DST";
static const char cp_help[] =
        "Copies a file or a directory into or out of a sandbox. One of SRC and DST is\n"
        "ID:PATH (a path in sandbox ID; a relative PATH is under /workspace), the other a\n"
        "local path. A directory travels as one tar: out, it is unpacked into DST (made if\n"
        "missing, merged if there) by the same bounded reader the sandbox uses, which never\n"
        "writes outside DST and refuses links that lead out and device files; in, it is\n"
        "unpacked into PATH inside the sandbox. A file is copied as 'files get' and 'files\n"
        "put' do.\n\n"
        "Examples:\n"
        "  runtime files cp ./src sbx_9f2c4e1a7b3d5c6e8f01:/workspace/src\n"
        "  runtime files cp sbx_9f2c4e1a7b3d5c6e8f01:out ./results\n";

/* "ID:PATH": the id is checked, *ret_path points into arg. 0, or -1 when
 * arg is a local path. */
static int split_remote(const char *arg, char id[64], const char **ret_path) {
        const char *colon = strchr(arg, ':');
        if (!colon || strncmp(arg, "sbx_", 4) != 0 || (size_t)(colon - arg) >= 64)
                return -1;
        memcpy(id, arg, (size_t)(colon - arg));
        id[colon - arg] = '\0';
        *ret_path = colon + 1;
        return 0;
}

typedef struct Unpack {
        TarExtract *x;
        int failed;
} Unpack;

static int unpack_sink(const void *data, size_t len, void *userdata) {
        Unpack *u = userdata;
        if (u->failed)
                return u->failed;
        u->failed = tar_extract_feed(u->x, data, len);
        return u->failed;
}

static int fd_sink(void *userdata, const void *buf, size_t n) {
        return io_write_all(*(int *)userdata, buf, n);
}

/* Bounds of a directory copied out: what a sandbox sends is its own. */
#define CP_MAX_BYTES (64ULL << 30)
#define CP_MAX_ENTRIES 1000000ULL

static int cp_out(CliContext *ctx, Client *c, const char *id, const char *remote, const char *local) {
        _cleanup_free_ char *stat_path = files_route(id, "stat", remote, NULL);
        _cleanup_json_ json_t *st = NULL;
        CliError ce;
        if (!stat_path)
                return cli_fail("out of memory");
        if (client_json(c, "GET", stat_path, NULL, &st, &ce) < 0)
                return cli_error_print(&ce);
        if (!json_is_true(json_object_get(st, "exists")))
                return cli_fail("%s:%s does not exist", id, remote);
        const char *type = json_string_value(json_object_get(st, "type"));
        if (!type || strcmp(type, "directory") != 0) {
                char *args[] = {"get", (char *)id, (char *)remote, (char *)local, NULL};
                return cmd_files_get(ctx, 4, args);
        }
        if (mkdir(local, 0755) < 0 && errno != EEXIST)
                return cli_fail("cannot make %s: %s", local, strerror(errno));
        _cleanup_close_ int dir = open(local, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
                return cli_fail("%s: %s", local, strerror(errno));
        _cleanup_free_ char *path = files_route(id, "archive", remote, "&gzip=false");
        if (!path)
                return cli_fail("out of memory");
        TarLimits lim = {CP_MAX_BYTES, CP_MAX_ENTRIES};
        Unpack u = {0};
        if (tar_extract_new(dir, &lim, &u.x) < 0)
                return cli_fail("out of memory");
        int r = client_download(c, path, unpack_sink, &u, &ce);
        if (r == 0 && !u.failed)
                r = tar_extract_finish(u.x);
        if (r == -EINTR) {
                tar_extract_free(u.x);
                return cli_interrupted_exit();
        }
        if (u.failed || (r < 0 && r != -EIO && tar_extract_error(u.x)[0])) {
                int k = cli_fail("%s: %s", local, tar_extract_error(u.x)[0] ? tar_extract_error(u.x) : "unpack failed");
                tar_extract_free(u.x);
                return k;
        }
        if (r < 0) {
                tar_extract_free(u.x);
                return ce.message[0] ? cli_error_print(&ce) : cli_fail("%s: %s", local, strerror(-r));
        }
        if (!ctx->json)
                printf("%s: %llu entries, %llu bytes\n", local, (unsigned long long)tar_extract_entries(u.x),
                       (unsigned long long)tar_extract_bytes(u.x));
        tar_extract_free(u.x);
        return CLI_EXIT_OK;
}

static int cp_in(CliContext *ctx, Client *c, const char *local, const char *id, const char *remote) {
        struct stat st;
        if (stat(local, &st) < 0)
                return cli_fail("cannot read %s: %s", local, strerror(errno));
        if (!S_ISDIR(st.st_mode)) {
                char *args[] = {"put", (char *)id, (char *)local, (char *)remote, NULL};
                return cmd_files_put(ctx, 4, args);
        }
        _cleanup_close_ int dir = open(local, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dir < 0)
                return cli_fail("%s: %s", local, strerror(errno));
        /* The tar is made first, in an unnamed file, so its length is sent
         * up front and a read error is told before anything is sent. */
        _cleanup_close_ int tmp = open(P_tmpdir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (tmp < 0)
                return cli_fail("cannot make a temporary file in %s: %s", P_tmpdir, strerror(errno));
        int r = tar_create(dir, NULL, 0, fd_sink, &tmp);
        if (r < 0)
                return cli_fail("%s: %s", local, strerror(-r));
        off_t size = lseek(tmp, 0, SEEK_CUR);
        if (size < 0 || lseek(tmp, 0, SEEK_SET) < 0)
                return cli_fail("%s: %s", local, strerror(errno));
        _cleanup_free_ char *path = files_route(id, "archive", remote, NULL);
        _cleanup_json_ json_t *ans = NULL;
        CliError ce;
        if (!path)
                return cli_fail("out of memory");
        r = client_upload(c, path, tmp, (long long)size, &ans, &ce);
        if (r == -EINTR)
                return cli_interrupted_exit();
        if (r < 0)
                return cli_error_print(&ce);
        if (ctx->json)
                cli_print_json(ans);
        else {
                json_t *n = json_object_get(ans, "entries"), *b = json_object_get(ans, "bytes");
                printf("%s:%s: %" JSON_INTEGER_FORMAT " entries, %" JSON_INTEGER_FORMAT " bytes\n", id,
                       json_string_value(json_object_get(ans, "path")) ?: remote,
                       json_is_integer(n) ? json_integer_value(n) : 0, json_is_integer(b) ? json_integer_value(b) : 0);
        }
        return CLI_EXIT_OK;
}

int cmd_files_cp(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        const char *unused = NULL, *src_path = NULL, *dst_path = NULL;
        char src_id[64], dst_id[64], err[CLI_ERR_MAX];
        int r, first;

        r = parse_opts(ctx, "files cp", cp_usage, cp_help, NULL, argc, argv, &unused, &first);
        if (r != CLI_PROCEED)
                return r;
        if (argc - first != 2)
                return cli_usage_error("files cp", cp_usage, argc - first < 2 ? "missing arguments" : "too many arguments");
        bool src_remote = split_remote(argv[first], src_id, &src_path) == 0;
        bool dst_remote = split_remote(argv[first + 1], dst_id, &dst_path) == 0;
        if (src_remote == dst_remote)
                return cli_usage_error("files cp", cp_usage, "one of SRC and DST must be ID:PATH, the other local");
        const char *id = src_remote ? src_id : dst_id, *remote = src_remote ? src_path : dst_path;
        r = cli_check_id("files cp", cp_usage, id);
        if (r > 0)
                return r;
        if (sandbox_path_check(remote, err, sizeof(err)) < 0)
                return cli_usage_error("files cp", cp_usage, "%s", err);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        return src_remote ? cp_out(ctx, c, id, remote, argv[first + 1]) : cp_in(ctx, c, argv[first], id, remote);
}
