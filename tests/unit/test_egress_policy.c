/* Egress policy matching and the SSRF address rules. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <string.h>

#include "egress/addr.h"
#include "egress/policy.h"

static EgressPolicy *policy(const char *json_text) {
        json_error_t jerr;
        json_t *j = json_loads(json_text, 0, &jerr);
        assert_non_null(j);
        EgressPolicy *p = NULL;
        char err[256] = "";
        int r = egress_policy_parse(j, &p, err, sizeof(err));
        json_decref(j);
        if (r < 0)
                fail_msg("parse %s: %s", json_text, err);
        return p;
}

static int parse_error(const char *json_text, char *err, size_t len) {
        json_t *j = json_loads(json_text, 0, NULL);
        assert_non_null(j);
        EgressPolicy *p = NULL;
        int r = egress_policy_parse(j, &p, err, len);
        json_decref(j);
        egress_policy_free(p);
        return r;
}

static void test_no_internet(void **state) {
        EgressPolicy *p = policy("{\"internet\": false, \"allow\": [\"pypi.org\"]}");
        assert_int_equal(egress_policy_check(p, "pypi.org", 443), EGRESS_DENY_NO_INTERNET);
        egress_policy_free(p);
        assert_int_equal(egress_policy_parse(NULL, &p, NULL, 0), 0);
        assert_int_equal(egress_policy_check(p, "pypi.org", 443), EGRESS_DENY_NO_INTERNET);
        egress_policy_free(p);
}

static void test_open_internet(void **state) {
        EgressPolicy *p = policy("{\"internet\": true}");
        assert_int_equal(egress_policy_check(p, "example.org", 443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "example.org", 80), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "example.org", 22), EGRESS_DENY_PORT);
        /* IP literals need to be named, even on an open policy. */
        assert_int_equal(egress_policy_check(p, "93.184.216.34", 443), EGRESS_DENY_NOT_ALLOWED);
        assert_int_equal(egress_policy_check(p, "bad host", 443), EGRESS_DENY_BAD_HOST);
        assert_int_equal(egress_policy_check(p, "", 443), EGRESS_DENY_BAD_HOST);
        egress_policy_free(p);
}

static void test_allow_list(void **state) {
        EgressPolicy *p = policy("{\"internet\": true, \"allow\": [\"PyPI.org.\", \"*.pythonhosted.org\", "
                                 "\"api.example.com:8443\", \"203.0.113.7\"]}");
        assert_int_equal(egress_policy_check(p, "pypi.org", 443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "PYPI.ORG.", 80), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "evilpypi.org", 443), EGRESS_DENY_NOT_ALLOWED);
        assert_int_equal(egress_policy_check(p, "pypi.org.evil.com", 443), EGRESS_DENY_NOT_ALLOWED);
        assert_int_equal(egress_policy_check(p, "files.pythonhosted.org", 443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "a.b.pythonhosted.org", 443), EGRESS_ALLOW);
        /* A wildcard matches sub-domains, not the bare domain. */
        assert_int_equal(egress_policy_check(p, "pythonhosted.org", 443), EGRESS_DENY_NOT_ALLOWED);
        assert_int_equal(egress_policy_check(p, "xpythonhosted.org", 443), EGRESS_DENY_NOT_ALLOWED);
        assert_int_equal(egress_policy_check(p, "api.example.com", 8443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "api.example.com", 443), EGRESS_DENY_PORT);
        assert_int_equal(egress_policy_check(p, "203.0.113.7", 443), EGRESS_ALLOW);
        /* The same address spelled another way is the same address. */
        assert_int_equal(egress_policy_check(p, "3405803783", 443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "203.0.113.8", 443), EGRESS_DENY_NOT_ALLOWED);
        egress_policy_free(p);
}

static void test_deny_wins(void **state) {
        EgressPolicy *p = policy("{\"internet\": true, \"allow\": [\"*.example.org\"], "
                                 "\"deny\": [\"secret.example.org\", \"*.internal.example.org\"]}");
        assert_int_equal(egress_policy_check(p, "www.example.org", 443), EGRESS_ALLOW);
        assert_int_equal(egress_policy_check(p, "secret.example.org", 443), EGRESS_DENY_DENIED);
        assert_int_equal(egress_policy_check(p, "SECRET.example.org.", 80), EGRESS_DENY_DENIED);
        assert_int_equal(egress_policy_check(p, "a.internal.example.org", 443), EGRESS_DENY_DENIED);
        egress_policy_free(p);
        p = policy("{\"internet\": true, \"deny\": [\"example.org:80\"]}");
        assert_int_equal(egress_policy_check(p, "example.org", 80), EGRESS_DENY_DENIED);
        assert_int_equal(egress_policy_check(p, "example.org", 443), EGRESS_ALLOW);
        egress_policy_free(p);
}

