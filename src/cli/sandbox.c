#include "cli/sandbox.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "cli/format.h"
#include "cli/keys.h"
#include "cli/parse.h"
#include "cli/snapshot.h"
#include "common/macro.h"

/* Local sanity bounds: the daemon enforces its own (smaller) maxima and
 * names them; these only catch what cannot be meant. */
#define VCPU_MAX 1024
#define MEMORY_MIB_MIN 64
#define SIZE_MIB_MAX (16LL * 1024 * 1024)
#define HOST_PATTERNS_MAX 256
#define RUN_LEASE_MIN_S 300
#define RUN_LEASE_SLACK_S 60

const char sandbox_run_usage[] = "[OPTIONS] [--] CMD [ARG...]";
const char sandbox_create_usage[] = "[OPTIONS]";
const char sandbox_exec_usage[] = "[OPTIONS] ID [--] CMD [ARG...]";

static const char sizing_help[] =
        "  --vcpu N            CPUs (default 1)\n"
        "  --memory SIZE       memory, in MiB or with a unit: 512, 512M, 2G (default 1024 MiB)\n"
        "  --disk SIZE         writable disk (default 2048 MiB)\n"
        "  --driver NAME       namespace, gvisor or microvm (default: the daemon's)\n"
        "  --image NAME        the image (default: default)\n"
        "  -e, --env K=V       an environment variable for every command (repeatable)\n"
        "  --name NAME         a name to recognise the sandbox by\n"
        "  --label K=V         a label (repeatable)\n"
        "  --internet          let the sandbox reach any public host on ports 80 and 443\n"
        "  --allow HOST        let it reach HOST only (example.com, *.example.com, host:port;\n"
        "                      repeatable; implies --internet, restricted to the list)\n"
        "  --deny HOST         never let it reach HOST, even when allowed (repeatable)\n"
        "  --no-internet       no egress at all (the default); not with --internet or --allow\n"
        "  --max-cost DOLLARS  refuse to start if the whole first lease, priced as if busy\n"
        "                      throughout, would cost more: 0.05, $1\n"
        "  --trial             use a trial key (50 free sandbox-hours, small sandboxes), asked\n"
        "                      for once and kept in the state dir as trial.key\n";

static const char run_help[] =
        "Creates a sandbox, runs CMD in it as an argument vector (no shell: use\n"
        "'bash -c \"...\"' for shell syntax), streams its stdout and stderr as they come,\n"
        "deletes the sandbox and exits with the command's exit code.\n\n"
        "Options:\n"
        "  --timeout DURATION  kill the command after this long: 30, 30s, 5m, 2h (default: none,\n"
        "                      the API's maximum of 24h); the exit code is then 124\n"
        "  --lease DURATION    the sandbox's lease (default max(5m, timeout + 1m); without\n"
        "                      --timeout, 5m renewed while the command runs)\n"
        "  --cwd DIR           the command's working directory (default /workspace)\n"
        "  --user USER         sandbox (the default, unprivileged, HOME=/workspace) or root\n"
        "  -i, --interactive   send this program's stdin (at most 16 MiB) to the command\n"
        "  --keep              keep the sandbox afterwards and print its id on stderr\n"
        "%s"
        "\nExit code: the command's; 124 when it timed out; 130 on Ctrl-C (the sandbox is\n"
        "deleted unless --keep); 1 when the sandbox could not be made; 2 on a usage error.\n"
        "\nExamples:\n"
        "  runtime sandbox run -- python3 -c 'print(6*7)'\n"
        "  runtime sandbox run --timeout 10s -- bash -c 'sleep 60'      # exits 124\n"
        "  echo hi | runtime sandbox run -i -- cat\n";

