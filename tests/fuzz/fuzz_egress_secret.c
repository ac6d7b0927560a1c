/* A secret's rules as a client writes them, and a request head as a sandbox
 * sends it, judged and rewritten by the secrets that apply. */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "egress/secret.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 16384)
                return 0;
        /* The input is rules JSON, a NUL, then a request head. */
        const uint8_t *nul = memchr(data, '\0', size);
        size_t rules_len = nul ? (size_t)(nul - data) : size;
        json_t *j = json_loadb((const char *)data, rules_len, JSON_REJECT_DUPLICATES, NULL);
        EgressSecret s = { .name = "FUZZ", .placeholder = "runtime-secret-FUZZ-00", .header = "Authorization" };
        char value[] = "fuzz-value";
        s.value = value;
        s.format = (char *)"Bearer {value}";
        json_t *net = json_pack("{s:b,s:[s]}", "internet", 1, "allow", "api.test");
        if (net && egress_policy_parse(net, &s.hosts, NULL, 0) == 0 && j) {
                json_t *norm = NULL;
                char err[256];
                if (egress_secret_rules_parse(j, &norm, &s.rules, &s.n_rules, err, sizeof(err)) == 0) {
                        /* What was accepted parses again to the same. */
                        json_t *again = NULL;
                        if (egress_secret_rules_parse(norm, &again, NULL, NULL, err, sizeof(err)) != 0 ||
                            !json_equal(norm, again))
                                __builtin_trap();
                        json_decref(again);
                }
                json_decref(norm);
                if (nul) {
                        const char *head = (const char *)nul + 1;
                        size_t head_len = size - rules_len - 1;
                        char *out = NULL, why[160];
                        size_t out_len = 0;
                        int r = egress_secret_prepare_head(head, head_len, &s, 1, "api.test", 443, &out, &out_len,
                                                           why, sizeof(why));
                        /* A refusal never names the value the sandbox did not write itself; an
                         * answer ends with the blank line of its head. */
                        if (r == -EACCES && strstr(why, value) && !memmem(head, head_len, value, strlen(value)))
                                __builtin_trap();
                        if (r >= 0 && (out_len < 4 || memcmp(out + out_len - 4, "\r\n\r\n", 4) != 0))
                                __builtin_trap();
                        free(out);
                }
        }
        egress_secret_rules_free(s.rules, s.n_rules);
        egress_policy_free(s.hosts);
        json_decref(net);
        json_decref(j);
        return 0;
}