static void test_bad_policies(void **state) {
        char err[256];
        assert_int_equal(parse_error("{\"internet\": 1}", err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "network.internet"));
        assert_int_equal(parse_error("{\"internt\": true}", err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "internt"));
        assert_int_equal(parse_error("{\"allow\": \"pypi.org\"}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"pypi.org:0\"]}", err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "allow[0]"));
        assert_int_equal(parse_error("{\"allow\": [\"pypi.org:70000\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"*\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"a..b\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"-a.com\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"a b.com\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"allow\": [\"*.1.2.3.4\"]}", err, sizeof(err)), -EINVAL);
        assert_int_equal(parse_error("{\"deny\": [7]}", err, sizeof(err)), -EINVAL);
        assert_non_null(strstr(err, "deny[0]"));
}

static EgressAddrClass cls(const char *host) {
        struct sockaddr_storage ss;
        int r = egress_parse_ip_literal(host, &ss);
        if (r != 1)
                fail_msg("%s: not parsed as an IP literal (%d)", host, r);
        return egress_addr_classify((struct sockaddr *)&ss);
}

static void test_ip_spellings(void **state) {
        /* Every spelling of loopback an HTTP client accepts. */
        const char *loopbacks[] = { "127.0.0.1", "127.1", "2130706433", "0x7f000001", "0x7f.1",
                                    "0177.0.0.1", "017700000001", "127.0.0.1.", "[::1]", "::1",
                                    "::ffff:127.0.0.1", "[::ffff:7f00:1]", "::127.0.0.1",
                                    "64:ff9b::127.0.0.1" };
        for (size_t i = 0; i < sizeof(loopbacks) / sizeof(loopbacks[0]); i++)
                if (cls(loopbacks[i]) != EGRESS_ADDR_LOOPBACK)
                        fail_msg("%s is not loopback", loopbacks[i]);
        assert_int_equal(cls("169.254.169.254"), EGRESS_ADDR_LINK_LOCAL);
        assert_int_equal(cls("0xa9fea9fe"), EGRESS_ADDR_LINK_LOCAL);
        assert_int_equal(cls("2852039166"), EGRESS_ADDR_LINK_LOCAL);
        assert_int_equal(cls("::ffff:169.254.169.254"), EGRESS_ADDR_LINK_LOCAL);
        assert_int_equal(cls("fe80::1"), EGRESS_ADDR_LINK_LOCAL);
        assert_int_equal(cls("10.0.0.1"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("012.0.0.1"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("172.16.0.1"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("172.31.255.255"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("172.32.0.1"), EGRESS_ADDR_PUBLIC);
        assert_int_equal(cls("192.168.1.1"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("fd00::1"), EGRESS_ADDR_PRIVATE);
        assert_int_equal(cls("100.64.0.1"), EGRESS_ADDR_CGNAT);
        assert_int_equal(cls("100.128.0.1"), EGRESS_ADDR_PUBLIC);
        assert_int_equal(cls("224.0.0.1"), EGRESS_ADDR_MULTICAST);
        assert_int_equal(cls("ff02::1"), EGRESS_ADDR_MULTICAST);
        assert_int_equal(cls("0.0.0.0"), EGRESS_ADDR_UNSPECIFIED);
        assert_int_equal(cls("0"), EGRESS_ADDR_UNSPECIFIED);
        assert_int_equal(cls("::"), EGRESS_ADDR_UNSPECIFIED);
        assert_int_equal(cls("255.255.255.255"), EGRESS_ADDR_RESERVED);
        assert_int_equal(cls("240.0.0.1"), EGRESS_ADDR_RESERVED);
        assert_int_equal(cls("192.0.2.1"), EGRESS_ADDR_RESERVED);
        assert_int_equal(cls("2001:db8::1"), EGRESS_ADDR_RESERVED);
        assert_int_equal(cls("2002:7f00:1::"), EGRESS_ADDR_LOOPBACK);
        assert_int_equal(cls("2001::1"), EGRESS_ADDR_RESERVED); /* Teredo */
        assert_int_equal(cls("8.8.8.8"), EGRESS_ADDR_PUBLIC);
        assert_int_equal(cls("2606:4700::1111"), EGRESS_ADDR_PUBLIC);
}

static void test_literal_detection(void **state) {
        struct sockaddr_storage ss;
        assert_int_equal(egress_parse_ip_literal("example.org", &ss), 0);
        assert_int_equal(egress_parse_ip_literal("1e100.net", &ss), 0);
        assert_int_equal(egress_parse_ip_literal("123.abc", &ss), 0);
        /* Ends in a number but is no address: refused, never resolved. */
        assert_int_equal(egress_parse_ip_literal("1.2.3.4.5", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("256.1.1.1", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("08.1.1.1", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("foo.123", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("fe80::1%eth0", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("[::1", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("127.0.0.1 ", &ss), -EINVAL);
        assert_int_equal(egress_parse_ip_literal("", &ss), -EINVAL);
}

int main(void) {
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(test_no_internet),   cmocka_unit_test(test_open_internet),
                cmocka_unit_test(test_allow_list),    cmocka_unit_test(test_deny_wins),
                cmocka_unit_test(test_bad_policies),  cmocka_unit_test(test_ip_spellings),
                cmocka_unit_test(test_literal_detection),
        };
        return cmocka_run_group_tests_name("egress_policy", tests, NULL, NULL);
}