static const char create_help[] =
        "Creates and starts a sandbox and prints its id (the whole object with --json).\n\n"
        "Options:\n"
        "  --lease DURATION    the lease: 30s, 10m, 2h (default 5m; at most 24h); --timeout is\n"
        "                      the same\n"
        "  --on-lease-end WHAT stop (keep the files), pause (keep memory too) or delete, when\n"
        "                      the lease ends (default stop)\n"
        "  --snapshot ID       start on a snapshot's files (see 'runtime sandbox snapshot'),\n"
        "                      with its source's driver, image and sizes (--vcpu and --memory\n"
        "                      may differ; another --driver, --image or --disk is refused)\n"
        "%s"
        "\nExamples:\n"
        "  id=$(runtime sandbox create --lease 1h --memory 2G --label team=a)\n"
        "  runtime sandbox create --snapshot snp_4b1e9c0d2a7f3e5c8d10 --name attempt-2\n";

static const char exec_help[] =
        "Runs CMD in the running sandbox ID as an argument vector, streams its output and\n"
        "exits with its exit code. Options go before ID.\n\n"
        "Options:\n"
        "  --timeout DURATION  kill the command after this long (default: the API's maximum of 24h);\n"
        "                      the exit code is then 124\n"
        "  --cwd DIR           the working directory (default /workspace)\n"
        "  --user USER         sandbox (the default, unprivileged, HOME=/workspace) or root\n"
        "  -e, --env K=V       an environment variable for this command (repeatable)\n"
        "  -i, --interactive   send this program's stdin (at most 16 MiB) to the command\n"
        "\nExample:\n"
        "  runtime sandbox exec sbx_9f2c4e1a7b3d5c6e8f01 -- ls -la /workspace\n";

enum {
        OPT_LEASE = 0x100,
        OPT_TIMEOUT,
        OPT_VCPU,
        OPT_MEMORY,
        OPT_DISK,
        OPT_DRIVER,
        OPT_IMAGE,
        OPT_NAME,
        OPT_LABEL,
        OPT_CWD,
        OPT_KEEP,
        OPT_ON_LEASE_END,
        OPT_ALLOW,
        OPT_DENY,
        OPT_JSON,
        OPT_MAX_COST,
        OPT_TRIAL,
        OPT_INTERNET,
        OPT_NO_INTERNET,
        OPT_SNAPSHOT,
        OPT_USER,
};

static bool option_allowed(SandboxVerb verb, int opt) {
        switch (opt) {
        case 'h':
        case 'e':
        case OPT_JSON:
        case OPT_TIMEOUT:
                return true;
        case 'i':
        case OPT_CWD:
        case OPT_USER:
                return verb != SANDBOX_VERB_CREATE;
        case OPT_KEEP:
                return verb == SANDBOX_VERB_RUN;
        case OPT_ON_LEASE_END:
        case OPT_SNAPSHOT:
                return verb == SANDBOX_VERB_CREATE;
        default:
                return verb != SANDBOX_VERB_EXEC;
        }
}

static const char *verb_name(SandboxVerb verb) {
        return verb == SANDBOX_VERB_RUN      ? "sandbox run"
               : verb == SANDBOX_VERB_CREATE ? "sandbox create"
                                             : "sandbox exec";
}

static int add_host(json_t **arr, const char *what, const char *host, char *err, size_t errlen) {
        size_t n = strlen(host);

        if (n == 0 || n > 253) {
                snprintf(err, errlen, "%s: a host pattern is 1 to 253 bytes", what);
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++) {
                unsigned char c = (unsigned char)host[i];
                if (c <= 0x20 || c >= 0x7f || strchr("/@:?#", c)) {
                        snprintf(err, errlen, "%s: '%.80s' is not a host name or *.suffix pattern", what,
                                 host);
                        return -EINVAL;
                }
        }
        if (!*arr && !(*arr = json_array()))
                return -ENOMEM;
        if (json_array_size(*arr) >= HOST_PATTERNS_MAX) {
                snprintf(err, errlen, "%s: at most %d host patterns", what, HOST_PATTERNS_MAX);
                return -E2BIG;
        }
        return json_array_append_new(*arr, json_string(host)) < 0 ? -ENOMEM : 0;
}

static int check_text(const char *what, const char *s, size_t max, char *err, size_t errlen) {
        size_t n = strlen(s);

        if (n == 0 || n > max) {
                snprintf(err, errlen, "%s: 1 to %zu bytes", what, max);
                return -EINVAL;
        }
        for (size_t i = 0; i < n; i++)
                if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) {
                        snprintf(err, errlen, "%s: has a control character", what);
                        return -EINVAL;
                }
        return 0;
}

