#include "cli/hosts.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/client.h"
#include "cli/format.h"
#include "common/jsonutil.h"
#include "common/macro.h"

static const char ls_help[] = "Lists the hosts that share this daemon's store (an admin key): each one's\n"
                              "state (live, draining or dead), where it is reached, its drivers and what\n"
                              "its sandboxes hold.\n";

int cmd_hosts_ls(CliContext *ctx, int argc, char **argv) {
        _cleanup_json_ json_t *ans = NULL;
        int r = cli_get_resource(ctx, "hosts ls", ls_help, argc, argv, "/v1/hosts", &ans);
        if (r != CLI_PROCEED)
                return r;
        printf("%-24s%-10s%-6s%-10s%-12s%-18s%-30s%s\n", "ID", "STATE", "EPOCH", "SANDBOXES", "VCPU",
               "MEMORY MIB", "URL", "HEARTBEAT");
        time_t now = time(NULL);
        size_t i;
        json_t *h;
        json_array_foreach (json_object_get(ans, "hosts"), i, h) {
                json_t *used = json_object_get(h, "used");
                char epoch[24], n[24], cpu[48], mem[48], beat[48];
                snprintf(epoch, sizeof(epoch), "%lld", (long long)json_integer_value(json_object_get(h, "epoch")));
                snprintf(n, sizeof(n), "%lld", (long long)json_integer_value(json_object_get(used, "sandboxes")));
                snprintf(cpu, sizeof(cpu), "%lld/%lld", (long long)json_integer_value(json_object_get(used, "vcpu")),
                         (long long)json_integer_value(json_object_get(h, "vcpu")));
                snprintf(mem, sizeof(mem), "%lld/%lld",
                         (long long)json_integer_value(json_object_get(used, "memoryMiB")),
                         (long long)json_integer_value(json_object_get(h, "memoryMiB")));
                format_relative(beat, sizeof(beat), json_string_value(json_object_get(h, "heartbeatAt")), now);
                char id[80];
                snprintf(id, sizeof(id), "%s%s", json_string_value(json_object_get(h, "id")) ?: "",
                         json_is_true(json_object_get(h, "self")) ? " *" : "");
                format_put_safe(stdout, id, 24);
                format_put_safe(stdout, json_string_value(json_object_get(h, "state")), 10);
                format_put_safe(stdout, epoch, 6);
                format_put_safe(stdout, n, 10);
                format_put_safe(stdout, cpu, 12);
                format_put_safe(stdout, mem, 18);
                format_put_safe(stdout, json_string_value(json_object_get(h, "url")), 30);
                format_put_safe(stdout, beat, 0);
                fputc('\n', stdout);
        }
        return CLI_EXIT_OK;
}

/* A host id: what runtimed's --host-id takes. */
static bool host_id_valid(const char *s) {
        size_t n = strlen(s);
        if (n == 0 || n > 63 || strcmp(s, ".") == 0 || strcmp(s, "..") == 0)
                return false;
        for (const char *p = s; *p; p++)
                if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
                      *p == '-' || *p == '.'))
                        return false;
        return true;
}

static int set_draining(CliContext *ctx, const char *verb, const char *help, int argc, char **argv, bool drain) {
        char **pos, path[128];
        int npos;
        int r = cli_simple_args(ctx, verb, "HOST", help, argc, argv, 1, 1, &pos, &npos);
        if (r != CLI_PROCEED)
                return r;
        if (!host_id_valid(pos[0]))
                return cli_usage_error(verb, "HOST", "'%.80s' is not a host id (see runtime hosts ls)", pos[0]);
        snprintf(path, sizeof(path), "/v1/hosts/%s:%s", pos[0], drain ? "drain" : "undrain");
        _cleanup_json_ json_t *ans = NULL, *body = json_object();
        if (!body)
                return cli_fail("out of memory");
        if ((r = cli_post(ctx, path, body, &ans)) != CLI_EXIT_OK)
                return r;
        if (ctx->json)
                cli_print_json(ans);
        else
                printf("%s is %s\n", pos[0], json_string_value(json_object_get(ans, "state")) ?: "?");
        return CLI_EXIT_OK;
}

static const char drain_help[] = "Drains a host: it starts no new sandboxes (creates go to other hosts, or\n"
                                 "wait for room), and the ones it has run on. It stays draining across its\n"
                                 "restarts until undrained.\n\nExample:\n  runtime hosts drain host-a\n";
static const char undrain_help[] = "Lets a drained host start sandboxes again.\n\n"
                                   "Example:\n  runtime hosts undrain host-a\n";

int cmd_hosts_drain(CliContext *ctx, int argc, char **argv) {
        return set_draining(ctx, "hosts drain", drain_help, argc, argv, true);
}

int cmd_hosts_undrain(CliContext *ctx, int argc, char **argv) {
        return set_draining(ctx, "hosts undrain", undrain_help, argc, argv, false);
}
