#include "cli/image.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/parse.h"
#include "common/macro.h"

static const char build_usage[] = "[--force] [NAME]";
static const char build_help[] =
        "Builds the image NAME, default or analysis (default: default), from Debian's archive,\n"
        "a minute or a few, printing its steps as they happen (debootstrap's phases and\n"
        "a count of its packages). Where runtimed offers the microvm driver, the image's\n"
        "microVM kernel and disk follow. An image already built from the same recipe is\n"
        "kept unless --force.\n\n"
        "Options:\n"
        "  --force   build again even when the image is up to date\n\n"
        "Examples:\n"
        "  runtime image build\n"
        "  runtime image build analysis\n";

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
        } else if (strcmp(type, "log") == 0) {
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

int cmd_image_build(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"force", no_argument, NULL, 'f'},
                {"json", no_argument, NULL, 'j'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_client_ Client *c = NULL;
        BuildOutcome o = {.json = ctx->json};
        const char *name = "default";
        bool force = false;
        char path[160];
        CliError e;
        int ch, r;

        optind = 0;
        opterr = 0;
        while ((ch = getopt_long(argc, argv, "hf", opts, NULL)) != -1) {
                if (ch == 'h')
                        return cli_help("image build", build_usage, build_help);
                if (ch == 'f')
                        force = true;
                else if (ch == 'j')
                        o.json = ctx->json = true;
                else
                        return cli_usage_error("image build", build_usage, "unknown option '%s'",
                                               argv[optind - 1]);
        }
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