/* One option of run, create or exec, checked and put in a. */
static int apply_option(SandboxVerb verb, int c, const char *arg, SandboxArgs *a, char *err, size_t errlen) {
        int r = 0;
        switch (c) {
        case 'h':
                a->help = true;
                break;
        case OPT_LEASE:
                r = parse_duration_s("--lease", arg, 1, CLI_LEASE_MAX_S, &a->lease_s, err, errlen);
                break;
        case OPT_TIMEOUT:
                if (verb == SANDBOX_VERB_CREATE)
                        r = parse_duration_s("--timeout", arg, 1, CLI_LEASE_MAX_S, &a->lease_s,
                                             err, errlen);
                else
                        r = parse_duration_ms("--timeout", arg, 1, CLI_EXEC_TIMEOUT_MAX_MS,
                                              &a->timeout_ms, err, errlen);
                break;
        case OPT_VCPU:
                r = parse_uint_bounded("--vcpu", arg, 1, VCPU_MAX, &a->vcpu, err, errlen);
                break;
        case OPT_MEMORY:
                r = parse_size_mib("--memory", arg, MEMORY_MIB_MIN, SIZE_MIB_MAX, &a->memory_mib,
                                   err, errlen);
                break;
        case OPT_DISK:
                r = parse_size_mib("--disk", arg, MEMORY_MIB_MIN, SIZE_MIB_MAX, &a->disk_mib, err,
                                   errlen);
                break;
        case OPT_DRIVER:
                r = check_text("--driver", arg, 32, err, errlen);
                a->driver = arg;
                break;
        case OPT_IMAGE:
                if (!image_name_valid(arg)) {
                        snprintf(err, errlen, "--image: '%.80s' is not an image name", arg);
                        r = -EINVAL;
                }
                a->image = arg;
                break;
        case OPT_NAME:
                r = check_text("--name", arg, CLI_NAME_MAX, err, errlen);
                a->name = arg;
                break;
        case OPT_CWD:
                r = sandbox_path_check(arg, err, errlen);
                a->cwd = arg;
                break;
        case OPT_USER:
                if (!cli_user_valid(arg)) {
                        snprintf(err, errlen, "--user: '%.32s' is not sandbox or root", arg);
                        r = -EINVAL;
                }
                a->user = arg;
                break;
        case OPT_KEEP:
                a->keep = true;
                break;
        case OPT_JSON:
                a->json = true;
                break;
        case OPT_MAX_COST:
                r = parse_dollars("--max-cost", arg, &a->max_cost_micros, err, errlen);
                break;
        case OPT_TRIAL:
                a->trial = true;
                break;
        case 'i':
                a->interactive = true;
                break;
        case OPT_ON_LEASE_END:
                if (strcmp(arg, "stop") != 0 && strcmp(arg, "delete") != 0 &&
                    strcmp(arg, "pause") != 0) {
                        snprintf(err, errlen, "--on-lease-end: '%.32s' is not stop, pause or delete",
                                 arg);
                        r = -EINVAL;
                }
                a->on_lease_end = arg;
                break;
        case OPT_SNAPSHOT:
                if (!snapshot_id_valid(arg)) {
                        snprintf(err, errlen, "--snapshot: '%.64s' is not a snapshot id (snp_ and 20 hex digits)",
                                 arg);
                        r = -EINVAL;
                }
                a->snapshot = arg;
                break;
        case 'e':
                if (!a->env && !(a->env = json_object()))
                        r = -ENOMEM;
                else
                        r = parse_kv_into(KV_ENV, arg, a->env, err, errlen);
                break;
        case OPT_LABEL:
                if (!a->labels && !(a->labels = json_object()))
                        r = -ENOMEM;
                else
                        r = parse_kv_into(KV_LABEL, arg, a->labels, err, errlen);
                break;
        case OPT_ALLOW:
                r = add_host(&a->allow, "--allow", arg, err, errlen);
                break;
        case OPT_DENY:
                r = add_host(&a->deny, "--deny", arg, err, errlen);
                break;
        case OPT_INTERNET:
        case OPT_NO_INTERNET:
                if (a->internet >= 0 && a->internet != (c == OPT_INTERNET)) {
                        snprintf(err, errlen, "--internet and --no-internet contradict each other");
                        r = -EINVAL;
                } else
                        a->internet = c == OPT_INTERNET;
                break;
        }
        return r;
}

