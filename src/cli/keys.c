#include "cli/keys.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/endpoint.h"
#include "cli/parse.h"
#include "common/macro.h"
#include "common/path.h"

#define KEY_NAME_MAX 64
#define TRIAL_KEY_FILE "trial.key"

int parse_dollars(const char *what, const char *s, long long *ret_micros, char *err, size_t errlen) {
        const char *p = s;
        long long whole = 0, frac = 0;
        int digits = 0, fdigits = 0;

        if (*p == '$')
                p++;
        for (; *p >= '0' && *p <= '9'; p++, digits++) {
                if (whole > CLI_DOLLARS_MAX_MICROS / 1000000)
                        goto too_big;
                whole = whole * 10 + (*p - '0');
        }
        if (*p == '.') {
                p++;
                for (; *p >= '0' && *p <= '9'; p++, fdigits++) {
                        if (fdigits == 6) {
                                snprintf(err, errlen, "%s: at most six decimals (a micro-dollar)", what);
                                return -EINVAL;
                        }
                        frac = frac * 10 + (*p - '0');
                }
        }
        if (*p || (digits == 0 && fdigits == 0)) {
                snprintf(err, errlen, "%s: '%.40s' is not an amount of dollars (25, 0.5, $1.25)", what, s);
                return -EINVAL;
        }
        for (int i = fdigits; i < 6; i++)
                frac *= 10;
        if (whole * 1000000 + frac > CLI_DOLLARS_MAX_MICROS)
                goto too_big;
        *ret_micros = whole * 1000000 + frac;
        return 0;
too_big:
        snprintf(err, errlen, "%s: at most $%lld", what, CLI_DOLLARS_MAX_MICROS / 1000000);
        return -ERANGE;
}


static void money(char *buf, size_t len, json_t *v) {
        if (!json_is_integer(v)) {
                snprintf(buf, len, "none");
                return;
        }
        long long m = (long long)json_integer_value(v);
        snprintf(buf, len, "$%lld.%06lld", m / 1000000, m % 1000000);
}

/* ---- trial ---- */

static int read_small(const char *path, char *buf, size_t len) {
        _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY);
        struct stat st;
        if (fd < 0)
                return -errno;
        if (fstat(fd, &st) < 0)
                return -errno;
        if (!S_ISREG(st.st_mode))
                return -EINVAL;
        ssize_t n = read(fd, buf, len - 1);
        if (n < 0)
                return -errno;
        buf[n] = '\0';
        while (n > 0 && isspace((unsigned char)buf[n - 1]))
                buf[--n] = '\0';
        return n > 0 ? 0 : -ENODATA;
}

