#include "cli/runcode.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/parse.h"
#include "common/base64.h"
#include "common/macro.h"

#define RUN_CODE_MAX_SOURCE (512u * 1024u) /* the API takes 1 MiB of JSON */
#define RUN_CODE_MAX_TIMEOUT_MS 86400000LL

static const char usage[] = "[--context C] [--timeout DURATION] [--save-dir DIR] [--json] ID (CODE | -)";
static const char help[] =
        "Runs CODE (or, with -, the code on stdin) in the sandbox's stateful Python interpreter.\n"
        "Variables persist between runs of one context, as in a notebook.\n"
        "Prints stdout, stderr and the text of each result; saves charts (image/png)\n"
        "as PNG files in DIR (default: the current directory) and prints their paths.\n"
        "\n"
        "  --context C          the context (default: python, started on first use)\n"
        "  --timeout DURATION   stop the cell after this long (default 60s; the state stays)\n"
        "  --save-dir DIR       where charts are written\n"
        "  --json               print the execution as the API answers it\n"
        "\n"
        "Exit status: 0 when the cell ran, 1 when it raised, 124 when it timed out.\n";

static char *read_stdin(void) {
        size_t cap = 4096, len = 0;
        char *buf = malloc(cap);
        while (buf) {
                if (len + 1 >= cap) {
                        if (cap > RUN_CODE_MAX_SOURCE) {
                                free(buf);
                                errno = EFBIG;
                                return NULL;
                        }
                        char *b = realloc(buf, cap * 2);
                        if (!b)
                                break;
                        buf = b;
                        cap *= 2;
                }
                ssize_t r = read(STDIN_FILENO, buf + len, cap - len - 1);
                if (r < 0 && errno == EINTR)
                        continue;
                if (r < 0) {
                        free(buf);
                        return NULL;
                }
                if (r == 0) {
                        buf[len] = '\0';
                        return buf;
                }
                len += (size_t)r;
        }
        free(buf);
        errno = ENOMEM;
        return NULL;
}

/* A chart larger than this is refused rather than written. */
#define CHART_MAX_BYTES (64u << 20)

/* Writes a chart next to the others: DIR/chart-<count>-<n>.png. */
static int save_png(const char *dir, json_int_t count, int n, const char *b64) {
        size_t len;
        _cleanup_(freep) uint8_t *png = NULL;
        if (base64_decode(b64, strlen(b64), CHART_MAX_BYTES, &png, &len) < 0)
                return cli_fail("a chart came back that is not base64 (or over 64 MiB)");
        char path[4096];
        snprintf(path, sizeof(path), "%s/chart-%lld-%d.png", dir, (long long)count, n);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
                return cli_fail("cannot write %s: %s", path, strerror(errno));
        ssize_t w = write(fd, png, len);
        close(fd);
        if (w != (ssize_t)len)
                return cli_fail("cannot write %s", path);
        printf("[chart saved to %s]\n", path);
        return 0;
}

static int print_execution(json_t *ex, const char *dir) {
        const char *out = json_string_value(json_object_get(ex, "stdout"));
        const char *err = json_string_value(json_object_get(ex, "stderr"));
        if (out)
                fputs(out, stdout);
        if (err)
                fputs(err, stderr);
        json_int_t count = json_integer_value(json_object_get(ex, "executionCount"));
        size_t i;
        json_t *res;
        int n = 0, rc = CLI_EXIT_OK;
        json_array_foreach(json_object_get(ex, "results"), i, res) {
                json_t *data = json_object_get(res, "data");
                const char *png = json_string_value(json_object_get(data, "image/png"));
                const char *text = json_string_value(json_object_get(data, "text/plain"));
                if (png) {
                        if (save_png(dir, count, ++n, png) != 0)
                                rc = CLI_EXIT_FAILURE;
                } else if (text)
                        printf("%s\n", text);
                else if (json_object_size(json_object_get(res, "refs")) > 0)
                        printf("[a result kept in the sandbox: %s]\n",
                               json_string_value(json_object_get(
                                       json_object_iter_value(json_object_iter(json_object_get(res, "refs"))),
                                       "path")) ?: "?");
        }
        json_t *e = json_object_get(ex, "error");
        if (json_is_object(e)) {
                const char *tb = json_string_value(json_object_get(e, "traceback"));
                if (tb && *tb)
                        fputs(tb, stderr);
                else
                        fprintf(stderr, "%s: %s\n", json_string_value(json_object_get(e, "name")) ?: "Error",
                                json_string_value(json_object_get(e, "value")) ?: "");
        }
        fflush(stdout);
        const char *status = json_string_value(json_object_get(ex, "status"));
        if (status && strcmp(status, "timeout") == 0)
                return CLI_EXIT_TIMEOUT;
        if (!status || strcmp(status, "ok") != 0)
                return CLI_EXIT_FAILURE;
        return rc;
}

int cmd_sandbox_run_code(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                { "context", required_argument, NULL, 'c' }, { "timeout", required_argument, NULL, 't' },
                { "save-dir", required_argument, NULL, 'd' }, { "json", no_argument, NULL, 'j' },
                { "help", no_argument, NULL, 'h' },           { NULL, 0, NULL, 0 },
        };
        const char *verb = "sandbox run-code", *context = NULL, *dir = ".";
        long long timeout_ms = -1;
        char err[CLI_ERR_MAX];
        int o;
        optind = 1;
        opterr = 0;
        while ((o = getopt_long(argc, argv, "+c:t:d:h", opts, NULL)) != -1) {
                switch (o) {
                case 'c':
                        context = optarg;
                        break;
                case 't':
                        if (parse_duration_ms("--timeout", optarg, 1, RUN_CODE_MAX_TIMEOUT_MS, &timeout_ms, err,
                                              sizeof(err)) < 0)
                                return cli_usage_error(verb, usage, "%s", err);
                        break;
                case 'd':
                        dir = optarg;
                        break;
                case 'j':
                        ctx->json = true;
                        break;
                case 'h':
                        return cli_help(verb, usage, help);
                default:
                        return cli_usage_error(verb, usage, "unknown option %s", argv[optind - 1]);
                }
        }
        if (argc - optind != 2)
                return cli_usage_error(verb, usage, "give the sandbox's ID and the code (or - for stdin)");
        const char *id = argv[optind], *code_arg = argv[optind + 1];
        int r = cli_check_id(verb, usage, id);
        if (r > 0)
                return r;
        _cleanup_(freep) char *from_stdin = NULL;
        if (strcmp(code_arg, "-") == 0) {
                from_stdin = read_stdin();
                if (!from_stdin)
                        return cli_fail("reading the code from stdin: %s", strerror(errno));
        }
        _cleanup_json_ json_t *body = json_pack("{s:s}", "code", from_stdin ?: code_arg);
        if (!body)
                return cli_fail("the code is not valid UTF-8");
        if (context)
                json_object_set_new(body, "context", json_string(context));
        if (timeout_ms > 0)
                json_object_set_new(body, "timeoutMs", json_integer(timeout_ms));
        _cleanup_client_ Client *c = NULL;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        char path[128];
        snprintf(path, sizeof(path), "/v1/sandboxes/%s/interpreter:run", id);
        _cleanup_json_ json_t *ans = NULL;
        CliError e;
        if (client_json(c, "POST", path, body, &ans, &e) < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                const char *status = json_string_value(json_object_get(ans, "status"));
                return status && strcmp(status, "ok") == 0 ? CLI_EXIT_OK : CLI_EXIT_FAILURE;
        }
        return print_execution(ans, dir);
}