/* The arguments after the options: exec's sandbox id, and the command of
 * run and exec. */
static int take_arguments(SandboxVerb verb, int argc, char **argv, SandboxArgs *a, char *err, size_t errlen) {
        int r = 0;
        int rest = argc - optind;
        char **pos = argv + optind;

        if (verb == SANDBOX_VERB_CREATE && rest > 0) {
                snprintf(err, errlen, "unexpected argument '%.80s'", pos[0]);
                r = -EINVAL;
        } else if (verb == SANDBOX_VERB_EXEC) {
                if (rest < 1) {
                        snprintf(err, errlen, "a sandbox id and a command are required");
                        r = -EINVAL;
                } else {
                        a->id = pos[0];
                        pos++;
                        rest--;
                        if (rest > 0 && strcmp(pos[0], "--") == 0) {
                                pos++;
                                rest--;
                        } else if (rest > 0 && pos[0][0] == '-') {
                                snprintf(err, errlen, "options go before the sandbox id ('%.80s')",
                                         pos[0]);
                                r = -EINVAL;
                        }
                        if (r == 0 && !sandbox_id_valid(a->id)) {
                                snprintf(err, errlen, "'%.80s' is not a sandbox id", a->id);
                                r = -EINVAL;
                        }
                }
        }
        if (r == 0 && verb != SANDBOX_VERB_CREATE) {
                if (rest < 1) {
                        snprintf(err, errlen, "a command is required");
                        r = -EINVAL;
                } else if (!pos[0][0]) {
                        snprintf(err, errlen, "the command is an empty string");
                        r = -EINVAL;
                }
                a->command = pos;
                a->command_len = rest;
        }
        return r;
}

int sandbox_args_parse(SandboxVerb verb, int argc, char **argv, SandboxArgs *ret, char *err, size_t errlen) {
        static const struct option opts[] = {
                {"help", no_argument, NULL, 'h'},
                {"lease", required_argument, NULL, OPT_LEASE},
                {"timeout", required_argument, NULL, OPT_TIMEOUT},
                {"vcpu", required_argument, NULL, OPT_VCPU},
                {"memory", required_argument, NULL, OPT_MEMORY},
                {"disk", required_argument, NULL, OPT_DISK},
                {"driver", required_argument, NULL, OPT_DRIVER},
                {"image", required_argument, NULL, OPT_IMAGE},
                {"env", required_argument, NULL, 'e'},
                {"name", required_argument, NULL, OPT_NAME},
                {"label", required_argument, NULL, OPT_LABEL},
                {"cwd", required_argument, NULL, OPT_CWD},
                {"user", required_argument, NULL, OPT_USER},
                {"keep", no_argument, NULL, OPT_KEEP},
                {"interactive", no_argument, NULL, 'i'},
                {"on-lease-end", required_argument, NULL, OPT_ON_LEASE_END},
                {"allow", required_argument, NULL, OPT_ALLOW},
                {"deny", required_argument, NULL, OPT_DENY},
                {"json", no_argument, NULL, OPT_JSON},
                {"max-cost", required_argument, NULL, OPT_MAX_COST},
                {"trial", no_argument, NULL, OPT_TRIAL},
                {"internet", no_argument, NULL, OPT_INTERNET},
                {"no-internet", no_argument, NULL, OPT_NO_INTERNET},
                {"snapshot", required_argument, NULL, OPT_SNAPSHOT},
                {NULL, 0, NULL, 0},
        };
        SandboxArgs a = {.lease_s = -1, .timeout_ms = -1, .vcpu = -1, .memory_mib = -1, .disk_mib = -1,
                         .max_cost_micros = -1, .internet = -1};
        int c, longidx = -1, r = 0;

        optind = 0;
        opterr = 0;
        /* '+': options stop at the first argument, so the command's own
         * options ("ls -l") are never taken for ours. */
        while (r == 0 && (longidx = -1, c = getopt_long(argc, argv, "+:hie:", opts, &longidx)) != -1) {
                if (c == '?') {
                        if (optopt && optopt < 0x100)
                                snprintf(err, errlen, "unknown option '-%c'", optopt);
                        else
                                snprintf(err, errlen, "unknown option '%s'", argv[optind - 1]);
                        r = -EINVAL;
                        break;
                }
                if (c == ':') {
                        snprintf(err, errlen, "%s needs a value", argv[optind - 1]);
                        r = -EINVAL;
                        break;
                }
                if (!option_allowed(verb, c)) {
                        if (longidx >= 0)
                                snprintf(err, errlen, "--%s is not an option of %s", opts[longidx].name,
                                         verb_name(verb));
                        else
                                snprintf(err, errlen, "-%c is not an option of %s", c, verb_name(verb));
                        r = -EINVAL;
                        break;
                }
                r = apply_option(verb, c, optarg, &a, err, errlen);
        }
        if (r == 0 && a.internet == 0 && a.allow) {
                snprintf(err, errlen, "--no-internet and --allow contradict each other");
                r = -EINVAL;
        }
        if (r == 0 && !a.help)
                r = take_arguments(verb, argc, argv, &a, err, errlen);
        if (r < 0) {
                if (r == -ENOMEM)
                        snprintf(err, errlen, "out of memory");
                sandbox_args_done(&a);
                return r;
        }
        *ret = a;
        return 0;
}