int cli_use_trial_key(CliContext *ctx) {
        static char key[CLI_KEY_MAX + 2];
        _cleanup_free_ char *dir = state_dir_default(), *path = NULL;
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        CliError e;
        int r;

        if (ctx->key) {
                fprintf(stderr, "runtime: --trial and --key do not go together\n");
                return CLI_EXIT_USAGE;
        }
        if (!dir || asprintf(&path, "%s/%s", dir, TRIAL_KEY_FILE) < 0) {
                path = NULL;
                return cli_fail("cannot find a state directory for the trial key (set RUNTIME_STATE_DIR)");
        }
        r = read_small(path, key, sizeof(key));
        if (r == 0 && key_check(key) == 0) {
                ctx->key = key;
                return 0;
        }
        if (r != -ENOENT)
                return cli_fail("%s does not hold a valid key; remove it to get a new trial key", path);

        /* None yet: ask the daemon. The route needs no key. */
        r = cli_connect(ctx, false, &c);
        if (r > 0)
                return r;
        r = client_json(c, "POST", "/v1/trial", NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        const char *k = json_string_value(json_object_get(ans, "key"));
        if (!k || key_check(k) < 0)
                return cli_fail("the daemon answered no trial key");
        snprintf(key, sizeof(key), "%s", k);

        r = path_mkdir_private(dir);
        _cleanup_close_ int fd = r < 0 ? -1 : open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
        if (fd < 0) {
                fprintf(stderr, "runtime: warning: could not keep the trial key in %s: %s\n", path,
                        strerror(r < 0 ? -r : errno));
        } else {
                size_t n = strlen(key);
                if (write(fd, key, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || fsync(fd) < 0)
                        fprintf(stderr, "runtime: warning: could not write the trial key to %s\n", path);
                else {
                        json_int_t secs = json_integer_value(
                                json_object_get(json_object_get(ans, "trialAllowance"), "sandboxSeconds"));
                        fprintf(stderr, "runtime: got a trial key (%lld free sandbox-hours), kept in %s\n",
                                (long long)(secs / 3600), path);
                }
        }
        ctx->key = key;
        return 0;
}

/* ---- keys create ---- */

static const char create_usage[] = "[--read-only] [--daily-limit DOLLARS] [--owner OWNER] NAME";
static const char create_help[] =
        "Makes an API key and prints its secret once: keep it, the daemon keeps only a hash.\n\n"
        "Options:\n"
        "  --read-only           the key lists and looks (sandboxes, usage, limits) but cannot\n"
        "                        create, run, write, delete, extend or spend\n"
        "  --daily-limit DOLLARS at most this much spent in any 24 hours: 25, 0.5, $1.25\n"
        "                        (default: no limit; a key with a limit makes read-only keys only)\n"
        "  --owner OWNER         the owner of the key's sandboxes (admin keys only; default: yours);\n"
        "                        one owner's sandboxes are invisible to another's keys\n"
        "\nExamples:\n"
        "  runtime keys create --daily-limit 25 agent-prod\n"
        "  runtime keys create --read-only dashboard\n";

int cmd_keys_create(CliContext *ctx, int argc, char **argv) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"json", no_argument, NULL, 'j'},
                {"read-only", no_argument, NULL, 'r'},
                {"daily-limit", required_argument, NULL, 'l'},
                {"owner", required_argument, NULL, 'o'},
                {NULL, 0, NULL, 0},
        };
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *body = NULL, *ans = NULL;
        const char *verb = "keys create", *owner = NULL;
        char err[CLI_ERR_MAX];
        bool read_only = false;
        long long limit = -1;
        int opt, r;
        CliError e;

        optind = 0;
        opterr = 0;
        while ((opt = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
                switch (opt) {
                case 'h':
                        return cli_help(verb, create_usage, create_help);
                case 'j':
                        ctx->json = true;
                        break;
                case 'r':
                        read_only = true;
                        break;
                case 'l':
                        if (parse_dollars("--daily-limit", optarg, &limit, err, sizeof(err)) < 0)
                                return cli_usage_error(verb, create_usage, "%s", err);
                        break;
                case 'o':
                        owner = optarg;
                        break;
                case ':':
                        return cli_usage_error(verb, create_usage, "%s needs a value", argv[optind - 1]);
                default:
                        return cli_usage_error(verb, create_usage, "unknown option '%s'", argv[optind - 1]);
                }
        }
        if (argc - optind != 1)
                return cli_usage_error(verb, create_usage, argc - optind < 1 ? "a name is required"
                                                                             : "too many arguments");
        const char *name = argv[optind];
        size_t n = strlen(name);
        if (n == 0 || n > KEY_NAME_MAX)
                return cli_usage_error(verb, create_usage, "NAME: 1 to %d bytes", KEY_NAME_MAX);
        for (size_t i = 0; i < n; i++)
                if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
                        return cli_usage_error(verb, create_usage, "NAME: has a control character");
        body = json_pack("{s:s,s:s}", "name", name, "access", read_only ? "read" : "full");
        if (!body || (limit >= 0 && json_object_set_new(body, "dailyLimitMicros", json_integer(limit)) < 0) ||
            (owner && json_object_set_new(body, "owner", json_string(owner)) < 0))
                return cli_fail("out of memory (or NAME is not UTF-8)");
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_json(c, "POST", "/v1/keys", body, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json) {
                cli_print_json(ans);
                return CLI_EXIT_OK;
        }
        char lim[48];
        money(lim, sizeof(lim), json_object_get(ans, "dailyLimitMicros"));
        fputs("id: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "id")), 0);
        fputs("\nowner: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "owner")), 0);
        printf("\naccess: %s\ndaily limit: %s\n", read_only ? "read" : "full", lim);
        fputs("key: ", stdout);
        format_put_safe(stdout, json_string_value(json_object_get(ans, "key")), 0);
        fputs("\n", stdout);
        fprintf(stderr, "This is the only time the key is shown: keep it (export RUNTIME_API_KEY=...).\n");
        return CLI_EXIT_OK;
}

/* ---- keys ls ---- */

static const char ls_help[] = "Lists the keys of your owner (every key with an admin key); never a secret.\n";

int cmd_keys_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "keys ls", ls_help, argc, argv, "/v1/keys", &ans);
        if (r != CLI_PROCEED)
                return r;
        printf("%-22s%-18s%-18s%-8s%-16s%s\n", "ID", "NAME", "OWNER", "ACCESS", "DAILY LIMIT", "STATE");
        size_t i;
        json_t *k;
        json_array_foreach (json_object_get(ans, "keys"), i, k) {
                char lim[48];
                money(lim, sizeof(lim), json_object_get(k, "dailyLimitMicros"));
                format_put_safe(stdout, json_string_value(json_object_get(k, "id")), 22);
                format_put_safe(stdout, json_string_value(json_object_get(k, "name")), 18);
                format_put_safe(stdout, json_string_value(json_object_get(k, "owner")), 18);
                format_put_safe(stdout, json_string_value(json_object_get(k, "access")), 8);
                format_put_safe(stdout, lim, 16);
                const char *state = json_is_string(json_object_get(k, "revokedAt")) ? "revoked"
                                    : json_is_true(json_object_get(k, "trial"))    ? "trial"
                                                                                  : "active";
                printf("%s\n", state);
        }
        return CLI_EXIT_OK;
}

/* ---- keys revoke ---- */

static const char revoke_help[] = "Revokes a key: the next request with it is refused (401). Its running\n"
                                  "sandboxes run on until their leases end.\n\n"
                                  "Example:\n  runtime keys revoke key_0123456789abcdef\n";

static bool key_id_valid(const char *s) {
        if (strncmp(s, "key_", 4) != 0 || strlen(s) != 20)
                return false;
        for (const char *p = s + 4; *p; p++)
                if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
                        return false;
        return true;
}

int cmd_keys_revoke(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char **pos, path[64];
        int npos, r;
        CliError e;

        r = cli_simple_args(ctx, "keys revoke", "ID", revoke_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        if (!key_id_valid(pos[0]))
                return cli_usage_error("keys revoke", "ID", "'%.80s' is not a key id (key_ and 16 hex digits)",
                                       pos[0]);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        snprintf(path, sizeof(path), "/v1/keys/%s", pos[0]);
        r = client_json(c, "DELETE", path, NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s revoked\n", pos[0]);
        return CLI_EXIT_OK;
}
