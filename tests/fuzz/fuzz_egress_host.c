/* Host names and policies as a sandbox or a client may write them, and the
 * operator's public ranges (--egress-public-cidr). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "egress/addr.h"
#include "egress/cidr.h"
#include "egress/policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
        if (size > 4096)
                return 0;
        char *s = malloc(size + 1);
        if (!s)
                return 0;
        memcpy(s, data, size);
        s[size] = '\0';

        struct sockaddr_storage ss;
        if (egress_parse_ip_literal(s, &ss) == 1) {
                char buf[64];
                egress_addr_classify((struct sockaddr *)&ss);
                egress_addr_format((struct sockaddr *)&ss, buf, sizeof(buf));
        }
        EgressCidr cidr;
        if (egress_cidr_parse(s, &cidr) == 0) {
                char buf[80], err[256];
                EgressCidr again;
                /* What parses formats to text that parses to the same range. */
                if (egress_cidr_format(&cidr, buf, sizeof(buf)) != 0 || egress_cidr_parse(buf, &again) != 0 ||
                    memcmp(&cidr, &again, sizeof(cidr)) != 0)
                        __builtin_trap();
                if (egress_cidr_check_public(&cidr, NULL, 0, err, sizeof(err)) == 0 &&
                    egress_parse_ip_literal("169.254.169.254", &ss) == 1 &&
                    egress_cidr_admit(&cidr, 1, (struct sockaddr *)&ss))
                        __builtin_trap();
        }
        char norm[EGRESS_MAX_HOST + 1];
        egress_host_normalize(s, norm, sizeof(norm));

        /* The same bytes as a policy document, then as a host checked against it. */
        json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
        if (j) {
                EgressPolicy *p = NULL;
                char err[256];
                if (egress_policy_parse(j, &p, err, sizeof(err)) == 0) {
                        json_decref(egress_policy_to_json(p));
                        /* The rule that decided, into a buffer too small for most. */
                        char rule[16];
                        egress_policy_check_rule(p, "files.pythonhosted.org", 443, rule, sizeof(rule));
                        egress_policy_check(p, "127.1", 80);
                        egress_policy_free(p);
                }
                json_decref(j);
        } else {
                EgressPolicy *p = NULL;
                json_t *open = json_pack("{s:b, s:[s, s], s:[s]}", "internet", 1, "allow", "*.example.org",
                                         "10.0.0.1", "deny", "x.example.org");
                if (open && egress_policy_parse(open, &p, NULL, 0) == 0) {
                        char rule[EGRESS_MAX_RULE];
                        egress_policy_check_rule(p, s, 443, rule, sizeof(rule));
                        egress_policy_free(p);
                }
                json_decref(open);
        }
        free(s);
        return 0;
}