void sandbox_args_done(SandboxArgs *a) {
        json_decref(a->env);
        json_decref(a->labels);
        json_decref(a->allow);
        json_decref(a->deny);
        a->env = a->labels = a->allow = a->deny = NULL;
}

long long sandbox_run_lease(const SandboxArgs *a) {
        long long lease;

        if (a->lease_s > 0)
                return a->lease_s;
        if (a->timeout_ms < 0)
                return RUN_LEASE_MIN_S;
        lease = (a->timeout_ms + 999) / 1000 + RUN_LEASE_SLACK_S;
        if (lease < RUN_LEASE_MIN_S)
                lease = RUN_LEASE_MIN_S;
        return lease > CLI_LEASE_MAX_S ? CLI_LEASE_MAX_S : lease;
}

static int set_int(json_t *o, const char *k, long long v) {
        return v < 0 ? 0 : json_object_set_new(o, k, json_integer(v));
}

static int set_str(json_t *o, const char *k, const char *v) {
        return v ? json_object_set_new(o, k, json_string(v)) : 0;
}

json_t *sandbox_create_body(const SandboxArgs *a, SandboxVerb verb) {
        _cleanup_json_ json_t *b = json_object();
        int r = 0;

        if (!b)
                return NULL;
        if (verb == SANDBOX_VERB_RUN) {
                r |= set_int(b, "timeoutSeconds", sandbox_run_lease(a));
                /* If this program dies, the sandbox goes at lease end
                 * instead of lingering stopped; a kept one stays. */
                r |= set_str(b, "onLeaseEnd", a->keep ? "stop" : "delete");
        } else {
                r |= set_int(b, "timeoutSeconds", a->lease_s);
                r |= set_str(b, "onLeaseEnd", a->on_lease_end);
        }
        r |= set_int(b, "vcpu", a->vcpu);
        r |= set_int(b, "memoryMiB", a->memory_mib);
        r |= set_int(b, "diskMiB", a->disk_mib);
        r |= set_str(b, "driver", a->driver);
        r |= set_str(b, "image", a->image);
        r |= set_str(b, "name", a->name);
        r |= set_str(b, "snapshot", a->snapshot);
        r |= set_int(b, "maxCostMicros", a->max_cost_micros);
        if (a->env)
                r |= json_object_set(b, "env", a->env);
        if (a->labels)
                r |= json_object_set(b, "labels", a->labels);
        if (a->allow || a->deny || a->internet >= 0) {
                json_t *net = json_pack("{s:b}", "internet", a->internet != 0 && (a->allow || a->internet > 0));
                if (net && a->allow)
                        r |= json_object_set(net, "allow", a->allow);
                if (net && a->deny)
                        r |= json_object_set(net, "deny", a->deny);
                r |= net ? json_object_set_new(b, "network", net) : -1;
        }
        return r == 0 ? TAKE_PTR(b) : NULL;
}

json_t *sandbox_exec_body(const SandboxArgs *a, SandboxVerb verb) {
        _cleanup_json_ json_t *b = json_object(), *argv = json_array();
        int r = 0;

        if (!b || !argv)
                return NULL;
        for (int i = 0; i < a->command_len; i++) {
                json_t *s = json_string(a->command[i]);
                if (!s)
                        return NULL; /* not UTF-8: the API's strings are */
                r |= json_array_append_new(argv, s);
        }
        r |= json_object_set(b, "argv", argv);
        r |= json_object_set_new(b, "stream", json_true());
        r |= json_object_set_new(b, "timeoutMs",
                                 json_integer(a->timeout_ms > 0 ? a->timeout_ms : CLI_EXEC_TIMEOUT_MAX_MS));
        r |= set_str(b, "cwd", a->cwd);
        r |= set_str(b, "user", a->user);
        /* run puts --env on the sandbox; exec on the command. */
        if (verb == SANDBOX_VERB_EXEC && a->env)
                r |= json_object_set(b, "env", a->env);
        return r == 0 ? TAKE_PTR(b) : NULL;
}

/* The help texts hold one "%s" where the shared options go. */
static void print_with_sizing(const char *help) {
        const char *mark = strstr(help, "%s");

        fwrite(help, 1, (size_t)(mark - help), stdout);
        fputs(sizing_help, stdout);
        fputs(mark + 2, stdout);
}

void sandbox_print_help(SandboxVerb verb) {
        switch (verb) {
        case SANDBOX_VERB_RUN:
                printf("usage: runtime sandbox run %s\n\n", sandbox_run_usage);
                print_with_sizing(run_help);
                break;
        case SANDBOX_VERB_CREATE:
                printf("usage: runtime sandbox create %s\n\n", sandbox_create_usage);
                print_with_sizing(create_help);
                break;
        case SANDBOX_VERB_EXEC:
                printf("usage: runtime sandbox exec %s\n\n%s", sandbox_exec_usage, exec_help);
                break;
        }
}

/* The verbs. */

static const char *sandbox_path(char *buf, size_t len, const char *id, const char *suffix) {
        snprintf(buf, len, "/v1/sandboxes/%s%s", id, suffix);
        return buf;
}

int cmd_sandbox_create(CliContext *ctx, int argc, char **argv) {
        _cleanup_(sandbox_args_done) SandboxArgs a = {0};
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *body = NULL, *sbx = NULL;
        char err[CLI_ERR_MAX];
        CliError e;
        int r;

        r = sandbox_args_parse(SANDBOX_VERB_CREATE, argc, argv, &a, err, sizeof(err));
        if (r < 0)
                return cli_usage_error("sandbox create", sandbox_create_usage, "%s", err);
        if (a.help) {
                sandbox_print_help(SANDBOX_VERB_CREATE);
                return CLI_EXIT_OK;
        }
        ctx->json |= a.json;
        if (a.trial && (r = cli_use_trial_key(ctx)) > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        body = sandbox_create_body(&a, SANDBOX_VERB_CREATE);
        if (!body)
                return cli_fail("an argument is not valid UTF-8");
        r = client_json(c, "POST", "/v1/sandboxes", body, &sbx, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(sbx);
        else
                printf("%s\n", json_string_value(json_object_get(sbx, "id")) ?: "");
        return CLI_EXIT_OK;
}

static const char ls_help[] = "Lists your sandboxes, oldest first.\n\n"
                              "Example:\n  runtime sandbox ls\n  runtime --json sandbox ls\n";

int cmd_sandbox_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "sandbox ls", ls_help, argc, argv, "/v1/sandboxes", &ans);
        if (r != CLI_PROCEED)
                return r;
        format_sandbox_table(stdout, json_object_get(ans, "sandboxes"), time(NULL));
        return CLI_EXIT_OK;
}

static const char get_help[] =
        "Shows one sandbox.\n\nExample:\n  runtime sandbox get sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_get(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char **pos, path[128];
        int npos, r;
        CliError e;

        r = cli_simple_args(ctx, "sandbox get", "ID", get_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id("sandbox get", "ID", pos[0]);
        if (r > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_json(c, "GET", sandbox_path(path, sizeof(path), pos[0], ""), NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else
                format_sandbox_detail(stdout, ans, time(NULL));
        return CLI_EXIT_OK;
}

static const char stop_help[] = "Stops a sandbox: every process ends, the files stay until 'sandbox rm'.\n\n"
                                "Example:\n  runtime sandbox stop sbx_9f2c4e1a7b3d5c6e8f01\n";

int cmd_sandbox_stop(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL;
        char **pos, path[128];
        int npos, r;
        CliError e;

        r = cli_simple_args(ctx, "sandbox stop", "ID", stop_help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id("sandbox stop", "ID", pos[0]);
        if (r > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        r = client_json(c, "POST", sandbox_path(path, sizeof(path), pos[0], ":stop"), NULL, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s\n", pos[0]);
        return CLI_EXIT_OK;
}

static const char pause_help[] =
        "Pauses a running sandbox: its processes stop where they stand, memory kept, and it\n"
        "costs only its disk until woken. A request to it wakes it again unless it was\n"
        "created with autoWake false.\n\n"
        "Example:\n  runtime sandbox pause sbx_9f2c4e1a7b3d5c6e8f01\n";
static const char wake_help[] =
        "Wakes a sandbox: a paused one carries on with the same processes; a stopped one\n"
        "boots again from its files (memory is not kept). Its lease is what the pause left\n"
        "of it, else its timeout; --lease DURATION gives it a new one.\n\n"
        "Example:\n  runtime sandbox wake --lease 1h sbx_9f2c4e1a7b3d5c6e8f01\n";
static const char restart_help[] =
        "Restarts a sandbox from its files: a running or paused one is stopped first; its\n"
        "processes and memory are not kept.\n\n"
        "Example:\n  runtime sandbox restart sbx_9f2c4e1a7b3d5c6e8f01\n";

/* pause, wake and restart: POST :VERB, the sandbox's new state printed. */
static int lifecycle_verb(CliContext *ctx, const char *verb, const char *help, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL, *body = NULL;
        char **pos, path[128], err[CLI_ERR_MAX], name[32], suffix[16];
        long long lease = 0;
        int npos, r;
        CliError e;

        snprintf(name, sizeof(name), "sandbox %s", verb);
        snprintf(suffix, sizeof(suffix), ":%s", verb);
        bool is_wake = strcmp(verb, "wake") == 0;
        const char *usage = is_wake ? "[--lease DURATION] ID" : "ID";
        /* --lease DURATION before the id, for wake alone. */
        if (is_wake && argc >= 3 && strcmp(argv[1], "--lease") == 0) {
                if (parse_duration_s("--lease", argv[2], 1, CLI_LEASE_MAX_S, &lease, err, sizeof(err)) < 0)
                        return cli_usage_error(name, usage, "%s", err);
                argv[2] = argv[0];
                argv += 2;
                argc -= 2;
        }
        r = cli_simple_args(ctx, name, usage, help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id(name, usage, pos[0]);
        if (r > 0)
                return r;
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        body = lease ? json_pack("{s:I}", "timeoutSeconds", (json_int_t)lease) : json_object();
        if (!body)
                return cli_fail("out of memory");
        r = client_json(c, "POST", sandbox_path(path, sizeof(path), pos[0], suffix), body, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s: %s\n", pos[0], json_string_value(json_object_get(ans, "state")) ?: "?");
        return CLI_EXIT_OK;
}

int cmd_sandbox_pause(CliContext *ctx, int argc, char **argv) {
        return lifecycle_verb(ctx, "pause", pause_help, argc, argv);
}

int cmd_sandbox_wake(CliContext *ctx, int argc, char **argv) {
        return lifecycle_verb(ctx, "wake", wake_help, argc, argv);
}

int cmd_sandbox_restart(CliContext *ctx, int argc, char **argv) {
        return lifecycle_verb(ctx, "restart", restart_help, argc, argv);
}

static const char rm_help[] =
        "Deletes sandboxes: stops them and removes their files. Goes on past a\n"
        "failure and exits 1 if any failed.\n\n"
        "Example:\n  runtime sandbox rm sbx_9f2c4e1a7b3d5c6e8f01\n"
        "  runtime sandbox rm $(runtime --json sandbox ls | jq -r '.sandboxes[].id')\n";

int cmd_sandbox_rm(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        char **pos, path[128];
        int npos, r, rc = CLI_EXIT_OK;

        r = cli_simple_args(ctx, "sandbox rm", "ID...", rm_help, argc, argv, 1, 4096, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        for (int i = 0; i < npos; i++) {
                r = cli_check_id("sandbox rm", "ID...", pos[i]);
                if (r > 0)
                        return r;
        }
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        for (int i = 0; i < npos && !cli_interrupted; i++) {
                _cleanup_json_ json_t *ans = NULL;
                CliError e;

                r = client_json(c, "DELETE", sandbox_path(path, sizeof(path), pos[i], ""), NULL, &ans, &e);
                if (r < 0) {
                        rc = cli_error_print(&e);
                        /* The daemon is gone: the rest would fail the same way. */
                        if (e.status == 0)
                                break;
                        continue;
                }
                if (ctx->json) {
                        json_dumpf(ans, stdout, JSON_COMPACT);
                        fputc('\n', stdout);
                } else
                        printf("%s\n", pos[i]);
        }
        if (cli_interrupted)
                return cli_interrupted_exit();
        return rc;
}

static const char extend_help[] =
        "Renews the lease of a running sandbox: it then ends DURATION after the\n"
        "later of its current end and now. DURATION: 600, 10m, 2h (at most 24h).\n\n"
        "Example:\n  runtime sandbox extend sbx_9f2c4e1a7b3d5c6e8f01 30m\n";

int cmd_sandbox_extend(CliContext *ctx, int argc, char **argv) {
        _cleanup_client_ Client *c = NULL;
        _cleanup_json_ json_t *ans = NULL, *body = NULL;
        char **pos, path[128], err[CLI_ERR_MAX];
        long long secs;
        int npos, r;
        CliError e;

        r = cli_simple_args(ctx, "sandbox extend", "ID DURATION", extend_help, argc, argv, 2, 2, &pos,
                            &npos);
        if (r != CLI_PROCEED)
                return r;
        r = cli_check_id("sandbox extend", "ID DURATION", pos[0]);
        if (r > 0)
                return r;
        if (parse_duration_s("DURATION", pos[1], 1, CLI_LEASE_MAX_S, &secs, err, sizeof(err)) < 0)
                return cli_usage_error("sandbox extend", "ID DURATION", "%s", err);
        r = cli_connect(ctx, true, &c);
        if (r > 0)
                return r;
        body = json_pack("{s:I}", "seconds", (json_int_t)secs);
        if (!body)
                return cli_fail("out of memory");
        r = client_json(c, "POST", sandbox_path(path, sizeof(path), pos[0], ":extend"), body, &ans, &e);
        if (r < 0)
                return cli_error_print(&e);
        if (ctx->json)
                cli_print_json(ans);
        else {
                const char *ends = json_string_value(json_object_get(ans, "leaseEndsAt"));
                char rel[64];
                format_relative(rel, sizeof(rel), ends, time(NULL));
                printf("%s: lease ends %s (%s)\n", pos[0], ends ? ends : "-", rel);
        }
        return CLI_EXIT_OK;
}
